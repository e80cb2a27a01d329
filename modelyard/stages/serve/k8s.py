"""serve/k8s: the serve plan as Kubernetes manifests, one vLLM pod per replica.

Written by ``modelyard serve-plan --k8s`` into ``serve/k8s/`` beside ``vllm.yaml``:

- ``pvc.yaml``: a PersistentVolumeClaim for the model folder (``model/``), sized from its bytes;
- ``deployment.yaml``: the ``vllm/vllm-openai`` image running ``vllm serve /mnt/models`` with exactly the
  keys of ``vllm.yaml`` as flags (vLLM's own rule for a config file, :func:`vllm_args`), the claim mounted
  read-only at ``/mnt/models``, the GPUs requested as the ``nvidia.com/gpu`` extended resource (NVIDIA
  device plugin), ``/dev/shm`` as a memory-backed ``emptyDir`` (compose uses ``ipc: host`` for the same
  reason: the tensor-parallel workers and NCCL share memory there), and startup, readiness and liveness
  probes on vLLM's ``/health``;
- ``service.yaml``: a ClusterIP Service in front of it;
- ``inferenceservice.yaml`` (only when the storage location is known): a KServe ``InferenceService``
  with the same container, whose ``STORAGE_URI`` (KServe's key for a custom predictor container named
  ``kserve-container``) points at where the artifact was published. KServe then fills ``/mnt/models``
  itself: its storage initializer downloads an ``s3://`` prefix, and an ``oci://`` reference is run as a
  ModelCar sidecar whose ``/models`` folder is linked there (``modelyard publish --flavour modelcar``);
- ``README.md``: how an operator applies them.

The storage location is given to ``serve-plan`` (``--storage-uri``) rather than written at publish time:
the published artifact holds ``serve/`` itself, so it cannot name its own registry digest.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from modelyard.errors import InvalidTargetError, PublishError
from modelyard.stages.serve.files import PORT, VLLM_IMAGE
from modelyard.stages.serve.plan import ServePlan
from modelyard.transport.oci import parse_oci_ref
from modelyard.transport.s3 import parse_s3_uri
from modelyard.version import __version__

#: where the model folder is mounted in the pod: KServe's own mount point for ``storageUri``
#: (``DefaultModelLocalMountPath``), used for the plain Deployment too so both run the same command.
MODEL_MOUNT = "/mnt/models"
#: the port KServe expects a custom predictor container to listen on (its default container port).
KSERVE_PORT = 8080
GPU_RESOURCE = "nvidia.com/gpu"
#: /dev/shm per GPU of the pod: vLLM's Kubernetes deployment guide mounts a 2Gi memory emptyDir.
SHM_GIB_PER_GPU = 2
#: the claim holds the model folder plus this fraction for filesystem overhead.
PVC_HEADROOM = 0.2
#: startup probe budget: 90 x 10 s = 15 min to load the weights (compose's start_period is 900 s too).
STARTUP_PERIOD_S, STARTUP_FAILURES = 10, 90
MANAGED_BY = "modelyard"
_NAME_MAX = 45  # KServe appends "-predictor" (and a revision suffix) to make its own 63-character names
_FIX_VERIFY = ("Pass the digest `modelyard publish --to oci://...` printed: oci://HOST/REPO@sha256:DIGEST.")
#: the verify-on-load init container's default image: the repository's Dockerfile, tagged with this version
VERIFIER_IMAGE = f"modelyard:{__version__}"
_FIX_URI = ("Use the location `modelyard publish` printed: s3://BUCKET/PREFIX (the model is read from PREFIX/model), "
            "or oci://HOST/REPO:TAG or @sha256:DIGEST of an image pushed with --flavour modelcar.")


@dataclass(frozen=True)
class K8sFiles:
    """The files written under ``serve/k8s/``; ``inferenceservice`` is None without a storage URI."""

    dir: Path
    pvc: Path | None  # None with verify-on-load: the pod pulls the artifact itself
    deployment: Path
    service: Path
    readme: Path
    inferenceservice: Path | None
    storage_uri: str | None


def k8s_name(name: str) -> str:
    """``name`` as a Kubernetes object name (RFC 1123 label: lowercase alphanumerics and ``-``, starting
    and ending alphanumeric), at most 45 characters so KServe's derived names stay within 63.
    Raises :class:`InvalidTargetError` when nothing usable is left."""
    s = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")
    s = re.sub(r"-{2,}", "-", s)[:_NAME_MAX].rstrip("-")
    if not s or not s[0].isalpha():
        s = ("m-" + s)[:_NAME_MAX].rstrip("-") if s else ""
    if not s:
        raise InvalidTargetError(f"--served-model-name {name!r} gives no Kubernetes name",
                                 fix="Pass --served-model-name with letters or digits, e.g. --served-model-name llama-3-8b.")
    return s


def storage_uri(uri: str) -> str:
    """The KServe ``storageUri`` for a publish location: ``s3://BUCKET/PREFIX`` (an artifact published with
    ``modelyard publish --to``) becomes ``s3://BUCKET/PREFIX/model``, its model folder; an ``oci://`` reference
    (a ModelCar image) is kept as written. Raises :class:`InvalidTargetError` for anything else, or a
    malformed reference."""
    try:
        if uri.startswith("s3://"):
            bucket, prefix = parse_s3_uri(uri)
            return f"s3://{bucket}/{prefix}/model"
        if uri.startswith("oci://"):
            ref = parse_oci_ref(uri)
            if ref.reference is None:
                raise InvalidTargetError(f"--storage-uri {uri!r} names no tag or digest",
                                         fix="Add :TAG or @sha256:DIGEST (the digest `publish --flavour modelcar` printed "
                                             "pins the exact image).")
            return str(ref)
    except PublishError as exc:
        raise InvalidTargetError(f"--storage-uri: {exc.message}", fix=_FIX_URI) from exc
    raise InvalidTargetError(f"--storage-uri {uri!r} is not an s3:// or oci:// location", fix=_FIX_URI)


def vllm_args(config: Mapping[str, Any]) -> list[str]:
    """``vllm serve`` flags for the ``vllm.yaml`` mapping ``config``, by vLLM's rule for ``--config`` files
    (``FlexibleArgumentParser.load_config_file``): ``key: value`` is ``--key value``, ``key: true`` is
    ``--key``, ``key: false`` is ``--no-key`` (vLLM passes that when the flag has the form; a flag without it
    is then refused at start-up rather than silently left at its default), a list is ``--key v1 v2 ...``
    (an empty one nothing), a mapping is ``--key`` and its JSON. The ``model`` key is left out (the model is
    the positional argument)."""
    args: list[str] = []
    for key, value in config.items():
        if key == "model":
            continue
        if isinstance(value, bool):
            args.append(f"--{key}" if value else f"--no-{key}")
        elif isinstance(value, list):
            if value:
                args += [f"--{key}", *(str(v) for v in value)]
        elif isinstance(value, dict):
            args += [f"--{key}", json.dumps(value)]
        else:
            args += [f"--{key}", str(value)]
    return args


def pod_gpus(config: Mapping[str, Any]) -> int:
    """GPUs one pod needs: tensor-parallel x pipeline-parallel size of ``config`` (vLLM defaults 1).
    Raises :class:`InvalidTargetError` for a Ray (multi-node) plan, which one pod cannot hold."""
    if config.get("distributed-executor-backend") == "ray":
        raise InvalidTargetError("the plan spans several nodes (distributed-executor-backend: ray); serve/k8s "
                                 "describes one pod", fix="Plan for one node (--gpus up to the GPUs of one node) "
                                                          "for --k8s, or run the Ray scripts of serve/.")
    return int(config.get("tensor-parallel-size", 1)) * int(config.get("pipeline-parallel-size", 1))


def _labels(name: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": name, "app.kubernetes.io/component": "vllm",
            "app.kubernetes.io/managed-by": MANAGED_BY}


def _probe(port: int | str, path: str, period: int, failures: int, timeout: int = 5) -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": port}, "periodSeconds": period, "timeoutSeconds": timeout,
            "failureThreshold": failures}


def _container(name: str, config: Mapping[str, Any], gpus: int, port: int, *, image: str,
               env: list[dict[str, str]], mounts: list[dict[str, Any]]) -> dict[str, Any]:
    gpu_q = str(gpus)
    return {
        "name": name,
        "image": image,
        "command": ["vllm", "serve"],
        "args": [MODEL_MOUNT, *vllm_args(config), "--host", "0.0.0.0", "--port", str(port)],
        "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"}],
        "env": env + [{"name": "HF_HUB_OFFLINE", "value": "1"}, {"name": "VLLM_NO_USAGE_STATS", "value": "1"}],
        "resources": {"requests": {GPU_RESOURCE: gpu_q}, "limits": {GPU_RESOURCE: gpu_q}},
        "volumeMounts": mounts + [{"name": "dshm", "mountPath": "/dev/shm"}],
        # /health answers once the engine is up; the startup probe gives the weights time to load
        "startupProbe": _probe(port, "/health", STARTUP_PERIOD_S, STARTUP_FAILURES),
        "readinessProbe": _probe(port, "/health", 10, 3),
        "livenessProbe": _probe(port, "/health", 30, 3, timeout=10),
    }


def _shm(gpus: int) -> dict[str, Any]:
    return {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{SHM_GIB_PER_GPU * max(1, gpus)}Gi"}}


def pvc_gib(model_bytes: int) -> int:
    """Claim size in GiB: the model folder's bytes plus :data:`PVC_HEADROOM`, rounded up, at least 1."""
    return max(1, math.ceil(model_bytes * (1 + PVC_HEADROOM) / 2**30))


#: where the init container of verify-on-load pulls the artifact (an emptyDir); vLLM serves its model/
VERIFIED_MOUNT = "/mnt/verified"
#: where the public key Secret is mounted in the init container (key ``model.pub``)
KEY_MOUNT = "/etc/modelyard/keys"
KEY_FILE = "model.pub"


@dataclass(frozen=True)
class VerifyOnLoad:
    """Verify-on-load: ``ref`` is ``oci://HOST/REPO@sha256:DIGEST``; ``key_secret`` the Secret with the public
    key (None: signature not required); ``image`` the init container's image (modelyard installed);
    ``registry_secret`` a ``kubernetes.io/basic-auth`` Secret (keys ``username``, ``password``) whose values
    reach ``modelyard pull`` as ``MODELYARD_REGISTRY_USER``/``MODELYARD_REGISTRY_PASSWORD`` (None: an anonymous
    pull). The credentials stay in the Secret: the manifests name only the Secret and its keys."""

    ref: str
    key_secret: str | None
    image: str
    registry_secret: str | None = None


def verify_on_load(ref: str, *, name: str, require_signature: bool = True, key_secret: str | None = None,
                   image: str | None = None, registry_secret: str | None = None) -> VerifyOnLoad:
    """The validated :class:`VerifyOnLoad` for the served model ``name``. Raises :class:`InvalidTargetError`
    for a reference that is not ``oci://...@sha256:...``: a tag can be moved, a digest cannot."""
    try:
        parsed = parse_oci_ref(ref)
    except PublishError as exc:
        raise InvalidTargetError(f"--verify-from: {exc.message}", fix=_FIX_VERIFY) from exc
    if not parsed.digest:
        raise InvalidTargetError(f"--verify-from {ref!r} names a tag; a pod must pull by digest", fix=_FIX_VERIFY)
    secret = (key_secret or f"{k8s_name(name)}-signing-key") if require_signature else None
    return VerifyOnLoad(str(parsed), secret, image or VERIFIER_IMAGE, registry_secret)


#: the environment the init container reads registry credentials from, by key of a basic-auth Secret
REGISTRY_ENV = (("MODELYARD_REGISTRY_USER", "username"), ("MODELYARD_REGISTRY_PASSWORD", "password"))


def verify_env(v: VerifyOnLoad) -> list[dict[str, Any]]:
    """The init container's environment: ``MODELYARD_HOME`` in the pod's volume and, with a registry Secret,
    the credentials :mod:`modelyard.transport.oci` reads, each a ``secretKeyRef`` (never a literal value)."""
    env: list[dict[str, Any]] = [{"name": "MODELYARD_HOME", "value": f"{VERIFIED_MOUNT}/.modelyard"}]
    if v.registry_secret:
        env += [{"name": var, "valueFrom": {"secretKeyRef": {"name": v.registry_secret, "key": key}}}
                for var, key in REGISTRY_ENV]
    return env


def verify_command(v: VerifyOnLoad) -> list[str]:
    """The init container's command: ``modelyard pull REF --output VERIFIED_MOUNT/artifact [--key ...] --json``,
    the same code as a user's pull (every blob's sha256 against the manifest, all or nothing; with a key the
    signature is required and checked). A non-zero exit stops the pod before vLLM starts."""
    return ["modelyard", "pull", v.ref, "--output", f"{VERIFIED_MOUNT}/artifact",
            *(["--key", f"{KEY_MOUNT}/{KEY_FILE}"] if v.key_secret else []), "--json"]


def manifests(plan: ServePlan, config: Mapping[str, Any], *, model_bytes: int, storage: str | None = None,
              image: str = VLLM_IMAGE, namespace: str | None = None,
              verify: VerifyOnLoad | None = None, canary_percent: int | None = None) -> dict[str, dict[str, Any]]:
    """The Kubernetes objects by file name (``pvc.yaml``, ``deployment.yaml``, ``service.yaml`` and, with
    ``storage`` (a location :func:`storage_uri` accepts), ``inferenceservice.yaml``).

    ``canary_percent`` (1..99, with ``storage``): the InferenceService's ``canaryTrafficPercent``, the
    share of traffic KServe sends to its newest revision (applied over the one running, the rest stays
    on the last ready revision). KServe implements it in its Serverless mode only (Knative revisions;
    KServe's "Canary Rollout Strategy" documentation), so the InferenceService then asks for that mode.

    ``config`` is the ``vllm.yaml`` mapping (its keys become the container's flags); ``model_bytes`` the
    size of the model folder (bytes) the claim must hold, at least the plan's weight bytes (a plan from a
    config alone estimates them). Raises :class:`InvalidTargetError` for a multi-node plan or a bad
    ``storage``."""
    name = k8s_name(plan.served_model_name)
    gpus = pod_gpus(config)
    labels = _labels(name)
    meta = {"name": name, "labels": labels} | ({"namespace": namespace} if namespace else {})
    claim = f"{name}-model"
    pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
           "metadata": {**meta, "name": claim},
           "spec": {"accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": f"{pvc_gib(max(model_bytes, plan.weight_bytes))}Gi"}}}}
    container = _container("vllm", config, gpus, PORT, image=image, env=[],
                           mounts=[{"name": "model", "mountPath": MODEL_MOUNT, "readOnly": True}])
    volumes: list[dict[str, Any]] = [{"name": "model", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}]
    init: list[dict[str, Any]] = []
    if verify is not None:  # serve only what the init container pulled by digest and checked
        container["args"][0] = f"{VERIFIED_MOUNT}/artifact/model"
        container["volumeMounts"][0] = {"name": "verified", "mountPath": VERIFIED_MOUNT, "readOnly": True}
        init = [{"name": "verify", "image": verify.image, "command": verify_command(verify),
                 "env": verify_env(verify),
                 "volumeMounts": [{"name": "verified", "mountPath": VERIFIED_MOUNT}]
                 + ([{"name": "signing-key", "mountPath": KEY_MOUNT, "readOnly": True}] if verify.key_secret else [])}]
        volumes = [{"name": "verified", "emptyDir": {"sizeLimit": f"{pvc_gib(max(model_bytes, plan.weight_bytes))}Gi"}}]
        if verify.key_secret:
            volumes.append({"name": "signing-key", "secret": {"secretName": verify.key_secret,
                                                                "items": [{"key": KEY_FILE, "path": KEY_FILE}]}})
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
        "spec": {
            "replicas": 1,
            # a ReadWriteOnce claim and whole GPUs: the old pod must let go before the new one starts
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": {"app.kubernetes.io/name": name}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {**({"initContainers": init} if init else {}), "containers": [container],
                         "volumes": [*volumes, _shm(gpus)]},
            },
        },
    }
    service = {"apiVersion": "v1", "kind": "Service", "metadata": meta,
               "spec": {"type": "ClusterIP", "selector": {"app.kubernetes.io/name": name},
                        "ports": [{"name": "http", "port": PORT, "targetPort": "http", "protocol": "TCP"}]}}
    out = {"deployment.yaml": deployment, "service.yaml": service} if verify else \
        {"pvc.yaml": pvc, "deployment.yaml": deployment, "service.yaml": service}
    if storage is not None:
        uri = storage_uri(storage)
        kc = _container("kserve-container", config, gpus, KSERVE_PORT, image=image,
                        env=[{"name": "STORAGE_URI", "value": uri}], mounts=[])
        predictor: dict[str, Any] = {"minReplicas": 1, "maxReplicas": 1, "containers": [kc], "volumes": [_shm(gpus)]}
        if canary_percent is not None:
            if not 1 <= canary_percent <= 99:
                raise InvalidTargetError(f"--canary-percent {canary_percent} is not in 1..99",
                                         fix="Pass the share of traffic (percent) the new revision gets, e.g. 10.")
            predictor = {"canaryTrafficPercent": canary_percent, **predictor}
        out["inferenceservice.yaml"] = {
            "apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService",
            "metadata": {**meta, "annotations": {
                # a plain Deployment + Service (no Knative): long model loads are held by the startup probe;
                # a canary needs Knative's revisions (Serverless)
                "serving.kserve.io/deploymentMode": "Serverless" if canary_percent else "RawDeployment"}},
            "spec": {"predictor": predictor},
        }
    elif canary_percent is not None:
        raise InvalidTargetError("--canary-percent splits the traffic of a KServe InferenceService, which needs "
                                 "--storage-uri", fix="Add --storage-uri (where the artifact was published).")
    return out


def _verify_section(name: str, verify: VerifyOnLoad) -> str:
    key = (f"kubectl create secret generic {verify.key_secret} --from-file={KEY_FILE}=public.pem   # the signer's public key\n"
           if verify.key_secret else "")
    if verify.registry_secret:
        key += (f"kubectl create secret generic {verify.registry_secret} --type=kubernetes.io/basic-auth "
                "--from-literal=username=USER --from-literal=password=PASSWORD   # the registry's pull credentials\n")
    signed = ("requires the artifact's signature (a `model.sig` layer or a signature referrer of the manifest) and "
              f"checks it with the public key in the Secret `{verify.key_secret}`" if verify.key_secret
              else "does not require a signature (`--allow-unsigned`)")
    return f"""## Verify on load (Deployment + Service)

Before vLLM starts, the init container `verify` ({verify.image}) runs

    {" ".join(verify_command(verify))}

It pulls the artifact **by digest** into the pod's own volume, checks every file's sha256 against the
manifest (all or nothing) and {signed}. On any mismatch it exits non-zero, and the pod never starts vLLM.
vLLM serves `{VERIFIED_MOUNT}/artifact/model`, which holds only what was checked.

```bash
{key}kubectl apply -f deployment.yaml -f service.yaml
kubectl rollout status deployment/{name} --timeout=20m
kubectl logs deployment/{name} -c verify     # the pull's JSON result
```
"""


def render_readme(plan: ServePlan, files: Mapping[str, Mapping[str, Any]], storage: str | None,
                  verify: VerifyOnLoad | None = None) -> str:
    name = files["deployment.yaml"]["metadata"]["name"]
    gpus = files["deployment.yaml"]["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"][GPU_RESOURCE]
    if verify is not None:
        return (f"# Kubernetes manifests for {plan.served_model_name}\n\nGenerated by `modelyard serve-plan --k8s "
                f"--verify-from` from the same plan as `../vllm.yaml`: the container runs `vllm serve` with every key "
                f"of `vllm.yaml` as a flag, {gpus} x `{GPU_RESOURCE}`, `/dev/shm` in memory, and probes on "
                f"`/health`.\n\n" + _verify_section(name, verify))
    size = files["pvc.yaml"]["spec"]["resources"]["requests"]["storage"]
    loader = json.dumps({"spec": {
        "containers": [{"name": f"{name}-loader", "image": "busybox:1.36", "command": ["sleep", "3600"],
                        "volumeMounts": [{"name": "model", "mountPath": MODEL_MOUNT}]}],
        "volumes": [{"name": "model", "persistentVolumeClaim": {"claimName": f"{name}-model"}}]}},
        separators=(",", ":"))
    if storage is None:
        kserve = ("`inferenceservice.yaml` is written when the artifact's published location is known:\n"
                  "`modelyard serve-plan ARTIFACT --gpu ... --storage-uri s3://BUCKET/PREFIX` (or the\n"
                  "`oci://...@sha256:...` that `modelyard publish --flavour modelcar` printed).\n")
    else:
        uri = files["inferenceservice.yaml"]["spec"]["predictor"]["containers"][0]["env"][0]["value"]
        kserve = (f"`inferenceservice.yaml` runs the same container under KServe, reading the model from\n`{uri}`"
                  + (" (a ModelCar image: enable `enableModelcar` in KServe's `inferenceservice-config`)" if uri.startswith("oci://")
                     else " (S3 credentials: a service account with KServe's S3 secret annotations)") + ":\n\n"
                  "```bash\nkubectl apply -f inferenceservice.yaml\nkubectl get inferenceservice " + name + "\n```\n")
    return f"""# Kubernetes manifests for {plan.served_model_name}

Generated by `modelyard serve-plan --k8s` from the same plan as `../vllm.yaml`: the container runs
`vllm serve {MODEL_MOUNT}` with every key of `vllm.yaml` as a flag, {gpus} x `{GPU_RESOURCE}`
(NVIDIA device plugin), `/dev/shm` in memory, and probes on `/health` (15 minutes allowed for loading).

## Plain Kubernetes (Deployment + Service + PVC)

The claim `{name}-model` ({size}) holds the model folder: the files of the artifact's `model/` at its root.

```bash
kubectl apply -f pvc.yaml
# fill it once from a pod that mounts the claim, then delete that pod
kubectl run {name}-loader --image=busybox:1.36 --restart=Never --overrides='{loader}'
kubectl wait --for=condition=Ready pod/{name}-loader
kubectl cp ../../model/. {name}-loader:{MODEL_MOUNT}/      # the artifact's model/ folder
kubectl delete pod {name}-loader
kubectl apply -f deployment.yaml -f service.yaml
kubectl rollout status deployment/{name} --timeout=20m
kubectl port-forward service/{name} {PORT}:{PORT} &
curl -s localhost:{PORT}/v1/models
```

## KServe

{kserve}"""


def write_k8s_files(artifact_dir: Path, plan: ServePlan, config: Mapping[str, Any], *, model_bytes: int,  # noqa: PLR0913
                    storage: str | None = None, image: str = VLLM_IMAGE, namespace: str | None = None,
                    verify: VerifyOnLoad | None = None, canary_percent: int | None = None) -> K8sFiles:
    """Write ``artifact_dir/serve/k8s/`` (see the module docstring) and return the paths. Files there are
    replaced one by one through a temp name; a stale ``inferenceservice.yaml`` is removed when ``storage``
    is None. Raises what :func:`manifests` raises, before anything is written."""
    docs = manifests(plan, config, model_bytes=model_bytes, storage=storage, image=image, namespace=namespace,
                     verify=verify, canary_percent=canary_percent)
    d = Path(artifact_dir) / "serve" / "k8s"
    d.mkdir(parents=True, exist_ok=True)
    texts = {fname: "# generated by `modelyard serve-plan --k8s`; see README.md beside it.\n"
             + yaml.safe_dump(doc, sort_keys=False, width=200) for fname, doc in docs.items()}
    texts["README.md"] = render_readme(plan, docs, storage, verify)
    for fname, text in texts.items():
        tmp = d / f".{fname}.tmp"
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(d / fname)
    if storage is None:
        (d / "inferenceservice.yaml").unlink(missing_ok=True)
    if verify is not None:
        (d / "pvc.yaml").unlink(missing_ok=True)
    isvc = docs.get("inferenceservice.yaml")
    return K8sFiles(dir=d, pvc=None if verify else d / "pvc.yaml", deployment=d / "deployment.yaml", service=d / "service.yaml",
                    readme=d / "README.md", inferenceservice=d / "inferenceservice.yaml" if isvc else None,
                    storage_uri=isvc["spec"]["predictor"]["containers"][0]["env"][0]["value"] if isvc else None)
