"""`publish --flavour modelcar` against a real Debian docker-registry on 127.0.0.1, read back with Debian
`skopeo` (not our client): an image index for linux/amd64 and linux/arm64, the base image's entrypoint,
one tar layer per model file at /models/<path> whose content sha256 is manifest.json's, every blob's
sha256 = its digest; then `serve-plan --storage-uri` turns the printed location into a KServe
InferenceService that validates against the KServe SDK's models."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
from pathlib import Path

import pytest
import yaml

from modelyard.errors import HashMismatchError
from modelyard.settings import Settings
from modelyard.transport.modelcar import publish_modelcar
from tests.conftest import json_result, run_cli
from tests.e2e.test_publish_oci import tampered_copy
from tests.k8s_schemas import check_kserve
from tests.unit.test_bundle import _build_artifact

pytestmark = pytest.mark.publish  # needs Debian docker-registry and skopeo: `make test` installs both

SKOPEO = "/usr/bin/skopeo"  # the `registry` fixture (tests/e2e/conftest.py) is the session's docker-registry


@pytest.fixture(scope="module")
def artifact(tiny_llama_dir, tmp_path_factory) -> Path:
    return _build_artifact(tiny_llama_dir, tmp_path_factory.mktemp("store"), hub=True)


@pytest.fixture(scope="module")
def pushed(artifact, registry):
    return publish_modelcar(artifact, f"oci://{registry}/models/car:v1", chunk_size=64 * 1024, settings=Settings())


def _skopeo(*args: str) -> subprocess.CompletedProcess:
    r = subprocess.run([SKOPEO, "--insecure-policy", *args], capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    return r


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@pytest.fixture(scope="module")
def copied(registry, pushed, tmp_path_factory) -> Path:
    """The image copied out of the registry by skopeo, byte for byte (``--preserve-digests``: it refuses to
    change a manifest or layer), checking every blob against its digest on the way."""
    dest = tmp_path_factory.mktemp("skopeo") / "layout"
    _skopeo("copy", "--src-tls-verify=false", "--multi-arch", "all", "--preserve-digests", f"docker://{registry}/models/car:v1",
            f"oci:{dest}:v1")
    return dest


def test_index_digest_and_platforms(registry, pushed):
    raw = _skopeo("inspect", "--tls-verify=false", "--raw", f"docker://{registry}/models/car:v1").stdout
    assert _sha(raw) == pushed.digest  # the digest publish printed is the registry's index
    index = json.loads(raw)
    assert index["mediaType"] == "application/vnd.oci.image.index.v1+json"
    assert sorted((m["platform"]["os"], m["platform"]["architecture"]) for m in index["manifests"]) == \
        [("linux", "amd64"), ("linux", "arm64")]
    assert pushed.uri == f"oci://{registry}/models/car:v1" and pushed.files == 6


def test_layers_hold_the_model_files_by_digest(artifact, copied):
    manifest = json.loads((artifact / "manifest.json").read_text())
    want = {"models/" + f["path"].removeprefix("model/"): f["sha256"] for f in manifest["files"]}
    assert len(want) == 6 and all(p.startswith("models/") for p in want)
    blobs = copied / "blobs" / "sha256"
    (top,) = json.loads((copied / "index.json").read_text())["manifests"]
    index = json.loads((blobs / top["digest"][7:]).read_bytes())
    for desc in index["manifests"]:
        man = json.loads((blobs / desc["digest"][7:]).read_bytes())
        cfg = json.loads((blobs / man["config"]["digest"][7:]).read_bytes())
        assert cfg["config"]["Entrypoint"] == ["/bin/link-model-and-wait"]  # the base links /models and waits
        assert cfg["config"]["Labels"]["dev.modelyard.content-digest"] == manifest["content_digest"]
        assert man["annotations"]["dev.modelyard.content-digest"] == manifest["content_digest"]
        assert len(cfg["rootfs"]["diff_ids"]) == len(man["layers"]) == 1 + len(want)
        found = {}
        for lay in man["layers"]:
            data = (blobs / lay["digest"][7:]).read_bytes()
            assert _sha(data) == lay["digest"] and len(data) == lay["size"]
            if lay["mediaType"] != "application/vnd.oci.image.layer.v1.tar":
                continue  # the base image's gzip layer
            with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                (member,) = tar.getmembers()  # one file per layer
                assert member.isfile() and member.mode == 0o664
                content = tar.extractfile(member).read()
            found[member.name] = hashlib.sha256(content).hexdigest()
            ann = lay["annotations"]
            assert ann["olot.layer.content.digest"] == f"sha256:{found[member.name]}"
            assert ann["olot.layer.content.inlayerpath"] == "/" + member.name
        assert found == want, desc["platform"]  # every model file, each with manifest.json's sha256


def test_republish_is_idempotent(artifact, registry, pushed):
    """The same stored artifact gives the same image: every blob is already there (2 base layers, 6 model
    layers, 2 configs) and the index digest is the same."""
    again = publish_modelcar(artifact, f"oci://{registry}/models/car:v2", settings=Settings())
    assert again.skipped == 10 and again.digest == pushed.digest


def test_changed_file_refused_before_push(artifact, registry, tmp_path):
    copy = tampered_copy(artifact, tmp_path / "art", "model/config.json", 5)
    with pytest.raises(HashMismatchError, match="model/config.json: the bytes read into the ModelCar layer"):
        publish_modelcar(copy, f"oci://{registry}/models/changed:v1", settings=Settings())
    r = subprocess.run([SKOPEO, "inspect", "--tls-verify=false", "--raw", f"docker://{registry}/models/changed:v1"],
                       capture_output=True, timeout=60)
    assert r.returncode != 0 and b"manifest unknown" in r.stderr  # nothing was tagged


def test_cli_publish_modelcar_then_kserve_manifest(artifact, registry, tmp_path):
    r = run_cli("publish", str(artifact), "--to", f"oci://{registry}/models/cli-car", "--flavour", "modelcar", "--json")
    assert r.returncode == 0, r.stderr
    d = json_result(r.stdout, "publish")
    rev = json.loads((artifact / "manifest.json").read_text())["revision"]
    assert d["uri"] == f"oci://{registry}/models/cli-car:{rev}" and d["flavour"] == "modelcar"
    assert d["storage_uri"] == f"oci://{registry}/models/cli-car@{d['digest']}"
    raw = _skopeo("inspect", "--tls-verify=false", "--raw", f"docker://{registry}/models/cli-car@{d['digest']}").stdout
    assert _sha(raw) == d["digest"]
    out = tmp_path / "plan"
    r = run_cli("serve-plan", str(artifact), "--gpu", "L4-24GB", "-o", str(out), "--storage-uri", d["storage_uri"])
    assert r.returncode == 0, r.stderr
    isvc = yaml.safe_load((out / "serve" / "k8s" / "inferenceservice.yaml").read_text())
    (c,) = isvc["spec"]["predictor"]["containers"]
    assert c["env"][0] == {"name": "STORAGE_URI", "value": d["storage_uri"]}
    assert check_kserve(isvc) == []
    r = run_cli("publish", str(artifact), "--to", "s3://bucket/prefix", "--flavour", "modelcar")
    assert r.returncode == 2 and "--flavour modelcar is an OCI image" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("publish", str(artifact), "--to", f"oci://{registry}/models/x", "--flavour", "docker")
    assert r.returncode == 2 and "--flavour 'docker' is not a publish flavour" in r.stderr
