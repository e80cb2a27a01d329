"""OCI publish against a real Debian docker-registry (distribution 2.8) on 127.0.0.1:
push → pull bit-identical, layer digests = manifest.json's sha256, ModelPack media types and
annotations, chunked upload, tampered and unsafe registry content refused, signature on pull."""

from __future__ import annotations

import hashlib
import json
import shutil
import urllib.request
from pathlib import Path

import pytest

from modelyard.errors import HashMismatchError, PublishError, SignatureError
from modelyard.settings import Settings
from modelyard.transport import oci
from modelyard.transport.oci import publish_oci, pull_oci
from modelyard.transport.signing import sign_artifact
from tests.conftest import json_result, run_cli
from tests.unit.test_bundle import _build_artifact
from tests.unit.test_signing import _keypair

pytestmark = pytest.mark.publish  # needs Debian docker-registry and moto_server: `make test` installs both


@pytest.fixture(scope="module")
def artifact(tiny_llama_dir, tmp_path_factory) -> Path:
    return _build_artifact(tiny_llama_dir, tmp_path_factory.mktemp("store"), hub=True)


def _tree(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _get(host: str, path: str, accept: str = oci.MANIFEST_MEDIA_TYPE) -> bytes:
    req = urllib.request.Request(f"http://{host}{path}", headers={"Accept": accept})
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.read()


def _put_manifest(host: str, repo: str, tag: str, manifest: dict) -> None:
    req = urllib.request.Request(f"http://{host}/v2/{repo}/manifests/{tag}", data=json.dumps(manifest).encode(),
                                 method="PUT", headers={"Content-Type": oci.MANIFEST_MEDIA_TYPE})
    urllib.request.urlopen(req, timeout=10).read()


def _put_blob(host: str, repo: str, data: bytes) -> str:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    req = urllib.request.Request(f"http://{host}/v2/{repo}/blobs/uploads/", data=b"", method="POST")
    with urllib.request.urlopen(req, timeout=10) as r:
        loc = r.headers["Location"]
    loc = loc if loc.startswith("http") else f"http://{host}{loc}"
    sep = "&" if "?" in loc else "?"
    req = urllib.request.Request(f"{loc}{sep}digest={digest}", data=data, method="PUT",
                                 headers={"Content-Type": "application/octet-stream"})
    urllib.request.urlopen(req, timeout=10).read()
    return digest


@pytest.fixture(scope="module")
def pushed(artifact, registry):
    """The artifact pushed once with 64 KiB chunks (the 180 KB weights go up in 3 PATCHes)."""
    return publish_oci(artifact, f"oci://{registry}/models/tiny:v1", chunk_size=64 * 1024, settings=Settings())


def test_round_trip_bit_identical(artifact, registry, pushed, tmp_path):
    res = pull_oci(f"oci://{registry}/models/tiny:v1", tmp_path / "pulled", settings=Settings())
    assert _tree(tmp_path / "pulled") == _tree(artifact)
    assert res.content_digest == json.loads((artifact / "manifest.json").read_text())["content_digest"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pulled"]  # no temp folder left behind
    # by digest too
    res2 = pull_oci(f"oci://{registry}/models/tiny@{pushed.digest}", tmp_path / "by-digest", settings=Settings())
    assert _tree(res2.path) == _tree(artifact)


def test_layers_media_types_and_annotations(artifact, registry, pushed):
    m = json.loads(_get(registry, "/v2/models/tiny/manifests/v1"))
    assert m["artifactType"] == "application/vnd.cncf.model.manifest.v1+json"
    assert m["config"]["mediaType"] == "application/vnd.cncf.model.config.v1+json"
    manifest = json.loads((artifact / "manifest.json").read_text())
    sha = {f["path"]: f["sha256"] for f in manifest["files"]}
    layers = {lay["annotations"]["org.opencontainers.image.title"]: lay for lay in m["layers"]}
    assert set(layers) == set(_tree(artifact))  # one layer per file
    for rel, lay in layers.items():
        if rel in sha:  # the custody chain: manifest.json's sha256 = the layer digest
            assert lay["digest"] == f"sha256:{sha[rel]}", rel
        assert lay["digest"] == "sha256:" + hashlib.sha256((artifact / rel).read_bytes()).hexdigest()
        assert lay["size"] == (artifact / rel).stat().st_size
        assert lay["annotations"]["org.cncf.model.filepath"] == rel
    assert layers["model/model.safetensors"]["mediaType"] == "application/vnd.cncf.model.weight.v1.raw"
    for rel in ("model/config.json", "model/tokenizer.json", "model/chat_template.jinja"):
        assert layers[rel]["mediaType"] == "application/vnd.cncf.model.weight.config.v1.raw"
    for rel in ("manifest.json", "report.json", "report.md", "serve/vllm.yaml"):
        assert layers[rel]["mediaType"] == "application/vnd.cncf.model.doc.v1.raw"
    ann = m["annotations"]
    assert ann["org.opencontainers.image.source"] == "hf://org/tiny@main"
    assert ann["org.opencontainers.image.revision"] == manifest["source"]["commit"]
    assert ann["dev.modelyard.quantization"] == "none"
    assert ann["dev.modelyard.content-digest"] == manifest["content_digest"]
    cfg = json.loads(_get(registry, f"/v2/models/tiny/blobs/{m['config']['digest']}", "*/*"))
    assert set(cfg) == {"descriptor", "config", "modelfs"}
    assert cfg["config"]["format"] == "safetensors" and cfg["config"]["architecture"] == "transformer"
    assert cfg["config"]["paramSize"] and cfg["config"]["precision"]
    assert cfg["descriptor"]["family"] == "llama" and cfg["descriptor"]["name"] == "tiny"
    assert cfg["modelfs"] == {"type": "layers", "diffIds": [lay["digest"] for lay in m["layers"]]}


def test_chunked_upload_was_used(registry, pushed, tmp_path_factory):
    log = Path(tmp_path_factory.getbasetemp()) / "registry0" / "registry.log"  # the session registry's, not another's
    assert log.read_text().count('"PATCH /v2/models/tiny/blobs/uploads/') >= 3


def test_republish_is_idempotent(artifact, registry, pushed):
    again = publish_oci(artifact, f"oci://{registry}/models/tiny:v1", settings=Settings())
    assert again.digest == pushed.digest and again.skipped == again.files + 1  # + the config blob


def test_tampered_blob_fails_pull_naming_file(artifact, registry, pushed, tmp_path):
    """A manifest pointing model/config.json at other bytes: the layer digest no longer equals
    manifest.json's sha256 for it, and the pull refuses before writing anything."""
    m = json.loads(_get(registry, "/v2/models/tiny/manifests/v1"))
    evil = _put_blob(registry, "models/tiny", b'{"model_type": "evil"}')
    for lay in m["layers"]:
        if lay["annotations"]["org.opencontainers.image.title"] == "model/config.json":
            lay["digest"], lay["size"] = evil, len(b'{"model_type": "evil"}')
    _put_manifest(registry, "models/tiny", "tampered", m)
    with pytest.raises(HashMismatchError, match="model/config.json"):
        pull_oci(f"oci://{registry}/models/tiny:tampered", tmp_path / "out", settings=Settings())
    assert list(tmp_path.iterdir()) == []


def test_unsafe_titles_refused(registry, pushed, tmp_path):
    m = json.loads(_get(registry, "/v2/models/tiny/manifests/v1"))
    for bad in ("../escape.txt", "/etc/passwd", "model/../../x"):
        m2 = json.loads(json.dumps(m))
        m2["layers"][-1]["annotations"]["org.opencontainers.image.title"] = bad
        _put_manifest(registry, "models/tiny", "unsafe", m2)
        with pytest.raises(PublishError, match="refused the path"):
            pull_oci(f"oci://{registry}/models/tiny:unsafe", tmp_path / "out", settings=Settings())
        assert list(tmp_path.iterdir()) == []


def test_pull_errors(registry, pushed, tmp_path):
    with pytest.raises(PublishError, match="no such repository or tag"):
        pull_oci(f"oci://{registry}/models/tiny:nosuchtag", tmp_path / "a", settings=Settings())
    (tmp_path / "exists").mkdir()
    with pytest.raises(PublishError, match="already exists"):
        pull_oci(f"oci://{registry}/models/tiny:v1", tmp_path / "exists", settings=Settings())


def tampered_copy(artifact: Path, copy: Path, rel: str, offset: int) -> Path:
    """A copy of ``artifact`` at ``copy`` whose file ``rel`` has one bit flipped at ``offset`` (same size,
    different bytes than manifest.json records)."""
    shutil.copytree(artifact, copy)
    p = copy / rel
    p.chmod(0o644)
    data = bytearray(p.read_bytes())
    data[offset] ^= 1
    p.write_bytes(bytes(data))
    return copy


def test_changed_file_refused_by_registry(artifact, registry, tmp_path):
    """A file edited after ingest no longer matches its manifest sha256: the registry's digest check
    refuses it (each byte is read once, never re-hashed locally)."""
    copy = tampered_copy(artifact, tmp_path / "art", "model/tokenizer_config.json", 10)
    with pytest.raises(HashMismatchError, match="model/tokenizer_config.json"):
        publish_oci(copy, f"oci://{registry}/models/changed:v1", settings=Settings())


def test_signature_checked_on_pull(artifact, registry, tmp_path):
    copy = tmp_path / "art"
    shutil.copytree(artifact, copy)
    priv, pub = _keypair(tmp_path)
    sign_artifact(copy, private_key=priv)
    publish_oci(copy, f"oci://{registry}/models/signed:v1", settings=Settings())
    res = pull_oci(f"oci://{registry}/models/signed:v1", tmp_path / "ok", public_key=pub, settings=Settings())
    assert res.signature_verified is True and (res.path / "model.sig").is_file()
    _, other = _keypair(tmp_path, "other")
    with pytest.raises(SignatureError):
        pull_oci(f"oci://{registry}/models/signed:v1", tmp_path / "bad", public_key=other, settings=Settings())
    assert not (tmp_path / "bad").exists()


def test_cli_publish_and_pull(artifact, registry, tmp_path):
    r = run_cli("publish", str(artifact), "--to", f"oci://{registry}/models/cli", "--json")
    assert r.returncode == 0, r.stderr
    d = json_result(r.stdout, "publish")
    rev = json.loads((artifact / "manifest.json").read_text())["revision"]
    assert d["uri"] == f"oci://{registry}/models/cli:{rev}" and d["digest"].startswith("sha256:")
    r = run_cli("pull", f"oci://{registry}/models/cli:{rev}", "--into", str(tmp_path / "p"))
    assert r.returncode == 0, r.stderr
    assert _tree(tmp_path / "p") == _tree(artifact)
    r = run_cli("pull", f"oci://{registry}/models/cli:nope", "--into", str(tmp_path / "q"))
    assert r.returncode == 2 and "no such repository or tag" in r.stderr and "Traceback" not in r.stderr


def test_credentials_never_in_messages(artifact, registry, tmp_path):
    r = run_cli("pull", f"oci://{registry}/models/tiny:nope", "--into", str(tmp_path / "x"),
                env={"MODELYARD_REGISTRY_USER": "alice", "MODELYARD_REGISTRY_PASSWORD": "s3cr3t-pw"})
    assert r.returncode == 2 and "s3cr3t-pw" not in r.stdout + r.stderr


def test_ingest_publish_pushes_the_stored_artifact(registry, tiny_llama_dir, tmp_path):
    """`ingest --publish oci://...` pushes what the store holds; pulling it back gives the same files."""
    home = tmp_path / "store"
    ref = f"oci://{registry}/modelyard/ingested:v1"
    r = run_cli("ingest", f"file://{tiny_llama_dir}", "--no-smoke", "--out", str(home), "--publish", ref, "--json")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    out = json_result(r.stdout, "ingest")
    (pub,) = out["published"]
    assert pub["uri"] == ref and pub["digest"].startswith("sha256:") and pub["files"] >= 5
    pulled = pull_oci(ref, tmp_path / "pulled", settings=Settings())
    art = Path(out["artifact"])
    assert _tree(pulled.path) == _tree(art)


def test_big_blobs_go_up_side_by_side_and_come_down_in_ranges(artifact, registry, tmp_path, tmp_path_factory):
    """Two 40 MiB files (a checkpoint's shards): pushed, then pulled as ranged GETs of 16 MiB (three per blob,
    the registry answers Range with 206), hashed whole: the copy is bit-identical."""
    import os

    big = tmp_path / "big"
    shutil.copytree(artifact, big)
    for name in ("a.bin", "b.bin"):
        (big / "serve" / name).write_bytes(os.urandom(40 * 1024 * 1024 + 5))
    publish_oci(big, f"oci://{registry}/models/big:v1", settings=Settings())
    log = Path(tmp_path_factory.getbasetemp()) / "registry0" / "registry.log"
    before = len(log.read_text().splitlines())
    res = pull_oci(f"oci://{registry}/models/big:v1", tmp_path / "out", settings=Settings())
    assert _tree(res.path) == _tree(big)
    lines = log.read_text().splitlines()[before:]
    for name in ("a.bin", "b.bin"):
        sha = hashlib.sha256((big / "serve" / name).read_bytes()).hexdigest()
        gets = [line for line in lines if f'"GET /v2/models/big/blobs/sha256:{sha} ' in line]
        assert len(gets) == 3 and all('" 206 ' in line for line in gets), gets
