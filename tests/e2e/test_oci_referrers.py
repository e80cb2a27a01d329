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
