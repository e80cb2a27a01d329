"""ingest hf://org/tiny@main from a real HF-compatible endpoint (olah on 127.0.0.1, offline mirror
of a local git+LFS repo). One olah server per session; smoke is off (random weights cannot chat)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tests.conftest import run_cli, store_artifacts
from tests.e2e.olah_hub import OlahServer, make_lfs_repo
from tests.fixtures import make_tiny_llama

pytestmark = [pytest.mark.hub, pytest.mark.e2e]


@pytest.fixture(scope="session")
def hub(tmp_path_factory):
    mirrors = tmp_path_factory.mktemp("mirrors")
    model = make_tiny_llama(tmp_path_factory.mktemp("src") / "tiny")
    files = {p.name: p.read_bytes() for p in model.iterdir()}
    only_pickle = {"config.json": files["config.json"], "pytorch_model.bin": b"\x80\x02}q\x00." * 40}
    shas = make_lfs_repo(mirrors, "org", "tiny", [
        {**files, "README.md": b"# tiny\n"},
        {"README.md": b"# tiny, second commit\n"},
    ])
    make_lfs_repo(mirrors, "org", "pickled", [only_pickle])
    with OlahServer(mirrors) as server:
        yield {"endpoint": server.endpoint, "shas": shas, "files": files}


def _env(hub, home: Path) -> dict:
    return {"HF_ENDPOINT": hub["endpoint"], "MODELYARD_HOME": str(home)}


def test_ingest_records_resolved_commit(hub, tmp_path):
    r = run_cli("ingest", "hf://org/tiny@main", "--no-smoke", "--json", env=_env(hub, tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout)
    head = hub["shas"][-1]
    assert out["commit"] == head and out["revision"] == head
    art = Path(out["artifact"])
    assert art == tmp_path / "tiny" / head
    manifest = json.loads((art / "manifest.json").read_text())
    assert manifest["source"]["commit"] == head
    assert manifest["source"]["revision"] == "main"
    by_path = {f["path"]: f for f in manifest["files"]}
    w = hub["files"]["model.safetensors"]
    assert by_path["model/model.safetensors"] == {"path": "model/model.safetensors", "size": len(w),
                                                  "sha256": hashlib.sha256(w).hexdigest(), "origin": "hub-lfs"}
    assert by_path["model/config.json"]["origin"] == "hub-git"
    assert sorted(by_path) == sorted(f"model/{n}" for n in [*hub["files"], "README.md"])
    assert (art / "model" / "model.safetensors").read_bytes() == w
    # the custody chain holds: verify re-hashes against the manifest
    v = run_cli("verify", str(art), env=_env(hub, tmp_path))
    assert v.returncode == 0, v.stderr
    # publishing the same content again is a no-op
    again = run_cli("ingest", f"hf://org/tiny@{head}", "--no-smoke", "--json", env=_env(hub, tmp_path))
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["reused"] is True
    assert json.loads(again.stdout)["cached_stages"] == ["verify"]  # same files: the report is reused
    assert store_artifacts(tmp_path) == [art]
    # a pinned commit's fetch is cached too, unless the hub cache lost its files since
    third = run_cli("ingest", f"hf://org/tiny@{head}", "--no-smoke", "--json", env=_env(hub, tmp_path))
    assert json.loads(third.stdout)["cached_stages"] == ["fetch", "verify"], third.stderr
    import shutil

    shutil.rmtree(tmp_path / ".cache" / "hf")
    fourth = run_cli("ingest", f"hf://org/tiny@{head}", "--no-smoke", "--json", env=_env(hub, tmp_path))
    assert fourth.returncode == 0, fourth.stderr
    assert json.loads(fourth.stdout)["cached_stages"] == ["verify"]
    assert (tmp_path / ".cache" / "hf").is_dir()


def test_flipped_byte_in_downloaded_shard_is_refused(hub, tmp_path):
    from huggingface_hub import snapshot_download

    head = hub["shas"][-1]
    # a first download lands in modelyard's cache; corrupt the blob there, as a bad disk or a broken
    # proxy would, then ingest: the hub's LFS sha256 must catch it before anything is published.
    snap = Path(snapshot_download("org/tiny", revision=head, cache_dir=str(tmp_path / ".cache" / "hf"),
                                  endpoint=hub["endpoint"], token=False))
    blob = (snap / "model.safetensors").resolve()
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.chmod(0o644)
    blob.write_bytes(bytes(data))
    r = run_cli("ingest", "hf://org/tiny@main", "--no-smoke", env=_env(hub, tmp_path))
    assert r.returncode == 1
    want = hashlib.sha256(hub["files"]["model.safetensors"]).hexdigest()
    got = hashlib.sha256(bytes(data)).hexdigest()
    assert f"model.safetensors: expected sha256 {want}, got {got}" in r.stderr
    assert "Traceback" not in r.stderr
    assert store_artifacts(tmp_path) == []
    assert list(tmp_path.glob(".staging/*")) == []


def test_unknown_revision_and_pickle_only(hub, tmp_path):
    r = run_cli("ingest", "hf://org/tiny@no-such-branch", "--no-smoke", env=_env(hub, tmp_path))
    assert r.returncode == 2
    assert "repository org/tiny at revision 'no-such-branch' was not found on " + hub["endpoint"] in r.stderr
    p = run_cli("ingest", "hf://org/pickled@main", "--no-smoke", env=_env(hub, tmp_path))
    assert p.returncode == 2
    assert "has only pickle weights (pytorch_model.bin); modelyard never unpickles" in p.stderr
    assert "Traceback" not in r.stderr + p.stderr
    assert store_artifacts(tmp_path) == []


def test_include_and_exclude_patterns_on_the_command_line(hub, tmp_path):
    """--exclude drops README.md from the download; --include '*.md' alone fetches no config.json
    and is refused before a weight byte is downloaded."""
    head = hub["shas"][-1]
    r = run_cli("ingest", "https://huggingface.co/org/tiny", "--exclude", "README.md", "--no-smoke", "--json",
                env=_env(hub, tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout)
    files = {f["path"] for f in json.loads((Path(out["artifact"]) / "manifest.json").read_text())["files"]}
    assert (out["revision"], sorted(files)) == (head, sorted(f"model/{n}" for n in hub["files"]))
    bad = run_cli("ingest", "hf://org/tiny@main", "--include", "*.md", "--no-smoke", env=_env(hub, tmp_path / "b"))
    assert bad.returncode == 2
    assert "has no config.json" in bad.stderr


def test_offline_ingest_uses_the_local_hub_cache(hub, tmp_path):
    """With HF_HUB_OFFLINE=1 and no endpoint to reach, a cached ref or commit ingests from the local
    hub cache, and an uncached one is refused at once."""
    head = hub["shas"][-1]
    online = run_cli("ingest", "hf://org/tiny@main", "--no-smoke", "--json", env=_env(hub, tmp_path))
    assert online.returncode == 0, online.stderr
    first = json.loads(online.stdout)
    dead = {"HF_ENDPOINT": "http://127.0.0.1:9", "MODELYARD_HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    for ref in ("main", head):
        r = run_cli("ingest", f"hf://org/tiny@{ref}", "--no-smoke", "--json", env=dead)
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert (out["commit"], out["content_digest"], out["reused"]) == (head, first["content_digest"], True)
    missing = run_cli("ingest", "hf://org/tiny@v9", "--no-smoke", env=dead)
    assert missing.returncode == 2
    assert "hf://org/tiny@v9 is not in the local hub cache" in missing.stderr
