"""ingest hf://org/tiny@main from a real HF-compatible endpoint (olah on 127.0.0.1, offline mirror
of a local git+LFS repo). One olah server per session; smoke is off (random weights cannot chat).
Answers olah cannot give (a gated repo's redacted hashes, a corrupted body) come from a small proxy in
front of it (tests/e2e/hub_proxy.py)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tests.conftest import json_error, json_result, run_cli, store_artifacts
from tests.e2e.hub_proxy import HubProxy
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
    make_lfs_repo(mirrors, "org", "licensed", [{**files, "LICENSE": b"Apache License 2.0\n", "NOTICE": b"tiny, by org\n",
                                                 "README.md": b"# licensed\n", "trainer_state.json": b"{}"}])
    make_lfs_repo(mirrors, "org", "carded", [{**files, "README.md": b"---\nlicense: cc-by-nc-4.0\n---\n# carded\n"}])
    # the same license spaced so that a string comparison misses it: a leading space and a trailing no-break space
    make_lfs_repo(mirrors, "org", "spaced", [{**files, "README.md": "---\nlicense: other\nlicense_name: \" CC-BY-NC-4.0"
                                                                    "\u00a0\"\n---\n# spaced\n".encode()}])
    broken = _broken_header(files["model.safetensors"])
    make_lfs_repo(mirrors, "org", "broken", [{**files, "model.safetensors": broken}])
    # one 24 MB shard (hidden 1024, one layer): more than huggingface_hub's 10 MiB download chunk, so a
    # download killed mid-file leaves a partial file behind
    big = make_tiny_llama(tmp_path_factory.mktemp("src") / "big", layers=1, hidden=1024, intermediate=2816)
    big_files = {p.name: p.read_bytes() for p in big.iterdir()}
    big_shas = make_lfs_repo(mirrors, "org", "big", [big_files])
    with OlahServer(mirrors) as server, HubProxy(server.endpoint) as proxy:
        yield {"endpoint": server.endpoint, "shas": shas, "files": files, "proxy": proxy, "broken": broken,
               "big": big_files, "big_shas": big_shas}


def _broken_header(weights: bytes) -> bytes:
    """``weights`` with model.norm.weight declared [65] instead of [64] in its header (same length):
    its data_offsets then span 128 bytes where 130 are needed."""
    n = int.from_bytes(weights[:8], "little")
    header = json.loads(weights[8:8 + n])
    assert header["model.norm.weight"]["shape"] == [64]
    raw = weights[8:8 + n].replace(json.dumps(header["model.norm.weight"], separators=(",", ":")).encode(),
                                   json.dumps({**header["model.norm.weight"], "shape": [65]}, separators=(",", ":")).encode())
    assert len(raw) == n and raw != weights[8:8 + n]
    return weights[:8] + raw + weights[8 + n:]


def _blobs(home: Path, repo: str) -> list[str]:
    """Names of the files in the hub cache's blobs/ for ``repo`` (incomplete downloads included)."""
    return sorted(p.name for p in (home / ".cache" / "hf" / f"models--{repo.replace('/', '--')}" / "blobs").glob("*"))


def _env(hub, home: Path) -> dict:
    return {"HF_ENDPOINT": hub["endpoint"], "MODELYARD_HOME": str(home)}


def test_ingest_records_resolved_commit(hub, tmp_path):
    r = run_cli("ingest", "hf://org/tiny@main", "--no-smoke", "--json", env=_env(hub, tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    out = json_result(r.stdout, "ingest")
    head = hub["shas"][-1]
    assert out["commit"] == head and out["revision"] == head
    assert out["hashed_bytes"] == 0  # every file was hashed while it was downloaded, none read back
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
    assert sorted(by_path) == sorted(f"model/{n}" for n in hub["files"])  # README.md: no runtime reads it
    assert out["left_out"] == [".gitattributes", "README.md"]
    report = json.loads((art / "report.json").read_text())
    assert [f["file"] for f in report["findings"] if f["code"] == "files.left_out"] == [".gitattributes", "README.md"]
    assert (art / "model" / "model.safetensors").read_bytes() == w
    # the custody chain holds: verify re-hashes against the manifest
    v = run_cli("verify", str(art), env=_env(hub, tmp_path))
    assert v.returncode == 0, v.stderr
    # publishing the same content again is a no-op
    again = run_cli("ingest", f"hf://org/tiny@{head}", "--no-smoke", "--json", env=_env(hub, tmp_path))
    assert again.returncode == 0, again.stderr
    assert json_result(again.stdout, "ingest")["reused"] is True
    assert json_result(again.stdout, "ingest")["cached_stages"] == ["verify"]  # same files: the report is reused
    assert store_artifacts(tmp_path) == [art]
    # a pinned commit's fetch is cached too, unless the hub cache lost its files since
    third = run_cli("ingest", f"hf://org/tiny@{head}", "--no-smoke", "--json", env=_env(hub, tmp_path))
    assert json_result(third.stdout, "ingest")["cached_stages"] == ["fetch", "verify"], third.stderr
    import shutil

    shutil.rmtree(tmp_path / ".cache" / "hf")
    fourth = run_cli("ingest", f"hf://org/tiny@{head}", "--no-smoke", "--json", env=_env(hub, tmp_path))
    assert fourth.returncode == 0, fourth.stderr
    assert json_result(fourth.stdout, "ingest")["cached_stages"] == ["verify"]
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
    """Refused before Prefect starts (the CLI's preflight asks the hub first): with PREFECT_API_URL pointing at
    nothing, the refusals are still the hub's, in the flow's words."""
    proxy = hub["proxy"]
    first = len(proxy.requests)
    dead = {"PREFECT_API_URL": "http://127.0.0.1:9/api"}
    r = run_cli("ingest", "hf://org/tiny@no-such-branch", "--no-smoke",
                env={**_env(hub, tmp_path), "HF_ENDPOINT": proxy.endpoint, **dead})
    assert r.returncode == 2
    assert "repository org/tiny at revision 'no-such-branch' was not found on " + proxy.endpoint in r.stderr
    # answered by the first request, with no retry and nothing else asked: well under a second
    assert proxy.requests[first:] == [("GET", "/api/models/org/tiny/revision/no-such-branch", None)]
    p = run_cli("ingest", "hf://org/pickled@main", "--no-smoke", env={**_env(hub, tmp_path), **dead})
    assert p.returncode == 2
    assert "has only pickle weights (pytorch_model.bin); modelyard never unpickles" in p.stderr
    assert "Traceback" not in r.stderr + p.stderr
    assert store_artifacts(tmp_path) == []


def test_include_adds_to_the_files_a_model_needs_and_licenses_are_kept(hub, tmp_path):
    """As the hub's own CLI users expect: --include adds files to what a runtime reads (a narrow --include
    no longer ends in "no config.json"); LICENSE and NOTICE are kept by default; --exclude still removes."""
    def files_of(r):
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        out = json_result(r.stdout, "ingest")
        return sorted(f["path"] for f in json.loads((Path(out["artifact"]) / "manifest.json").read_text())["files"]), out
    model = sorted(f"model/{n}" for n in hub["files"])
    got, out = files_of(run_cli("ingest", "hf://org/licensed@main", "--no-smoke", "--json", env=_env(hub, tmp_path / "a")))
    assert got == sorted(model + ["model/LICENSE", "model/NOTICE"])
    assert out["left_out"] == [".gitattributes", "README.md", "trainer_state.json"]
    got, out = files_of(run_cli("ingest", "hf://org/licensed@main", "--include", "*.md", "--no-smoke", "--json",
                                env=_env(hub, tmp_path / "b")))
    assert got == sorted(model + ["model/LICENSE", "model/NOTICE", "model/README.md"])
    assert out["left_out"] == [".gitattributes", "trainer_state.json"]
    bad = run_cli("ingest", "hf://org/licensed@main", "--exclude", "config.json", "--no-smoke", env=_env(hub, tmp_path / "c"))
    assert bad.returncode == 2 and "has no config.json" in bad.stderr


def test_include_and_exclude_patterns_on_the_command_line(hub, tmp_path):
    """--exclude drops README.md from the download (what the default selection does too: the revision stays
    the commit); --include '*.md' adds README.md to model/, into the same store: other content of the same
    commit gets its own revision, ``<commit>-files-<8 hex of the sorted paths>``, never a store conflict."""
    head = hub["shas"][-1]
    r = run_cli("ingest", "https://huggingface.co/org/tiny", "--exclude", "README.md", "--no-smoke", "--json",
                env=_env(hub, tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    out = json_result(r.stdout, "ingest")
    files = {f["path"] for f in json.loads((Path(out["artifact"]) / "manifest.json").read_text())["files"]}
    assert (out["revision"], sorted(files)) == (head, sorted(f"model/{n}" for n in hub["files"]))
    more = run_cli("ingest", "hf://org/tiny@main", "--include", "*.md", "--no-smoke", "--json", env=_env(hub, tmp_path))
    assert more.returncode == 0, more.stderr
    out = json_result(more.stdout, "ingest")
    files = {f["path"] for f in json.loads((Path(out["artifact"]) / "manifest.json").read_text())["files"]}
    assert sorted(files) == sorted([f"model/{n}" for n in hub["files"]] + ["model/README.md"])
    chosen = "\n".join(sorted([*hub["files"], "README.md"])).encode()
    assert out["revision"] == f"{head}-files-{hashlib.sha256(chosen).hexdigest()[:8]}" and not out["reused"]
    assert out["commit"] == head


def test_offline_ingest_uses_the_local_hub_cache(hub, tmp_path):
    """With HF_HUB_OFFLINE=1 and no endpoint to reach, a cached ref or commit ingests from the local
    hub cache, and an uncached one is refused at once."""
    head = hub["shas"][-1]
    online = run_cli("ingest", "hf://org/tiny@main", "--no-smoke", "--json", env=_env(hub, tmp_path))
    assert online.returncode == 0, online.stderr
    first = json_result(online.stdout, "ingest")
    dead = {"HF_ENDPOINT": "http://127.0.0.1:9", "MODELYARD_HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    for ref in ("main", head):
        r = run_cli("ingest", f"hf://org/tiny@{ref}", "--no-smoke", "--json", env=dead)
        assert r.returncode == 0, r.stderr
        out = json_result(r.stdout, "ingest")
        assert (out["commit"], out["content_digest"], out["reused"]) == (head, first["content_digest"], True)
    missing = run_cli("ingest", "hf://org/tiny@v9", "--no-smoke", env=dead)
    assert missing.returncode == 2
    assert "hf://org/tiny@v9 is not in the local hub cache" in missing.stderr


def test_corrupted_download_is_refused_and_never_cached(hub, tmp_path):
    """The hub's LFS sha256 is checked against the bytes received: a body with one flipped byte fails
    the fetch naming both digests, and nothing of it stays in the hub cache (a later run downloads again)."""
    from modelyard.errors import HashMismatchError
    from modelyard.model.source import parse_source
    from modelyard.settings import Settings
    from modelyard.stages.fetch import fetch

    proxy = hub["proxy"]
    proxy.corrupt = {"org/tiny": {"model.safetensors"}}
    try:
        with pytest.raises(HashMismatchError) as e:
            fetch(parse_source("hf://org/tiny@main"), Settings(home=tmp_path, hf_endpoint=proxy.endpoint))
    finally:
        proxy.corrupt = {}
    w = hub["files"]["model.safetensors"]
    flipped = bytearray(w)
    flipped[len(w) // 2] ^= 0xFF
    want, got = hashlib.sha256(w).hexdigest(), hashlib.sha256(bytes(flipped)).hexdigest()
    assert f"model.safetensors: expected sha256 {want}, got {got}" in e.value.message
    assert want not in _blobs(tmp_path, "org/tiny") and got not in _blobs(tmp_path, "org/tiny")
    assert not [b for b in _blobs(tmp_path, "org/tiny") if b.endswith(".incomplete")]
    again = fetch(parse_source("hf://org/tiny@main"), Settings(home=tmp_path, hf_endpoint=hub["endpoint"]))
    assert again.file("model.safetensors").sha256 == want and again.file("model.safetensors").received


def test_remote_verify_agrees_with_the_full_local_verify(hub, tmp_path):
    """verify hf://... judges config, tokenizer and every safetensors header read by HTTP range, and
    gives exactly the findings of a verify of the fully downloaded folder, for a healthy repo and a
    broken one; no weight file is downloaded for it."""
    from huggingface_hub import snapshot_download

    from modelyard.model.source import parse_source
    from modelyard.settings import Settings
    from modelyard.stages.verify import verify_folder, verify_source

    settings = Settings(home=tmp_path / "home", hf_endpoint=hub["endpoint"])
    for repo, weights in (("org/tiny", hub["files"]["model.safetensors"]), ("org/broken", hub["broken"])):
        remote = verify_source(parse_source(f"hf://{repo}@main"), settings=settings)
        full = Path(snapshot_download(repo, revision="main", cache_dir=str(tmp_path / "full"), endpoint=hub["endpoint"],
                                      token=False))
        assert (full / "model.safetensors").read_bytes() == weights
        assert remote.findings == verify_folder(full).findings, repo
        assert hashlib.sha256(weights).hexdigest() not in _blobs(tmp_path / "home", repo)
        assert not (tmp_path / "home" / ".cache" / "preverify").exists() or \
            not any((tmp_path / "home" / ".cache" / "preverify").iterdir())
    assert remote.passed is False and "safetensors.tensor.size_mismatch" in {f.code for f in remote.errors}
    cli = run_cli("verify", "hf://org/broken@main", env={"HF_ENDPOINT": hub["endpoint"],
                                                         "MODELYARD_HOME": str(tmp_path / "cli")})
    assert cli.returncode == 1, cli.stdout + cli.stderr
    assert "safetensors.tensor.size_mismatch" in cli.stdout and "FAIL hf://org/broken@main" in cli.stdout
    assert hashlib.sha256(hub["broken"]).hexdigest() not in _blobs(tmp_path / "cli", "org/broken")


def test_ingest_of_a_broken_repo_fails_before_its_weights_are_downloaded(hub, tmp_path):
    r = run_cli("ingest", "hf://org/broken@main", "--no-smoke", env=_env(hub, tmp_path))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "before its weights were downloaded" in r.stderr
    assert "[safetensors.tensor.size_mismatch] model.safetensors: tensor model.norm.weight (BF16 [65])" in r.stderr
    blobs = _blobs(tmp_path, "org/broken")
    assert len(blobs) == len(hub["files"]) - 1  # every file but the weights
    assert hashlib.sha256(hub["broken"]).hexdigest() not in blobs
    assert not list((tmp_path / ".cache" / "hf").rglob("*.safetensors"))
    assert store_artifacts(tmp_path) == []


def test_redacted_hub_hashes_are_unverifiable_not_mismatched(hub, tmp_path):
    """A gated repo's tree may redact the LFS sha256 (asterisks) or give none: the ingest passes with a
    warning naming each such file, and the manifest's origin for them is "unverified", never hub-*."""
    proxy = hub["proxy"]
    proxy.redact = {"org/tiny": {"model.safetensors": "asterisks", "tokenizer_config.json": "null"}}
    try:
        r = run_cli("ingest", "hf://org/tiny@main", "--no-smoke", "--json",
                    env={"HF_ENDPOINT": proxy.endpoint, "MODELYARD_HOME": str(tmp_path)})
    finally:
        proxy.redact = {}
    assert r.returncode == 0, r.stdout + r.stderr
    art = Path(json_result(r.stdout, "ingest")["artifact"])
    origins = {f["path"]: (f["origin"], f["sha256"]) for f in json.loads((art / "manifest.json").read_text())["files"]}
    w = hub["files"]["model.safetensors"]
    assert origins["model/model.safetensors"] == ("unverified", hashlib.sha256(w).hexdigest())
    assert origins["model/tokenizer_config.json"][0] == "unverified"
    assert {o for p, (o, _) in origins.items() if p not in ("model/model.safetensors", "model/tokenizer_config.json")} == {"hub-git"}
    report = json.loads((art / "report.json").read_text())
    warned = [(f["code"], f["severity"], f["file"]) for f in report["findings"] if f["code"] == "source.hash_unverifiable"]
    assert warned == [("source.hash_unverifiable", "warning", "model.safetensors"),
                      ("source.hash_unverifiable", "warning", "tokenizer_config.json")]


def test_a_killed_download_resumes_with_a_range_request(hub, tmp_path):
    """An ingest SIGKILLed in the middle of a 24 MB shard leaves blobs/<etag>.incomplete; the next ingest
    hashes what it holds, asks the hub only for the rest (Range: bytes=<n>-, answered 206 as the Hub's CDN
    answers) and still compares the whole file's sha256 with the hub's."""
    import os
    import sys

    from tests.killing import kill_at

    proxy, head = hub["proxy"], hub["big_shas"][-1]
    weights = hub["big"]["model.safetensors"]
    env = {"HF_ENDPOINT": proxy.endpoint, "MODELYARD_HOME": str(tmp_path)}
    blobs = tmp_path / ".cache" / "hf" / "models--org--big" / "blobs"

    def big_partials():
        """The blobs/*.incomplete files of 10 MiB or more; a small file's partial may finish (and be renamed
        away) between the listing and its stat, so a vanished one is skipped."""
        found = []
        for part in blobs.glob("*.incomplete") if blobs.is_dir() else ():
            try:
                found += [part] if part.stat().st_size >= 10 << 20 else []
            except FileNotFoundError:
                continue
        return found

    def partial(_events, _seconds):
        return "partial" if big_partials() else None

    proxy.ranges, proxy.stall = True, {"model.safetensors": 12 << 20}
    try:
        label = kill_at([sys.executable, "-m", "modelyard", "ingest", "hf://org/big@main", "--no-smoke", "--json"],
                        {**os.environ, **env}, tmp_path / "events.jsonl", partial)
        assert label == "partial"
        (left,) = big_partials()
        have = left.stat().st_size
        assert have == 10 << 20 and left.read_bytes() == weights[:have]
        proxy.stall = {}
        first = len(proxy.requests)
        served = {k: v for k, v in proxy.served.items()}
        r = run_cli("ingest", "hf://org/big@main", "--no-smoke", "--json", env=env)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        gets = [(p, rng) for m, p, rng in proxy.requests[first:] if m == "GET" and p.endswith("/model.safetensors")]
        n = int.from_bytes(weights[:8], "little")  # the header, read by range before any weight byte
        url = f"/org/big/resolve/{head}/model.safetensors"
        assert gets == [(url, "bytes=0-7"), (url, f"bytes=8-{8 + n - 1}"), (url, f"bytes={have}-")]
        sent = sum(v - served.get(k, 0) for k, v in proxy.served.items() if k[1].endswith("/model.safetensors"))
        assert sent == 8 + n + len(weights) - have
    finally:
        proxy.ranges, proxy.stall = False, {}
    art = Path(json_result(r.stdout, "ingest")["artifact"])
    by_path = {f["path"]: f for f in json.loads((art / "manifest.json").read_text())["files"]}
    assert by_path["model/model.safetensors"]["sha256"] == hashlib.sha256(weights).hexdigest()
    assert (art / "model" / "model.safetensors").read_bytes() == weights
    assert list(blobs.glob("*.incomplete")) == []


def test_a_partial_file_that_is_not_a_prefix_is_downloaded_afresh(hub, tmp_path):
    """A partial file whose bytes are not the file's start (a disk error, another file's bytes): the resumed
    download's sha256 differs from the hub's, so the partial is removed and the whole file downloaded once
    more (a second GET with no Range); it then matches, and the hub is not blamed."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    proxy, head = hub["proxy"], hub["big_shas"][-1]
    weights = hub["big"]["model.safetensors"]
    env = {"HF_ENDPOINT": proxy.endpoint, "MODELYARD_HOME": str(tmp_path)}
    etag = get_hf_file_metadata(hf_hub_url("org/big", "model.safetensors", revision=head, endpoint=hub["endpoint"]),
                                token=False).etag
    blobs = tmp_path / ".cache" / "hf" / "models--org--big" / "blobs"
    blobs.mkdir(parents=True)
    (blobs / f"{etag}.incomplete").write_bytes(b"\xff" * (1 << 20))
    proxy.ranges = True
    try:
        first = len(proxy.requests)
        r = run_cli("ingest", "hf://org/big@main", "--no-smoke", env=env)
        assert r.returncode == 0, r.stderr[-2000:]
        gets = [rng for m, p, rng in proxy.requests[first:] if m == "GET" and p.endswith("/model.safetensors")]
        n = int.from_bytes(weights[:8], "little")  # the header, read by range before any weight byte
        assert gets == ["bytes=0-7", f"bytes=8-{8 + n - 1}", f"bytes={1 << 20}-", None]
        assert "proxy in between" not in r.stderr
        assert _blobs(tmp_path, "org/big") == sorted(n for n in _blobs(tmp_path, "org/big") if "." not in n)
        assert not (blobs / f"{etag}.incomplete").exists()
        assert (blobs / etag).read_bytes() == weights
    finally:
        proxy.ranges = False


def test_the_users_own_hub_cache_is_reused_not_downloaded_again(hub, tmp_path):
    """A model the user already has in ~/.cache/huggingface (HF_HUB_CACHE) is copied from there and hashed on
    the way against the hub's listing: no file body is downloaded again, the user's cache is left as it was,
    and a blob there with other bytes is refused like a corrupt download."""
    from huggingface_hub import snapshot_download

    proxy, head = hub["proxy"], hub["shas"][-1]
    user = tmp_path / "user-hf-cache"
    snapshot_download("org/tiny", revision=head, cache_dir=str(user), endpoint=hub["endpoint"], token=False)
    before = {p: p.stat().st_mtime_ns for p in user.rglob("*") if p.is_file()}
    env = {"HF_ENDPOINT": proxy.endpoint, "MODELYARD_HOME": str(tmp_path / "store"), "HF_HUB_CACHE": str(user)}
    first = len(proxy.requests)
    r = run_cli("ingest", "hf://org/tiny@main", "--no-smoke", "--json", env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    out = json_result(r.stdout, "ingest")
    assert [p for m, p, _ in proxy.requests[first:] if "/resolve/" in p] == []  # neither a HEAD nor a GET of a file
    assert out["hashed_bytes"] == 0  # every file was hashed while it was copied, none read back
    w = hub["files"]["model.safetensors"]
    assert (Path(out["artifact"]) / "model" / "model.safetensors").read_bytes() == w
    assert {p: p.stat().st_mtime_ns for p in user.rglob("*") if p.is_file()} == before
    # a user's blob with a flipped byte: the hub's sha256 refuses it, nothing is stored
    blob = (user / "models--org--tiny" / "snapshots" / head / "model.safetensors").resolve()
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.chmod(0o644)
    blob.write_bytes(bytes(data))
    env["MODELYARD_HOME"] = str(tmp_path / "store2")
    bad = run_cli("ingest", "hf://org/tiny@main", "--no-smoke", env=env)
    assert bad.returncode == 1 and f"model.safetensors: expected sha256 {hashlib.sha256(w).hexdigest()}" in bad.stderr
    assert store_artifacts(tmp_path / "store2") == []


def test_a_gated_repo_without_access_is_named_so_at_the_first_request(hub, tmp_path):
    proxy = hub["proxy"]
    proxy.gated = {"org/tiny"}
    try:
        first = len(proxy.requests)
        env = {**_env(hub, tmp_path), "HF_ENDPOINT": proxy.endpoint, "HF_TOKEN": "", "MODELYARD_HF_TOKEN": ""}
        r = run_cli("verify", "hf://org/tiny@main", "--json", env=env)
        err = json_error(r.stdout, "verify", 2)
        assert err["type"] == "SourceNotFoundError"
        assert err["message"] == (f"repository org/tiny on {proxy.endpoint} is gated and no token was sent "
                                  "(MODELYARD_HF_TOKEN / HF_TOKEN unset)")
        assert err["fix"] == (f"Accept its conditions on the repo's page ({proxy.endpoint}/org/tiny) with your account, "
                              "then set MODELYARD_HF_TOKEN to a token of that account.")
        assert proxy.requests[first:] == [("GET", "/api/models/org/tiny/revision/main", None)]
        r = run_cli("verify", "hf://org/tiny@main", "--json", env={**env, "MODELYARD_HF_TOKEN": "hf_no_access_to_it"})
        err = json_error(r.stdout, "verify", 2)
        assert err["message"] == f"repository org/tiny on {proxy.endpoint} is gated and this token has no access to it"
        assert "hf_no_access_to_it" not in r.stdout + r.stderr
    finally:
        proxy.gated = set()


def _weight_gets(proxy, first: int, repo: str) -> list[str | None]:
    """The Range header of every GET of ``repo``'s model.safetensors since request ``first`` (None: no Range)."""
    return [rng for m, p, rng in proxy.requests[first:] if m == "GET" and p.startswith(f"/{repo}/")
            and p.endswith("/model.safetensors")]


def _header_ranges(shard: bytes) -> list[str]:
    """The two reads of a safetensors header: its 8-byte length, then the JSON header."""
    return ["bytes=0-7", f"bytes=8-{8 + int.from_bytes(shard[:8], 'little') - 1}"]


def test_a_refused_card_license_stops_before_any_weight_byte_and_an_accepted_one_is_signed_in(hub, tmp_path):
    """--refuse-license reads the card's front matter (README.md, not taken into model/) before the weights: refused
    by the CLI's preflight, nothing of the shard is read, not even its header. Accepted, the license is in the manifest's and the signed
    report's source record."""
    proxy = hub["proxy"]
    proxy.ranges = True
    try:
        env = {"HF_ENDPOINT": proxy.endpoint, "MODELYARD_HOME": str(tmp_path)}
        first = len(proxy.requests)
        r = run_cli("ingest", "hf://org/carded@main", "--no-smoke", "--json", "--refuse-license", "unknown",
                    "--refuse-license", "CC-BY-NC-4.0", env=env)
        err = json_error(r.stdout, "ingest", 1)
        assert err["type"] == "VerificationFailedError"
        assert err["message"].endswith(": the model card (README.md) says license: cc-by-nc-4.0, which "
                                       "--refuse-license refuses")
        assert _weight_gets(proxy, first, "org/carded") == []  # refused by the preflight: not even a header read
        assert store_artifacts(tmp_path) == []
        r = run_cli("ingest", "hf://org/carded@main", "--no-smoke", "--json", "--refuse-license", "unknown", env=env)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        (art,) = store_artifacts(tmp_path)
        manifest = json.loads((art / "manifest.json").read_text())
        assert manifest["source"]["license"] == "cc-by-nc-4.0"
        assert json.loads((art / "report.json").read_text())["source"]["license"] == "cc-by-nc-4.0"
        assert "README.md" not in {f["path"] for f in manifest["files"]}
    finally:
        proxy.ranges = False


def test_verify_hf_refuses_a_card_license_and_plans_the_gpu_from_headers_only(hub, tmp_path):
    """`verify hf://... --refuse-license/--gpu`: the preflight ingest makes before its first weight byte, asked
    alone. The only reads of the shard are its header's ranges; an accepted card's license is in the report's
    source record."""
    proxy = hub["proxy"]
    proxy.ranges = True
    try:
        env = {"HF_ENDPOINT": proxy.endpoint, "MODELYARD_HOME": str(tmp_path)}
        first = len(proxy.requests)
        r = run_cli("verify", "hf://org/carded@main", "--json", "--refuse-license", "cc-by-nc-4.0", env=env)
        err = json_error(r.stdout, "verify", 1)
        assert err["message"] == ("hf://org/carded@main: the model card (README.md) says license: cc-by-nc-4.0, "
                                  "which --refuse-license refuses")
        assert _weight_gets(proxy, first, "org/carded") == _header_ranges(hub["files"]["model.safetensors"])
        r = run_cli("verify", "hf://org/spaced@main", "--json", "--refuse-license", "cc-by-nc-4.0", env=env)
        assert json_error(r.stdout, "verify", 1)["message"] == (
            "hf://org/spaced@main: the model card (README.md) says license: cc-by-nc-4.0, which --refuse-license refuses")
        r = run_cli("verify", "hf://org/carded@main", "--json", "--refuse-license", "unknown", "--gpu", "L4-24GB",
                    env=env)
        report = json_result(r.stdout, "verify")
        assert (report["summary"]["errors"], report["source"]["license"]) == (0, "cc-by-nc-4.0")
        r = run_cli("verify", "hf://org/carded@main", "--json", "--gpu", "L4-24GB", "--max-model-len", "1000000",
                    env=env)
        assert json_error(r.stdout, "verify", 2)["type"] == "InvalidTargetError"  # above the model's own limit
    finally:
        proxy.ranges = False


def test_a_download_the_disk_cannot_hold_is_refused_before_the_first_weight_byte(hub, tmp_path, small_fs):
    """A 24 MB shard into an 8 MiB store: refused after the headers were judged, naming the folder and the bytes,
    with no weight request and nothing left in the hub cache's blobs/ but the small files."""
    proxy = hub["proxy"]
    home = small_fs / "store"
    first = len(proxy.requests)
    r = run_cli("ingest", "hf://org/big@main", "--no-smoke", "--json",
                env={"HF_ENDPOINT": proxy.endpoint, "MODELYARD_HOME": str(home)})
    err = json_error(r.stdout, "ingest", 2)
    size = len(hub["big"]["model.safetensors"])
    blobs = home / ".cache" / "hf" / "models--org--big" / "blobs"
    assert err["type"] == "InsufficientResourcesError"
    assert err["message"].startswith(f"{blobs} has ")
    assert err["message"].endswith(f" bytes free; this run needs {size:,} there "
                                   f"(downloading 1 weight file(s) of org/big {size:,} bytes)")
    assert err["fix"].startswith("Free ") and "point MODELYARD_HOME (or --out) at a larger one" in err["fix"]
    assert _weight_gets(proxy, first, "org/big") == _header_ranges(hub["big"]["model.safetensors"])
    assert sorted(p.stat().st_size for p in blobs.iterdir()) == sorted(
        len(v) for k, v in hub["big"].items() if k != "model.safetensors")
