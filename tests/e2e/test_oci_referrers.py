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
from modelyard.transport import oci, referrers
from modelyard.transport.oci import publish_oci, pull_oci
from modelyard.transport.signing import sign_artifact
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
    res = publish_oci(copy, f"oci://{registry}/models/referred:v1")
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
    publish_oci(copy, f"oci://{registry}/models/referred:v1")
    again = json.loads(_get(registry, f"/v2/models/referred/manifests/sha256-{res.digest[7:]}", referrers.INDEX_MEDIA_TYPE))
    assert sorted(m["digest"] for m in again["manifests"]) == sorted(m["digest"] for m in index["manifests"])


def test_pull_checks_a_signature_that_exists_only_as_a_referrer(artifact, registry, tmp_path):
    res = publish_oci(artifact, f"oci://{registry}/models/late-signed:v1")  # pushed unsigned
    ref = f"oci://{registry}/models/late-signed@{res.digest}"
    priv, pub = _keypair(tmp_path)
    with pytest.raises(SignatureError):  # unsigned: a pull that asks for a signature refuses it
        pull_oci(ref, tmp_path / "unsigned", public_key=pub)
    assert not (tmp_path / "unsigned").exists()
    signed = tmp_path / "signed"
    shutil.copytree(artifact, signed)
    sign_artifact(signed, private_key=priv)  # signed later, attached to the same manifest as a referrer
    client = oci._client(oci.parse_oci_ref(ref), None, oci.Settings())
    container = client.get_container(f"models/late-signed@{res.digest}")
    referrers.push_referrer(client, container, referrers.subject_of(client, container, res.digest),
                            artifact_type=referrers.SIGSTORE_BUNDLE, blob=(signed / "model.sig").read_bytes(),
                            title="model.sig", kind="signature")
    got = pull_oci(ref, tmp_path / "ok", public_key=pub)
    assert (got.signature_verified, got.signature_from) == (True, "referrer")
    assert (got.path / "model.sig").read_bytes() == (signed / "model.sig").read_bytes()
    _, other = _keypair(tmp_path, "other")
    with pytest.raises(SignatureError):
        pull_oci(ref, tmp_path / "bad", public_key=other)
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
    good = publish_oci(signed, f"oci://{registry}/models/onload:v1")
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
    plain = publish_oci(artifact, f"oci://{registry}/models/onload-unsigned:v1")
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
