"""serve/k8s (stages/serve/k8s.py): the Deployment, Service, PVC and KServe InferenceService made from a
serve plan, checked value by value and validated strictly against the Kubernetes schemas
(kubernetes-validate) and the KServe SDK's model classes (tests/k8s_schemas.py)."""

from __future__ import annotations

import copy
import json

import kubernetes_validate
import pytest
import yaml

from modelyard.errors import InvalidTargetError
from modelyard.stages.serve import ServeTarget, plan_serve
from modelyard.stages.serve.files import write_serve_files
from modelyard.stages.serve.k8s import k8s_name, manifests, pod_gpus, pvc_gib, storage_uri, vllm_args, write_k8s_files
from tests.conftest import json_result, run_cli
from tests.k8s_schemas import check_kserve, validate_builtin
from tests.unit.test_serve_plan import llama_dir

DIGEST = "sha256:" + "ab" * 32


@pytest.fixture(scope="module")
def llama8b(tmp_path_factory):
    """Llama-3.1-8B's config (no weights) planned on 2 x H100-80GB, serve/ and serve/k8s/ written."""
    d = llama_dir(tmp_path_factory.mktemp("k8s"), "8b")
    plan = plan_serve(d, ServeTarget(gpu="H100-80GB", gpus=2), name="Llama-3.1-8B-Instruct")
    out = tmp_path_factory.mktemp("k8s-out")
    sf = write_serve_files(out, plan, model=str(d))
    config = yaml.safe_load(sf.vllm_yaml.read_text())
    files = write_k8s_files(out, plan, config, model_bytes=16_060_522_496, storage="s3://models/llama-8b/v1")
    docs = {p.name: yaml.safe_load(p.read_text()) for p in files.dir.glob("*.yaml")}
    return plan, config, files, docs


def _flags(args: list[str]) -> dict[str, str]:
    """``--key value`` pairs back into a mapping (every flag of these plans takes one value)."""
    assert len(args) % 2 == 0, args
    return {k[2:]: v for k, v in zip(args[::2], args[1::2])}


def test_vllm_args_follow_vllms_config_file_rule():
    cfg = {"model": "model", "served-model-name": "m", "tensor-parallel-size": 2, "gpu-memory-utilization": 0.9,
           "enforce-eager": True, "enable-prefix-caching": False, "allowed-origins": ["a", "b"], "empty": [],
           "compilation-config": {"level": 3}}
    assert vllm_args(cfg) == ["--served-model-name", "m", "--tensor-parallel-size", "2", "--gpu-memory-utilization", "0.9",
                              "--enforce-eager", "--no-enable-prefix-caching", "--allowed-origins", "a", "b",
                              "--compilation-config", '{"level": 3}']


def test_deployment_runs_exactly_vllm_yaml(llama8b):
    plan, config, files, docs = llama8b
    assert sorted(docs) == ["deployment.yaml", "inferenceservice.yaml", "pvc.yaml", "service.yaml"]
    dep = docs["deployment.yaml"]
    assert dep["metadata"]["name"] == "llama-3-1-8b-instruct"
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert c["image"] == "vllm/vllm-openai:v0.32.0" and c["command"] == ["vllm", "serve"]
    assert c["args"][0] == "/mnt/models" and c["args"][-4:] == ["--host", "0.0.0.0", "--port", "8000"]
    # every key of vllm.yaml (but the positional model), same value, same order
    assert _flags(c["args"][1:-4]) == {k: str(v) for k, v in config.items() if k != "model"}
    assert list(_flags(c["args"][1:-4])) == [k for k in config if k != "model"]
    assert config["tensor-parallel-size"] == 2 and config["max-model-len"] == plan.max_model_len == 131072
    assert c["resources"] == {"requests": {"nvidia.com/gpu": "2"}, "limits": {"nvidia.com/gpu": "2"}}
    assert c["volumeMounts"] == [{"name": "model", "mountPath": "/mnt/models", "readOnly": True},
                                 {"name": "dshm", "mountPath": "/dev/shm"}]
    assert dep["spec"]["template"]["spec"]["volumes"] == [
        {"name": "model", "persistentVolumeClaim": {"claimName": "llama-3-1-8b-instruct-model", "readOnly": True}},
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "4Gi"}}]
    health = {"path": "/health", "port": 8000}
    assert c["startupProbe"] == {"httpGet": health, "periodSeconds": 10, "timeoutSeconds": 5, "failureThreshold": 90}
    assert c["readinessProbe"] == {"httpGet": health, "periodSeconds": 10, "timeoutSeconds": 5, "failureThreshold": 3}
    assert c["livenessProbe"] == {"httpGet": health, "periodSeconds": 30, "timeoutSeconds": 10, "failureThreshold": 3}
    assert dep["spec"]["strategy"] == {"type": "Recreate"}
    assert docs["pvc.yaml"]["spec"]["resources"]["requests"]["storage"] == "18Gi"
    assert docs["service.yaml"]["spec"]["ports"] == [{"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}]
    assert docs["service.yaml"]["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]


def test_inferenceservice_points_at_the_published_model(llama8b):
    _, config, files, docs = llama8b
    isvc = docs["inferenceservice.yaml"]
    assert isvc["apiVersion"] == "serving.kserve.io/v1beta1" and isvc["kind"] == "InferenceService"
    assert isvc["metadata"]["annotations"] == {"serving.kserve.io/deploymentMode": "RawDeployment"}
    pred = isvc["spec"]["predictor"]
    (c,) = pred["containers"]
    assert c["name"] == "kserve-container"  # KServe reads STORAGE_URI only from this container
    assert c["env"][0] == {"name": "STORAGE_URI", "value": "s3://models/llama-8b/v1/model"}
    assert files.storage_uri == "s3://models/llama-8b/v1/model"
    dep_c = docs["deployment.yaml"]["spec"]["template"]["spec"]["containers"][0]
    assert c["args"] == dep_c["args"][:-1] + ["8080"]  # same vLLM flags; KServe's container port
    assert c["resources"] == dep_c["resources"] and c["livenessProbe"]["httpGet"] == {"path": "/health", "port": 8080}
    assert c["volumeMounts"] == [{"name": "dshm", "mountPath": "/dev/shm"}]  # KServe mounts /mnt/models itself
    assert pred["volumes"] == [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "4Gi"}}]


def test_manifests_are_valid_kubernetes_and_kserve(llama8b):
    docs = llama8b[3]
    for fname in ("deployment.yaml", "service.yaml", "pvc.yaml"):
        assert validate_builtin(docs[fname]) == "1.33", fname
    assert check_kserve(docs["inferenceservice.yaml"]) == []


def test_validators_catch_mistakes(llama8b):
    """The checks can fail: each mistake below is named."""
    docs = llama8b[3]
    bad = copy.deepcopy(docs["inferenceservice.yaml"])
    bad["spec"]["predictor"]["minReplica"] = 1  # misspelled KServe field
    bad["spec"]["predictor"]["maxReplicas"] = "1"  # wrong type
    bad["spec"]["predictor"]["containers"][0]["storageUri"] = "s3://x"  # not a container field
    bad["spec"]["predictor"]["volumes"][0]["emptyDir"]["sizeLimit"] = {"gi": 4}  # not a quantity
    problems = check_kserve(bad)
    assert ".spec.predictor.minReplica: not a field of V1beta1PredictorSpec" in problems
    assert ".spec.predictor.maxReplicas: expected int, got str '1'" in problems
    assert any(p.startswith(".spec.predictor.containers[0]: Additional properties are not allowed ('storageUri'")
               for p in problems), problems
    assert any(p.startswith(".spec.predictor.volumes[0].emptyDir.sizeLimit:") for p in problems), problems
    nopred = copy.deepcopy(docs["inferenceservice.yaml"])
    del nopred["spec"]["predictor"]
    assert check_kserve(nopred) == [".spec: Invalid value for `predictor`, must not be `None`"]
    dep = copy.deepcopy(docs["deployment.yaml"])
    dep["spec"]["template"]["spec"]["containers"][0]["resource"] = {}
    with pytest.raises(kubernetes_validate.ValidationError, match="'resource' was unexpected"):
        validate_builtin(dep)


def test_readme_loader_pod_is_valid(llama8b):
    """The README's one-off pod that fills the claim is a valid Pod mounting that claim."""
    text = llama8b[2].readme.read_text()
    overrides = json.loads(text.split("--overrides='", 1)[1].split("'", 1)[0])
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "llama-3-1-8b-instruct-loader"}, **overrides}
    assert validate_builtin(pod) == "1.33"
    assert pod["spec"]["volumes"] == [{"name": "model", "persistentVolumeClaim": {"claimName": "llama-3-1-8b-instruct-model"}}]
    assert "kubectl cp ../../model/. llama-3-1-8b-instruct-loader:/mnt/models/" in text
    assert "s3://models/llama-8b/v1/model" in text


@pytest.mark.parametrize(("given", "kserve"), [
    ("s3://models/llama-8b/v1", "s3://models/llama-8b/v1/model"),
    ("s3://models/llama-8b/v1/", "s3://models/llama-8b/v1/model"),
    ("oci://registry.example:5000/models/car:v1", "oci://registry.example:5000/models/car:v1"),
    (f"oci://registry.example/models/car@{DIGEST}", f"oci://registry.example/models/car@{DIGEST}"),
])
def test_storage_uri(given, kserve):
    assert storage_uri(given) == kserve


@pytest.mark.parametrize(("given", "match"), [
    ("oci://registry.example/models/car", "names no tag or digest"),
    ("oci://registry.example/Models/car:v1", "is not a valid repository name"),
    ("s3://models", "needs a bucket and a prefix"),
    ("https://example.com/model", "is not an s3:// or oci:// location"),
    ("pvc://claim/model", "is not an s3:// or oci:// location"),
])
def test_storage_uri_refused(given, match):
    with pytest.raises(InvalidTargetError, match=match):
        storage_uri(given)


@pytest.mark.parametrize(("name", "k8s"), [("SmolLM2-135M-Instruct", "smollm2-135m-instruct"),
                                           ("Llama_3.1/8B", "llama-3-1-8b"), ("123abc", "m-123abc"),
                                           ("a" * 60, "a" * 45), ("x--y..z-", "x-y-z")])
def test_k8s_name(name, k8s):
    assert k8s_name(name) == k8s


def test_k8s_name_refused():
    with pytest.raises(InvalidTargetError, match="gives no Kubernetes name"):
        k8s_name("___")


def test_pvc_size_and_pod_gpus():
    assert [pvc_gib(0), pvc_gib(2**30), pvc_gib(16_060_522_496), pvc_gib(5 * 2**30)] == [1, 2, 18, 6]
    assert pod_gpus({"tensor-parallel-size": 4, "pipeline-parallel-size": 2}) == 8
    assert pod_gpus({}) == 1
    with pytest.raises(InvalidTargetError, match="spans several nodes"):
        pod_gpus({"tensor-parallel-size": 8, "pipeline-parallel-size": 2, "distributed-executor-backend": "ray"})


def test_without_storage_no_inferenceservice(llama8b, tmp_path):
    plan, config = llama8b[0], llama8b[1]
    assert sorted(manifests(plan, config, model_bytes=1)) == ["deployment.yaml", "pvc.yaml", "service.yaml"]
    write_k8s_files(tmp_path, plan, config, model_bytes=1, storage=f"oci://r.example/m/car@{DIGEST}")
    assert (tmp_path / "serve" / "k8s" / "inferenceservice.yaml").is_file()
    files = write_k8s_files(tmp_path, plan, config, model_bytes=1)  # a stale one is removed
    assert files.inferenceservice is None
    assert sorted(p.name for p in files.dir.iterdir()) == ["README.md", "deployment.yaml", "pvc.yaml", "service.yaml"]


def test_cli_serve_plan_k8s(tmp_path):
    d = llama_dir(tmp_path, "8b")
    out = tmp_path / "out"
    r = run_cli("serve-plan", str(d), "--gpu", "H100-80GB", "--gpus", "2", "-o", str(out), "--json",
                "--storage-uri", f"oci://registry.example:5000/models/car@{DIGEST}")
    assert r.returncode == 0, r.stderr
    res = json_result(r.stdout, "serve-plan")
    assert res["k8s_dir"] == str(out / "serve" / "k8s")
    assert res["storage_uri"] == f"oci://registry.example:5000/models/car@{DIGEST}"
    isvc = yaml.safe_load((out / "serve" / "k8s" / "inferenceservice.yaml").read_text())
    assert isvc["metadata"]["name"] == "llama-3-1-8b"
    pvc = yaml.safe_load((out / "serve" / "k8s" / "pvc.yaml").read_text())
    assert pvc["spec"]["resources"]["requests"]["storage"] == "18Gi"  # config only: the estimated 8B bf16 weights
    assert check_kserve(isvc) == []
    # a bad location is refused before anything is written
    r = run_cli("serve-plan", str(d), "--gpu", "H100-80GB", "-o", str(tmp_path / "bad"), "--storage-uri", "ftp://x/y")
    assert r.returncode == 2 and "is not an s3:// or oci:// location" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "bad").exists()


def test_a_kserve_canary_keeps_the_stable_inferenceservice_name(tmp_path):
    """A canary is a new revision of the stable InferenceService: without the stable service's name the plan would
    be a second InferenceService named after the candidate, at 100 %. It is refused (exit 2, nothing written); with
    --served-model-name the InferenceService and the served model keep the stable name."""
    d = llama_dir(tmp_path, "8b")
    uri = f"oci://registry.example:5000/models/car@{DIGEST}"
    r = run_cli("serve-plan", str(d), "--gpu", "H100-80GB", "--gpus", "2", "-o", str(tmp_path / "bad"),
                "--storage-uri", uri, "--canary-percent", "10")
    assert r.returncode == 2 and "--canary-percent makes a new revision of the stable InferenceService" in r.stderr
    assert "--served-model-name" in r.stderr and not (tmp_path / "bad").exists()
    out = tmp_path / "out"
    r = run_cli("serve-plan", str(d), "--gpu", "H100-80GB", "--gpus", "2", "-o", str(out), "--storage-uri", uri,
                "--canary-percent", "10", "--served-model-name", "chat-prod")
    assert r.returncode == 0, r.stderr
    isvc = yaml.safe_load((out / "serve" / "k8s" / "inferenceservice.yaml").read_text())
    assert (isvc["metadata"]["name"], isvc["spec"]["predictor"]["canaryTrafficPercent"]) == ("chat-prod", 10)
    args = isvc["spec"]["predictor"]["containers"][0]["args"]
    assert args[args.index("--served-model-name") + 1] == "chat-prod"
