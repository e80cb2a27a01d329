"""Signatures and attestations travel as OCI 1.1 referrers of the artifact's manifest, against the real
Debian docker-registry (distribution 2.8, which has no referrers API: the referrers tag schema is used, as
the distribution spec says and as `oras discover` reads it); pull finds and checks a signature there."""

from __future__ import annotations

import hashlib
import json
import shutil
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from modelyard.errors import SignatureError
from modelyard.settings import Settings
from modelyard.transport import oci, referrers
from modelyard.transport.oci import publish_oci, pull_oci
from modelyard.transport.signing import sign_artifact
from tests.conftest import json_error, json_result, run_cli
from tests.unit.test_bundle import _build_artifact
from tests.unit.test_signing import _keypair

pytestmark = pytest.mark.publish  # needs Debian docker-registry: `make test` installs it


@pytest.fixture(scope="module")
def artifact(tiny_llama_dir, tmp_path_factory) -> Path:
    return _build_artifact(tiny_llama_dir, tmp_path_factory.mktemp("store"), hub=True)


def _get(host: str, path: str, accept: str) -> bytes:
    req = urllib.request.Request(f"http://{host}{path}", headers={"Accept": accept})
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.read()


def test_signature_and_verification_report_are_referrers_of_the_manifest(artifact, registry, tmp_path):
    copy = tmp_path / "art"
    shutil.copytree(artifact, copy)
    priv, _ = _keypair(tmp_path)
    sign_artifact(copy, private_key=priv)
    res = publish_oci(copy, f"oci://{registry}/models/referred:v1", settings=Settings())
    assert res.referrers == ("signature", "verification")  # this artifact was stored without a smoke run
    with pytest.raises(urllib.error.HTTPError) as e:  # distribution 2.8: no referrers API
        _get(registry, f"/v2/models/referred/referrers/{res.digest}", referrers.INDEX_MEDIA_TYPE)
    assert e.value.code == 404
    index = json.loads(_get(registry, f"/v2/models/referred/manifests/sha256-{res.digest[7:]}",
                            referrers.INDEX_MEDIA_TYPE))
    assert index["mediaType"] == referrers.INDEX_MEDIA_TYPE
    kinds = {m["annotations"][referrers.KIND]: m for m in index["manifests"]}
    assert sorted(kinds) == ["signature", "verification"]
    assert kinds["signature"]["artifactType"] == "application/vnd.dev.sigstore.bundle.v0.3+json"
    assert kinds["verification"]["artifactType"] == "application/vnd.in-toto+json"
    subject_size = len(_get(registry, f"/v2/models/referred/manifests/{res.digest}", oci.MANIFEST_MEDIA_TYPE))
    for kind, desc in kinds.items():
        body = _get(registry, f"/v2/models/referred/manifests/{desc['digest']}", oci.MANIFEST_MEDIA_TYPE)
        assert "sha256:" + hashlib.sha256(body).hexdigest() == desc["digest"]
        m = json.loads(body)
        assert m["subject"] == {"mediaType": oci.MANIFEST_MEDIA_TYPE, "digest": res.digest, "size": subject_size}
        assert m["config"] == referrers.EMPTY_DESCRIPTOR and len(m["layers"]) == 1
        blob = _get(registry, f"/v2/models/referred/blobs/{m['layers'][0]['digest']}", "*/*")
        if kind == "signature":
            assert blob == (copy / "model.sig").read_bytes()
        else:
            st = json.loads(blob)
            assert (st["_type"], st["predicateType"]) == ("https://in-toto.io/Statement/v1",
                                                         "https://modelyard.dev/attestations/verification/v1")
            assert st["subject"] == [{"name": "tiny", "digest": {"sha256": res.digest[7:]}}]
            assert st["predicate"] == json.loads((copy / "report.json").read_text())
    # publishing again lists each referrer once
    publish_oci(copy, f"oci://{registry}/models/referred:v1", settings=Settings())
    again = json.loads(_get(registry, f"/v2/models/referred/manifests/sha256-{res.digest[7:]}", referrers.INDEX_MEDIA_TYPE))
    assert sorted(m["digest"] for m in again["manifests"]) == sorted(m["digest"] for m in index["manifests"])


def test_pull_checks_a_signature_that_exists_only_as_a_referrer(artifact, registry, tmp_path):
    res = publish_oci(artifact, f"oci://{registry}/models/late-signed:v1", settings=Settings())  # pushed unsigned
    ref = f"oci://{registry}/models/late-signed@{res.digest}"
    priv, pub = _keypair(tmp_path)
    with pytest.raises(SignatureError):  # unsigned: a pull that asks for a signature refuses it
        pull_oci(ref, tmp_path / "unsigned", public_key=pub, settings=Settings())
    assert not (tmp_path / "unsigned").exists()
    signed = tmp_path / "signed"
    shutil.copytree(artifact, signed)
    sign_artifact(signed, private_key=priv)  # signed later, attached to the same manifest as a referrer
    client = oci._client(oci.parse_oci_ref(ref), None, oci.Settings())
    container = client.get_container(f"models/late-signed@{res.digest}")
    referrers.push_referrer(client, container, referrers.subject_of(client, container, res.digest),
                            artifact_type=referrers.SIGSTORE_BUNDLE, blob=(signed / "model.sig").read_bytes(),
                            title="model.sig", kind="signature")
    got = pull_oci(ref, tmp_path / "ok", public_key=pub, settings=Settings())
    assert (got.signature_verified, got.signature_from) == (True, "referrer")
    assert (got.path / "model.sig").read_bytes() == (signed / "model.sig").read_bytes()
    _, other = _keypair(tmp_path, "other")
    with pytest.raises(SignatureError):
        pull_oci(ref, tmp_path / "bad", public_key=other, settings=Settings())
    assert not (tmp_path / "bad").exists()
    assert [r.kind for r in referrers.discover(client, container, res.digest)] == ["verification", "signature"]


def _init_command(deployment: dict, into: Path, key: Path | None) -> list[str]:
    """The init container's command as this machine runs it: the same `modelyard pull`, with the pod's
    mount points mapped onto local paths."""
    (init,) = deployment["spec"]["template"]["spec"]["initContainers"]
    assert init["name"] == "verify" and init["command"][:2] == ["modelyard", "pull"]
    local = {"/mnt/verified/artifact": str(into), "/etc/modelyard/keys/model.pub": str(key)}
    return [local.get(a, a) for a in init["command"][1:]]


def test_verify_on_load_init_container_refuses_a_tampered_or_unsigned_artifact(artifact, registry, tmp_path):
    import yaml

    from tests.conftest import run_cli
    from tests.k8s_schemas import validate_builtin

    signed = tmp_path / "signed"
    shutil.copytree(artifact, signed)
    priv, pub = _keypair(tmp_path)
    sign_artifact(signed, private_key=priv)
    good = publish_oci(signed, f"oci://{registry}/models/onload:v1", settings=Settings())
    ref = f"oci://{registry}/models/onload@{good.digest}"
    out = tmp_path / "plan"
    r = run_cli("serve-plan", str(signed), "--gpu", "L4-24GB", "-o", str(out), "--verify-from", ref)
    assert r.returncode == 0, r.stderr
    k8s = out / "serve" / "k8s"
    assert sorted(p.name for p in k8s.iterdir()) == ["README.md", "deployment.yaml", "service.yaml"]
    deployment = yaml.safe_load((k8s / "deployment.yaml").read_text())
    validate_builtin(deployment)
    pod = deployment["spec"]["template"]["spec"]
    assert pod["initContainers"][0]["command"] == [
        "modelyard", "pull", ref, "--output", "/mnt/verified/artifact", "--key", "/etc/modelyard/keys/model.pub", "--json"]
    assert pod["containers"][0]["args"][0] == "/mnt/verified/artifact/model"
    assert {"name": "signing-key", "secret": {"secretName": "tiny-signing-key",
                                             "items": [{"key": "model.pub", "path": "model.pub"}]}} in pod["volumes"]
    # the intact artifact: the command exits 0 and the folder holds what was signed
    ok = run_cli(*_init_command(deployment, tmp_path / "pod-ok", pub))
    assert ok.returncode == 0, ok.stderr
    assert (tmp_path / "pod-ok" / "model.sig").read_bytes() == (signed / "model.sig").read_bytes()
    # another key (a signature not from the publisher): exit 1, nothing for vLLM to serve
    _, other = _keypair(tmp_path, "other")
    bad_key = run_cli(*_init_command(deployment, tmp_path / "pod-key", other))
    assert bad_key.returncode == 1 and not (tmp_path / "pod-key").exists()
    # a tampered manifest (config.json pointed at other bytes) pushed under its own digest
    m = json.loads(_get(registry, f"/v2/models/onload/manifests/{good.digest}", oci.MANIFEST_MEDIA_TYPE))
    client = oci._client(oci.parse_oci_ref(ref), None, oci.Settings())
    container = client.get_container(f"models/onload@{good.digest}")
    evil = referrers.put_blob(client, container, b'{"model_type": "evil"}', "evil")
    for lay in m["layers"]:
        if lay["annotations"]["org.opencontainers.image.title"] == "model/config.json":
            lay.update(evil)
    body = json.dumps(m).encode()
    tampered = "sha256:" + hashlib.sha256(body).hexdigest()
    referrers.put_manifest(client, container, tampered, body, oci.MANIFEST_MEDIA_TYPE, "the tampered manifest")
    r = run_cli("serve-plan", str(signed), "--gpu", "L4-24GB", "-o", str(tmp_path / "plan2"), "--verify-from",
                f"oci://{registry}/models/onload@{tampered}")
    assert r.returncode == 0, r.stderr
    dep2 = yaml.safe_load((tmp_path / "plan2" / "serve" / "k8s" / "deployment.yaml").read_text())
    bad = run_cli(*_init_command(dep2, tmp_path / "pod-bad", pub))
    assert bad.returncode == 1 and "model/config.json" in bad.stdout and not (tmp_path / "pod-bad").exists()
    # an unsigned artifact: refused unless --allow-unsigned
    plain = publish_oci(artifact, f"oci://{registry}/models/onload-unsigned:v1", settings=Settings())
    uref = f"oci://{registry}/models/onload-unsigned@{plain.digest}"
    run_cli("serve-plan", str(artifact), "--gpu", "L4-24GB", "-o", str(tmp_path / "plan3"), "--verify-from", uref)
    dep3 = yaml.safe_load((tmp_path / "plan3" / "serve" / "k8s" / "deployment.yaml").read_text())
    unsigned = run_cli(*_init_command(dep3, tmp_path / "pod-unsigned", pub))
    assert unsigned.returncode == 1 and "is unsigned" in unsigned.stdout
    run_cli("serve-plan", str(artifact), "--gpu", "L4-24GB", "-o", str(tmp_path / "plan4"), "--verify-from", uref,
            "--allow-unsigned")
    dep4 = yaml.safe_load((tmp_path / "plan4" / "serve" / "k8s" / "deployment.yaml").read_text())
    assert "--key" not in dep4["spec"]["template"]["spec"]["initContainers"][0]["command"]
    assert run_cli(*_init_command(dep4, tmp_path / "pod-allowed", None)).returncode == 0


def test_verify_from_needs_a_digest(artifact, tmp_path):
    from tests.conftest import run_cli

    r = run_cli("serve-plan", str(artifact), "--gpu", "L4-24GB", "-o", str(tmp_path / "p"), "--verify-from",
                "oci://127.0.0.1:5000/models/x:v1")
    assert r.returncode == 2 and "names a tag; a pod must pull by digest" in r.stderr


def test_publish_refuses_a_signature_made_over_other_bytes(artifact, registry, tmp_path):
    """A signature that no longer covers the artifact (serve/ edited after signing) is refused before any
    byte is pushed: the tag does not exist afterwards; the same artifact re-signed publishes."""
    from modelyard.transport.publish import publish

    copy = tmp_path / "art"
    shutil.copytree(artifact, copy)
    priv, _ = _keypair(tmp_path)
    sign_artifact(copy, private_key=priv)
    vllm_yaml = copy / "serve" / "vllm.yaml"
    vllm_yaml.chmod(0o644)
    vllm_yaml.write_text("model: ../model\nmax-model-len: 256\ntrust-remote-code: true\n")
    with pytest.raises(SignatureError) as ei:
        publish(copy, f"oci://{registry}/models/stale:v1", settings=Settings())
    assert ei.value.message.startswith("art: model.sig was not made over this artifact: serve/vllm.yaml has sha256 ")
    with pytest.raises(urllib.error.HTTPError) as e:
        _get(registry, "/v2/models/stale/manifests/v1", oci.MANIFEST_MEDIA_TYPE)
    assert e.value.code == 404
    sign_artifact(copy, private_key=priv)
    assert publish(copy, f"oci://{registry}/models/stale:v1", settings=Settings()).referrers == ("signature", "verification")


def test_verify_on_load_pulls_from_a_registry_that_needs_a_login(artifact, tmp_path):
    """--registry-secret: the init container reads the registry's credentials from a basic-auth Secret
    (secretKeyRef, never a literal); its command, run here against a real registry that requires a login,
    pulls with the Secret's values and is refused without them; the password appears in no manifest or output."""
    import yaml

    from tests.conftest import json_envelope, run_cli
    from tests.e2e.publish_servers import docker_registry
    from tests.k8s_schemas import validate_builtin

    login = {"MODELYARD_REGISTRY_USER": "puller", "MODELYARD_REGISTRY_PASSWORD": "pa55-w0rd-xyz"}
    with docker_registry(tmp_path / "private", login=("puller", "pa55-w0rd-xyz")) as host:
        anon = run_cli("publish", str(artifact), "--to", f"oci://{host}/models/private:v1", "--json")
        assert anon.returncode == 2, anon.stdout
        assert json_envelope(anon.stdout, "publish", 2)["error"]["message"] == (
            f"oci://{host} requires a login (HTTP basic auth) and no credentials are set")
        r = run_cli("publish", str(artifact), "--to", f"oci://{host}/models/private:v1", "--json", env=login)
        assert r.returncode == 0, r.stdout + r.stderr
        digest = json.loads(r.stdout)["result"]["digest"]
        ref = f"oci://{host}/models/private@{digest}"
        out = tmp_path / "plan"
        r = run_cli("serve-plan", str(artifact), "--gpu", "L4-24GB", "-o", str(out), "--verify-from", ref,
                    "--allow-unsigned", "--registry-secret", "regcred")
        assert r.returncode == 0, r.stderr
        k8s = out / "serve" / "k8s"
        deployment = yaml.safe_load((k8s / "deployment.yaml").read_text())
        validate_builtin(deployment)
        (init,) = deployment["spec"]["template"]["spec"]["initContainers"]
        assert init["env"] == [
            {"name": "MODELYARD_HOME", "value": "/mnt/verified/.modelyard"},
            {"name": "MODELYARD_REGISTRY_USER", "valueFrom": {"secretKeyRef": {"name": "regcred", "key": "username"}}},
            {"name": "MODELYARD_REGISTRY_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "regcred", "key": "password"}}}]
        readme = (k8s / "README.md").read_text()
        assert "kubectl create secret generic regcred --type=kubernetes.io/basic-auth" in readme
        assert all("pa55-w0rd-xyz" not in p.read_text() for p in (out / "serve").rglob("*") if p.is_file())
        secret = {"username": "puller", "password": "pa55-w0rd-xyz"}  # what the Secret holds, as the pod sees it
        env = {e["name"]: secret[e["valueFrom"]["secretKeyRef"]["key"]] for e in init["env"] if "valueFrom" in e}
        refused = run_cli(*_init_command(deployment, tmp_path / "pod-anon", None))
        assert refused.returncode == 2 and not (tmp_path / "pod-anon").exists()
        assert "MODELYARD_REGISTRY_USER" in json_envelope(refused.stdout, "pull", 2)["error"]["fix"]
        ok = run_cli(*_init_command(deployment, tmp_path / "pod-ok", None), env=env)
        assert ok.returncode == 0, ok.stdout + ok.stderr
        assert (tmp_path / "pod-ok" / "model" / "config.json").read_bytes() == (artifact / "model" / "config.json").read_bytes()
        assert "pa55-w0rd-xyz" not in refused.stdout + refused.stderr + ok.stdout + ok.stderr


def test_publish_referrers_only_attaches_a_later_signature_to_the_pushed_manifest(artifact, registry, tmp_path,
                                                                                 tiny_llama_dir):
    """Published unsigned, signed afterwards: `publish --referrers-only` pushes the signature (and attestations)
    onto the manifest already there, no layer; `pull --key` then verifies it. Another artifact is refused."""
    res = publish_oci(artifact, f"oci://{registry}/models/attach:v1", settings=Settings())
    signed = tmp_path / "signed"
    shutil.copytree(artifact, signed)
    priv, pub = _keypair(tmp_path)
    sign_artifact(signed, private_key=priv)
    r = run_cli("publish", str(signed), "--to", f"oci://{registry}/models/attach:v1", "--referrers-only", "--json")
    out = json_result(r.stdout, "publish")
    assert (out["digest"], out["files"], out["bytes"], out["skipped"]) == (res.digest, 0, 0, 0)
    assert out["uri"] == f"oci://{registry}/models/attach@{res.digest}"
    assert out["referrers"] == ["signature", "verification"]
    got = pull_oci(f"oci://{registry}/models/attach@{res.digest}", tmp_path / "ok", public_key=pub, settings=Settings())
    assert (got.signature_verified, got.signature_from) == (True, "referrer")
    # a second team signs the same artifact with its own key: two signature referrers with the same created
    # time; each key finds the one it verifies, a third key none
    second = tmp_path / "second"
    shutil.copytree(artifact, second)
    priv2, pub2 = _keypair(tmp_path, "second")
    sign_artifact(second, private_key=priv2)
    r = run_cli("publish", str(second), "--to", f"oci://{registry}/models/attach:v1", "--referrers-only", "--json")
    assert json_result(r.stdout, "publish")["referrers"] == ["signature", "verification"]
    client = oci._client(oci.parse_oci_ref(f"oci://{registry}/models/attach"), None, oci.Settings())
    container = client.get_container("models/attach:v1")
    sigs = [x for x in referrers.discover(client, container, res.digest) if x.kind == "signature"]
    assert len(sigs) == 2 and len({x.annotations["org.opencontainers.image.created"] for x in sigs}) == 1
    for n, key in enumerate((pub, pub2)):
        got = pull_oci(f"oci://{registry}/models/attach@{res.digest}", tmp_path / f"k{n}", public_key=key, settings=Settings())
        assert (got.signature_verified, got.signature_from) == (True, "referrer")
    _, pub3 = _keypair(tmp_path, "third")
    with pytest.raises(SignatureError):
        pull_oci(f"oci://{registry}/models/attach@{res.digest}", tmp_path / "k3", public_key=pub3, settings=Settings())
    assert not (tmp_path / "k3").exists()
    other = _build_artifact(tiny_llama_dir, tmp_path / "other-store", hub=False)
    # unsigned: there is nothing new to attach, said before any request
    r = run_cli("publish", str(other), "--to", f"oci://{registry}/models/attach:v1", "--referrers-only", "--json")
    err = json_error(r.stdout, "publish", 2)
    assert (err["message"], err["fix"]) == (
        f"{other} has no signature (model.sig): --referrers-only attaches a signature made after publishing, and "
        "there is none; nothing was attached",
        f"Sign it first (`modelyard sign {other}`), then publish --referrers-only again.")
    shutil.copytree(other, tmp_path / "other-signed")
    other = tmp_path / "other-signed"
    sign_artifact(other, private_key=priv)
    r = run_cli("publish", str(other), "--to", f"oci://{registry}/models/attach:v1", "--referrers-only", "--json")
    content = json.loads((other / "manifest.json").read_text())["content_digest"]  # the same weights, another origin
    assert json_error(r.stdout, "publish", 2)["message"] == (
        f"oci://{registry}/models/attach:v1 holds the same content ({content}) under another manifest.json (another "
        "revision or origin); nothing was attached")
    r = run_cli("publish", str(signed), "--to", "s3://models/x", "--referrers-only", "--json")
    assert json_error(r.stdout, "publish", 2)["message"] == ("--referrers-only attaches OCI 1.1 referrers; 's3://models/x' "
                                                            "is not an oci:// reference")
