"""Bundles for air-gapped sites: bundle, unbundle (folder and HF cache), tar://."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from dataclasses import replace
from pathlib import Path

import pytest
import zstandard

from modelyard.artifact.index import dump_index
from modelyard.errors import BundleError
from modelyard.model.digest import git_blob_id, tree_digest
from modelyard.model.snapshot import FileEntry
from modelyard.settings import Settings
from modelyard.transport.hfcache import rehydrate
from modelyard.transport.refs import bundle_artifact, resolve_artifact
from modelyard.transport.unbundle import read_bundle, unbundle
from tests.conftest import json_error, json_result, run_cli

COMMIT = hashlib.sha1(b"tiny-commit").hexdigest()


def _build_artifact(model_dir: Path, home: Path, *, hub: bool) -> Path:
    """A real artifact through the stage functions (fetch, hash, verify, package, manifest, publish)."""
    from modelyard.artifact.draft import stage_model, write_metadata
    from modelyard.artifact.manifest import build_manifest, sign_claims, source_record
    from modelyard.artifact.store import Store
    from modelyard.model.digest import hash_snapshot
    from modelyard.model.source import parse_source
    from modelyard.settings import Settings
    from modelyard.stages.fetch import fetch
    from modelyard.stages.verify import verify_folder

    snap = hash_snapshot(fetch(parse_source(f"file://{model_dir}"), Settings(home=home)))
    if hub:  # as if fetched from hf://org/tiny@main: LFS sha256 for weights, git blob ids for the rest
        files = tuple(replace(f, expected_sha256=f.sha256) if f.path.endswith(".safetensors")
                      else replace(f, expected_git_oid=git_blob_id((model_dir / f.path).read_bytes())) for f in snap.files)
        snap = replace(snap, kind="hf", source="hf://org/tiny@main", repo_id="org/tiny", revision="main",
                       commit=COMMIT, files=files, provenance={"endpoint": "https://hub.example"})
    report = verify_folder(snap.root).with_source(source_record(snap))  # as the ingest writes it
    store = Store(home)
    staging = store.new_staging()
    stage_model(snap, staging)
    (staging / "serve").mkdir()
    (staging / "serve" / "vllm.yaml").write_text("model: ../model\nmax-model-len: 256\n")
    revision = COMMIT if hub else "sha256-" + tree_digest(snap.files)[:12]
    manifest, report, report_json = sign_claims(
        lambda rep, raw: build_manifest(name="tiny", revision=revision, snapshot=snap, report=rep, report_json=raw,
                                        smoke=None), report)
    write_metadata(staging, manifest, report, report_json, title="tiny")
    return store.publish(staging, "tiny", revision, manifest.content_digest).path


@pytest.fixture(scope="module")
def artifact(tiny_llama_dir, tmp_path_factory) -> Path:
    return _build_artifact(tiny_llama_dir, tmp_path_factory.mktemp("store"), hub=True)


def edited_artifact(artifact: Path, dst: Path) -> Path:
    """A copy of ``artifact`` edited as someone who holds the bundle could: ``model/config.json`` changed so that it
    fails verification (``num_key_value_heads`` 3 does not divide the attention heads), ``manifest.json``'s file
    digests and content digest recomputed, its "verification: passed" claim, revision and report kept."""
    shutil.copytree(artifact, dst)
    for p in [dst, *dst.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    cfg = json.loads((dst / "model" / "config.json").read_text())
    cfg["num_key_value_heads"] = 3
    (dst / "model" / "config.json").write_text(json.dumps(cfg, indent=2))
    m = json.loads((dst / "manifest.json").read_text())
    for f in m["files"]:
        data = (dst / f["path"]).read_bytes()
        f["sha256"], f["size"] = hashlib.sha256(data).hexdigest(), len(data)
    m["content_digest"] = "sha256:" + tree_digest(tuple(
        FileEntry(path=f["path"].removeprefix("model/"), size=f["size"], sha256=f["sha256"]) for f in m["files"]))
    (dst / "manifest.json").write_text(json.dumps(m, indent=2))
    assert m["verification"]["passed"] is True
    return dst


@pytest.fixture(scope="module")
def bundle(artifact, tmp_path_factory) -> Path:
    return bundle_artifact(artifact, tmp_path_factory.mktemp("bundle") / "tiny.tar.zst", settings=Settings()).path


def _tree(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _tar_bytes(bundle: Path) -> bytes:
    return zstandard.ZstdDecompressor().stream_reader(bundle.read_bytes()).read()


def _leftovers(parent: Path, keep: set[str]) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name not in keep)


# ---- bundle ------------------------------------------------------------------------------------------


def test_round_trip_is_bit_identical(artifact, bundle, tmp_path):
    out = tmp_path / "far" / "tiny"
    contents = unbundle(bundle, out)
    assert _tree(out) == _tree(artifact)
    assert "model/model.safetensors" in _tree(out) and "serve/vllm.yaml" in _tree(out)
    assert contents.manifest.content_digest == json.loads((artifact / "manifest.json").read_text())["content_digest"]
    assert _leftovers(out.parent, {"tiny"}) == []


def test_layout_manifest_first_fixed_metadata(bundle):
    with tarfile.open(fileobj=io.BytesIO(_tar_bytes(bundle))) as tf:
        members = tf.getmembers()
    names = [m.name for m in members]
    assert names[:2] == ["manifest.json", "bundle.json"]
    assert names[2:] == sorted(names[2:])
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname) for m in members} == {(0, 0, 0, "", "")}
    assert {m.mode for m in members if m.isfile()} == {0o644} and {m.mode for m in members if m.isdir()} == {0o755}
    assert all(m.isfile() or m.isdir() for m in members)
    meta = json.loads(tarfile.open(fileobj=io.BytesIO(_tar_bytes(bundle))).extractfile("bundle.json").read())
    assert {f["path"] for f in meta["files"]} == {"report.json", "report.md", "serve/vllm.yaml"}
    params = zstandard.get_frame_parameters(bundle.read_bytes())
    assert params.has_checksum


def test_bundle_is_deterministic(artifact, bundle, tmp_path):
    for p in artifact.rglob("*"):
        os.utime(p, (1_000_000, 1_000_000))  # timestamps do not matter
    again = bundle_artifact(artifact, tmp_path / "again.tar.zst", threads=1, settings=Settings()).path
    assert again.read_bytes() == bundle.read_bytes()
    assert _leftovers(tmp_path, {"again.tar.zst"}) == []


def test_bundle_from_store_reference(artifact, bundle, tmp_path):
    home = artifact.parents[1]
    res = bundle_artifact("tiny", tmp_path / "ref.tar.zst", home=home, settings=Settings())
    assert res.path.read_bytes() == bundle.read_bytes()
    assert bundle_artifact(f"tiny@{COMMIT}", tmp_path / "ref2.tar.zst", home=home, settings=Settings()).path.read_bytes() == bundle.read_bytes()
    with pytest.raises(BundleError, match="holds no artifact tiny@nope"):
        bundle_artifact("tiny@nope", tmp_path / "x.tar.zst", home=home, settings=Settings())


def test_a_folder_of_the_same_name_does_not_shadow_the_store(artifact, tmp_path, monkeypatch):
    """With --store, a bare NAME is the store's artifact even when the working directory holds a folder
    NAME/ (``./NAME`` names the folder); show and bom both read the store's."""
    from tests.conftest import json_result

    home = artifact.parents[1]
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "notes.txt").write_text("not an artifact\n")
    monkeypatch.chdir(tmp_path)
    assert resolve_artifact("tiny", home, settings=Settings()) == artifact
    assert resolve_artifact(f"tiny@{COMMIT[:8]}", home, settings=Settings()) == artifact
    with pytest.raises(BundleError, match="is not an artifact folder"):
        resolve_artifact("./tiny", home, settings=Settings())
    from typer.testing import CliRunner

    from modelyard.cli import app

    r = CliRunner().invoke(app, ["show", "tiny", "--store", str(home), "--json"])
    assert r.exit_code == 0, r.stdout
    assert json_result(r.stdout, "show")["path"] == str(artifact)
    r = CliRunner().invoke(app, ["bom", "tiny", "--store", str(home), "--json"])
    assert r.exit_code == 0, r.stdout
    from modelyard.artifact.bom import build_bom

    assert json_result(r.stdout, "bom")["bom"] == build_bom(artifact)  # deterministic: the store artifact's BOM


def test_bundle_refuses_an_artifact_that_changed(artifact, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(artifact, copy)
    cfg = copy / "model" / "config.json"
    cfg.chmod(0o644)
    data = bytearray(cfg.read_bytes())
    data[5] ^= 1
    cfg.write_bytes(bytes(data))
    with pytest.raises(BundleError, match=r"config.json: sha256 .* differs") as ei:
        bundle_artifact(copy, tmp_path / "out" / "x.tar.zst", settings=Settings())
    assert "modelyard verify" in ei.value.fix
    assert _leftovers(tmp_path / "out", set()) == []
    (copy / "model" / "stray.txt").write_text("x")
    with pytest.raises(BundleError, match="model/stray.txt is in model/ but not listed"):
        bundle_artifact(copy, tmp_path / "out" / "x.tar.zst", settings=Settings())


# ---- corruption -------------------------------------------------------------------------------------


@pytest.mark.parametrize("where", [0.02, 0.5, 0.97, -3])
def test_flipped_byte_in_compressed_stream_is_refused(bundle, tmp_path, where):
    data = bytearray(bundle.read_bytes())
    i = int(len(data) * where) if where > 0 else len(data) + where
    data[i] ^= 0x10
    bad = tmp_path / "bad.tar.zst"
    bad.write_bytes(bytes(data))
    with pytest.raises(BundleError) as ei:
        unbundle(bad, tmp_path / "out")
    msg = str(ei.value)
    assert "bad.tar.zst" in msg and ("corrupt" in msg or "zstd" in msg or "sha256" in msg or "tar" in msg), msg
    assert ei.value.fix
    assert _leftovers(tmp_path, {"bad.tar.zst"}) == []


def test_flipped_byte_in_a_file_names_the_file(bundle, tmp_path):
    tar = bytearray(_tar_bytes(bundle))
    with tarfile.open(fileobj=io.BytesIO(bytes(tar))) as tf:
        m = tf.getmember("model/model.safetensors")
    tar[m.offset_data + m.size // 2] ^= 0x01
    bad = tmp_path / "bad.tar.zst"
    bad.write_bytes(zstandard.ZstdCompressor(write_checksum=True).compress(bytes(tar)))
    with pytest.raises(BundleError, match=r"model/model.safetensors has sha256 [0-9a-f]{64}, the listing says"):
        unbundle(bad, tmp_path / "out")
    assert _leftovers(tmp_path, {"bad.tar.zst"}) == []
    # a hash mismatch is exit 1 on every source, tar:// included, as docs/reference/sources.md says; refused by the
    # CLI's preflight, before Prefect: with PREFECT_API_URL pointing at nothing, the refusal is still the bundle's
    r = run_cli("ingest", f"tar://{bad}", "--no-smoke", "--json", env={"MODELYARD_HOME": str(tmp_path / "home"),
                                                                       "PREFECT_API_URL": "http://127.0.0.1:9/api"},
                timeout=300)
    err = json_error(r.stdout, "ingest", 1)
    assert (r.returncode, err["type"]) == (1, "BundleHashMismatchError"), r.stderr[-2000:]
    assert "model/model.safetensors has sha256 " in err["message"]


def test_flipped_byte_in_report_is_caught(bundle, tmp_path):
    tar = bytearray(_tar_bytes(bundle))
    with tarfile.open(fileobj=io.BytesIO(bytes(tar))) as tf:
        m = tf.getmember("report.md")
    tar[m.offset_data] ^= 0x01
    bad = tmp_path / "bad.tar.zst"
    bad.write_bytes(zstandard.ZstdCompressor(write_checksum=True).compress(bytes(tar)))
    with pytest.raises(BundleError, match="report.md has sha256"):
        unbundle(bad, tmp_path / "out")


def test_truncated_bundle_is_refused(bundle, tmp_path):
    for cut in (4, len(bundle.read_bytes()) // 2):
        bad = tmp_path / "cut.tar.zst"
        bad.write_bytes(bundle.read_bytes()[:-cut])
        with pytest.raises(BundleError, match="truncated"):
            unbundle(bad, tmp_path / "out")
        assert _leftovers(tmp_path, {"cut.tar.zst"}) == []


# ---- malicious archives -----------------------------------------------------------------------------


def _member(name: str, data: bytes = b"", **kw) -> tuple[tarfile.TarInfo, bytes]:
    ti = tarfile.TarInfo(name)
    ti.size = len(data)
    for k, v in kw.items():
        setattr(ti, k, v)
    return ti, data


def _craft(path: Path, listed: dict[str, bytes], members: list, *, tail: bytes = b"",
           declared: dict[str, int] | None = None) -> Path:
    """A bundle whose manifest lists ``listed`` (model/ files) and whose tar holds ``members`` after the
    manifest and bundle.json. ``declared`` overrides listed sizes; ``tail`` is appended after the tar."""
    declared = declared or {}
    files = [{"path": p, "size": declared.get(p, len(d)), "sha256": hashlib.sha256(d).hexdigest(), "origin": "computed"}
             for p, d in sorted(listed.items())]
    entries = tuple(FileEntry(f["path"][len("model/"):], f["size"], f["sha256"]) for f in files)
    manifest = json.dumps({"name": "evil", "content_digest": "sha256:" + tree_digest(entries), "files": files,
                           "source": {"uri": "file:///x"}}).encode()
    meta = dump_index({"format": "modelyard-bundle", "version": 1, "files": [], "total_bytes": sum(f["size"] for f in files),
                      "manifest_sha256": hashlib.sha256(manifest).hexdigest()})
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for ti, data in [_member("manifest.json", manifest), _member("bundle.json", meta), *members]:
            if ti.size and len(data) < ti.size:  # a header that promises more than follows
                buf.write(ti.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape") + data)
                tf.offset = buf.tell()
                continue
            tf.addfile(ti, io.BytesIO(data) if ti.isfile() else None)
    cctx = zstandard.ZstdCompressor(write_checksum=True)
    path.write_bytes(cctx.compress(buf.getvalue() + tail))
    return path


GOOD = {"model/config.json": b'{"a": 1}'}


def test_crafted_baseline_extracts(tmp_path):
    b = _craft(tmp_path / "ok.tar.zst", GOOD, [_member("model", type=tarfile.DIRTYPE), _member("model/config.json", GOOD["model/config.json"])])
    unbundle(b, tmp_path / "out")
    assert (tmp_path / "out" / "model" / "config.json").read_bytes() == GOOD["model/config.json"]


CFG = _member("model/config.json", GOOD["model/config.json"])
EVIL = [
    ("dotdot", [CFG, _member("../evil.txt", b"pwned")], GOOD, "climbs out of the target"),
    ("dotdot-deep", [CFG, _member("model/../../evil.txt", b"pwned")], GOOD, "climbs out of the target"),
    ("absolute", [CFG, _member("{tmp}/evil.txt", b"pwned")], GOOD, "an absolute path"),
    ("symlink", [_member("model/link", type=tarfile.SYMTYPE, linkname="../../evil.txt"), CFG], GOOD, "a symbolic link"),
    ("hardlink", [CFG, _member("model/hl", type=tarfile.LNKTYPE, linkname="{tmp}/evil.txt")], GOOD, "a hard link"),
    ("chardev", [CFG, _member("model/null", type=tarfile.CHRTYPE, devmajor=1, devminor=3)], GOOD, "a character device"),
    ("fifo", [CFG, _member("model/fifo", type=tarfile.FIFOTYPE)], GOOD, "a FIFO"),
    ("duplicate", [CFG, CFG], GOOD, "a duplicate name"),
    ("duplicate-manifest", [_member("manifest.json", b"{}"), CFG], GOOD, "a duplicate name"),
    ("not-listed", [CFG, _member("model/extra.py", b"import os")], GOOD, "neither manifest.json nor bundle.json lists"),
    ("missing", [], GOOD, "1 listed file(s) missing from the bundle: model/config.json"),
    ("size-beyond-header", [_member("model/config.json", GOOD["model/config.json"], size=10**12)], GOOD,
     "1000000000000 bytes in the tar header, 8 in the listing"),
    ("wrong-content", [_member("model/config.json", b'{"a": 2}')], GOOD, "model/config.json has sha256"),
    ("stray-dir", [_member("etc", type=tarfile.DIRTYPE), CFG], GOOD, "a directory that holds no listed file"),
]


@pytest.mark.parametrize("case,members,listed,needle", EVIL, ids=[c[0] for c in EVIL])
def test_malicious_archive_is_refused(tmp_path, case, members, listed, needle):
    work = tmp_path / "work"
    work.mkdir()
    fixed = []
    for ti, data in members:
        ti = replace_name(ti, ti.name.replace("{tmp}", str(tmp_path)))
        if ti.linkname:
            ti.linkname = ti.linkname.replace("{tmp}", str(tmp_path))
        fixed.append((ti, data))
    b = _craft(work / "evil.tar.zst", listed, fixed)
    with pytest.raises(BundleError) as ei:
        unbundle(b, work / "out")
    assert needle.replace("{tmp}", str(tmp_path)) in str(ei.value)
    assert ei.value.fix
    assert ei.value.exit_code == (1 if case in {"size-beyond-header", "wrong-content"} else 2)  # bytes vs listing: 1
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["evil.tar.zst", "work"]  # nothing written anywhere


def replace_name(ti: tarfile.TarInfo, name: str) -> tarfile.TarInfo:
    new = tarfile.TarInfo(name)
    for k in ("size", "type", "linkname", "mode", "devmajor", "devminor"):
        setattr(new, k, getattr(ti, k))
    return new


def test_declared_size_far_beyond_the_data_is_a_bomb(tmp_path):
    """The manifest promises 2 GiB that a few hundred compressed bytes cannot hold: refused up front."""
    big = {"model/model.safetensors": b"\0" * 16}
    b = _craft(tmp_path / "bomb.tar.zst", big, [_member("model/model.safetensors", b"\0" * 16, size=2 << 30)],
               declared={"model/model.safetensors": 2 << 30})
    with pytest.raises(BundleError, match=r"declares \d+ bytes in \d+ compressed bytes .* decompression bomb"):
        unbundle(b, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_zstd_bomb_beyond_the_declared_total_is_refused(tmp_path):
    """A small, honest-looking tar followed by 256 MiB of zeros (a few KB compressed)."""
    b = _craft(tmp_path / "bomb.tar.zst", GOOD, [CFG], tail=b"\0" * (256 << 20))
    assert b.stat().st_size < 100_000
    with pytest.raises(BundleError, match=r"decompresses to more than \d+ bytes \(declared \d+ bytes.*decompression bomb"):
        unbundle(b, tmp_path / "out")
    assert _leftovers(tmp_path, {"bomb.tar.zst"}) == []


def test_trailing_garbage_and_not_zstd(bundle, tmp_path):
    bad = tmp_path / "tail.tar.zst"
    bad.write_bytes(bundle.read_bytes() + b"more")
    with pytest.raises(BundleError, match="trailing bytes after the last frame"):
        unbundle(bad, tmp_path / "out")
    plain = tmp_path / "plain.tar.zst"
    plain.write_bytes(_tar_bytes(bundle))
    with pytest.raises(BundleError, match="not zstd-compressed"):
        unbundle(plain, tmp_path / "out")


def test_existing_target_is_refused(bundle, tmp_path):
    (tmp_path / "out").mkdir()
    with pytest.raises(BundleError, match="already exists"):
        unbundle(bundle, tmp_path / "out")


# ---- Hugging Face cache -----------------------------------------------------------------------------


_LOAD = r"""
import hashlib, json, sys, torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
repo, rev = sys.argv[1], sys.argv[2]
cfg = AutoConfig.from_pretrained(repo, revision=rev)
tok = AutoTokenizer.from_pretrained(repo, revision=rev)
model = AutoModelForCausalLM.from_pretrained(repo, revision=rev)
h = hashlib.sha256()
for k, v in sorted(model.state_dict().items()):
    h.update(k.encode()); h.update(v.float().numpy().tobytes())
again = AutoModelForCausalLM.from_pretrained(repo)  # through refs/main
print(json.dumps({"type": cfg.model_type, "ids": tok("<|im_start|> w1 w2")["input_ids"], "weights": h.hexdigest(),
                  "same": all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))}))
"""


def _load(repo: str, rev: str, cache: Path | None, local: Path | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
    env.update(HF_HUB_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1", TRANSFORMERS_VERBOSITY="error")
    if cache is not None:
        env["HF_HUB_CACHE"] = str(cache)
    r = subprocess.run([sys.executable, "-c", _LOAD, str(local or repo), rev], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_rehydrated_cache_loads_offline_at_the_commit(artifact, bundle, tmp_path, tiny_llama_dir):
    cache = tmp_path / "hf"
    res = rehydrate(bundle, cache)
    assert (res.repo_id, res.commit, res.commit_synthesized) == ("org/tiny", COMMIT, False)
    repo = cache / "models--org--tiny"
    assert (repo / "refs" / "main").read_text() == COMMIT
    snap = repo / "snapshots" / COMMIT
    weights, cfg = snap / "model.safetensors", snap / "config.json"
    assert weights.is_symlink() and not os.path.isabs(os.readlink(weights))
    assert os.readlink(weights) == "../../blobs/" + hashlib.sha256(weights.read_bytes()).hexdigest()  # LFS: sha256
    assert os.readlink(cfg) == "../../blobs/" + git_blob_id(cfg.read_bytes())  # git file: blob sha1
    assert {p.name for p in snap.iterdir()} == {p.name for p in (artifact / "model").iterdir()}
    assert [p.name for p in cache.iterdir()] == ["models--org--tiny"]  # no temp folder left
    from huggingface_hub import scan_cache_dir

    info = scan_cache_dir(cache)
    assert [(r.repo_id, [rv.commit_hash for rv in r.revisions]) for r in info.repos] == [("org/tiny", [COMMIT])]
    assert rehydrate(bundle, cache).reused  # idempotent
    got = _load("org/tiny", COMMIT, cache)
    want = _load("", "main", None, local=tiny_llama_dir)
    assert got == want | {"same": True} and got["type"] == "llama"


def test_non_hub_artifact_needs_repo_id_and_gets_a_synthesized_commit(tiny_llama_dir, tmp_path):
    art = _build_artifact(tiny_llama_dir, tmp_path / "store", hub=False)
    b = bundle_artifact(art, tmp_path / "local.tar.zst", settings=Settings()).path
    with pytest.raises(BundleError, match="not a hub repo") as ei:
        rehydrate(b, tmp_path / "hf")
    assert "--repo-id" in ei.value.fix and not (tmp_path / "hf").exists()
    res = rehydrate(b, tmp_path / "hf", repo_id="acme/tiny-local")
    assert res.commit_synthesized and len(res.commit) == 40 and int(res.commit, 16) >= 0
    assert (tmp_path / "hf" / "models--acme--tiny-local" / "refs" / "main").read_text() == res.commit


def test_bad_bundle_leaves_hf_cache_untouched(bundle, tmp_path):
    tar = bytearray(_tar_bytes(bundle))
    with tarfile.open(fileobj=io.BytesIO(bytes(tar))) as tf:
        m = tf.getmember("serve/vllm.yaml")  # the last member: every model blob is staged before it fails
    tar[m.offset_data] ^= 0x01
    bad = tmp_path / "bad.tar.zst"
    bad.write_bytes(zstandard.ZstdCompressor(write_checksum=True).compress(bytes(tar)))
    (tmp_path / "hf").mkdir()
    with pytest.raises(BundleError, match="serve/vllm.yaml has sha256"):
        rehydrate(bad, tmp_path / "hf")
    assert list((tmp_path / "hf").iterdir()) == []


# ---- tar:// source and CLI --------------------------------------------------------------------------


def test_tar_source_fetches_with_the_manifest_digests(bundle, artifact, tmp_path):
    from modelyard.model.digest import hash_snapshot
    from modelyard.model.source import parse_source
    from modelyard.settings import Settings
    from modelyard.stages.fetch import fetch

    src = parse_source(f"tar://{bundle}")
    assert (src.kind, src.path, src.default_name) == ("tar", bundle, "tiny")
    settings = Settings(home=tmp_path / "home")
    snap = fetch(src, settings)
    manifest = json.loads((artifact / "manifest.json").read_text())
    assert {f"model/{f.path}": f.expected_sha256 for f in snap.files} == {f["path"]: f["sha256"] for f in manifest["files"]}
    # unsigned (or no key to check a signature with): the bundle's claims are its own word only
    assert (snap.repo_id, snap.commit, snap.kind) == ("org/tiny", None, "tar")
    assert (snap.provenance["bundle_signature"], snap.provenance["bundle_claimed_commit"]) == ("none", COMMIT)
    hashed = hash_snapshot(snap)
    assert {f.origin for f in hashed.files} == {"bundle"}
    assert fetch(src, settings).root == snap.root  # extracted once per content digest


def test_a_signed_bundle_keeps_its_commit_and_a_rewritten_one_does_not(artifact, tmp_path):
    """A bundle whose manifest was rewritten (other bytes, content digest recomputed) was ingested under the
    source's commit with the hub's origins: claims about other bytes. Only a signature that verifies with
    MODELYARD_SIGNING_PUBLIC_KEY lets the bundle's commit stand."""
    from modelyard.errors import SignatureError
    from modelyard.model.digest import hash_snapshot
    from modelyard.model.source import parse_source
    from modelyard.settings import Settings
    from modelyard.stages.fetch import fetch
    from modelyard.transport.signing import sign_artifact
    from tests.unit.test_signing import _keypair

    priv, pub = _keypair(tmp_path)
    signed = tmp_path / "signed"
    shutil.copytree(artifact, signed)
    sign_artifact(signed, private_key=priv)
    b = bundle_artifact(signed, tmp_path / "signed.tar.zst", settings=Settings()).path
    snap = fetch(parse_source(f"tar://{b}"), Settings(home=tmp_path / "h1", signing_public_key=pub))
    assert (snap.commit, snap.provenance["bundle_signature"]) == (COMMIT, "verified")
    assert {f.origin for f in hash_snapshot(snap).files} == {"hub-lfs", "hub-git"}
    unsigned = bundle_artifact(artifact, tmp_path / "unsigned.tar.zst", settings=Settings()).path
    with pytest.raises(SignatureError, match="the bundle is unsigned"):
        fetch(parse_source(f"tar://{unsigned}"), Settings(home=tmp_path / "h2", signing_public_key=pub))
    _, other = _keypair(tmp_path, "other")
    with pytest.raises(SignatureError):
        fetch(parse_source(f"tar://{b}"), Settings(home=tmp_path / "h3", signing_public_key=other))


def test_cli_bundle_unbundle_and_bad_input(artifact, tmp_path):
    r = run_cli("bundle", str(artifact), "-o", str(tmp_path / "a.tar.zst"), "--json", timeout=120)
    assert r.returncode == 0, r.stderr
    assert json_result(r.stdout, "bundle")["bytes_out"] == (tmp_path / "a.tar.zst").stat().st_size
    r = run_cli("unbundle", str(tmp_path / "a.tar.zst"), "--into", str(tmp_path / "x"), timeout=120)
    assert r.returncode == 0, r.stderr
    assert _tree(tmp_path / "x") == _tree(artifact)
    assert r.stdout.splitlines()[-1] == (f"signature: none: the bundle's claims (verification, revision, source) are its "
                                         f"own; `modelyard verify {tmp_path / 'x'}` judges the files again")
    evil = _craft(tmp_path / "evil.tar.zst", GOOD, [CFG, _member("../evil.txt", b"x")])
    r = run_cli("unbundle", str(evil), "--into", str(tmp_path / "y"), timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr + r.stdout
    assert "member '../evil.txt'" in r.stderr and "fix:" in r.stderr
    r = run_cli("unbundle", str(evil), timeout=120)
    assert r.returncode == 2 and "exactly one of -o/--output" in r.stderr


def test_unbundle_refuses_an_edited_bundle_whose_carried_verdict_its_files_fail(artifact, tmp_path):
    """An unsigned bundle edited after verification (config changed, digests recomputed, the old claims kept) has
    every byte matching its manifest; what gives it away is the carried "verification: passed" against files that
    fail the checks now. It is refused (exit 1), nothing kept; the genuine bundle still unbundles."""
    b = bundle_artifact(edited_artifact(artifact, tmp_path / "edited"), tmp_path / "edited.tar.zst", settings=Settings()).path
    r = run_cli("unbundle", str(b), "-o", str(tmp_path / "x"), "--json", timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr
    err = json_error(r.stdout, "unbundle", 1)
    assert err["type"] == "VerificationFailedError"
    rev = json.loads((artifact / "manifest.json").read_text())["revision"]
    assert err["message"].startswith(f"tiny@{rev}: its manifest says verification passed, but its model/ fails 2 "
                                     "check(s) now: [architecture.shape_mismatch] 4 tensor(s) have the wrong shape")
    assert "[parallelism.gqa_heads_not_divisible] num_attention_heads 4 is not a multiple of num_key_value_heads 3" \
        in err["message"]
    assert err["message"].endswith("the carried verdict does not belong to these files, so nothing was kept")
    assert not (tmp_path / "x").exists() and not list(tmp_path.glob(".x.unbundle-*"))


def test_read_bundle_hash_only(bundle):
    c = read_bundle(bundle, __import__("modelyard.transport.unbundle", fromlist=["Sink"]).Sink())
    assert "model/config.json" in c.files and c.declared_bytes > 0


def test_tar_ingest_takes_the_name_from_the_bundle_manifest(bundle, tmp_path):
    """A bundle renamed on the way to an air-gapped site (b.tar.zst) keeps the artifact's own name."""
    from modelyard.flows.ingest import ingest_flow
    from modelyard.flows.options import IngestOptions

    renamed = tmp_path / "b.tar.zst"
    shutil.copy(bundle, renamed)
    res = ingest_flow(f"tar://{renamed}", IngestOptions(smoke=False), str(tmp_path / "home"))
    assert (res.artifact.name, res.artifact.path.parent.name) == ("tiny", "tiny")
    named = ingest_flow(f"tar://{renamed}", IngestOptions(smoke=False, name="Other"), str(tmp_path / "home"))
    assert named.artifact.name == "other"


def test_bundle_over_an_existing_file_is_refused_unless_forced(artifact, tmp_path):
    out = tmp_path / "a.tar.zst"
    out.write_bytes(b"keep me")
    r = run_cli("bundle", str(artifact), "-o", str(out), timeout=120)
    assert (r.returncode, out.read_bytes()) == (2, b"keep me")
    assert f"error[bundle_invalid]: {out} already exists" in r.stderr and "--force" in r.stderr
    r = run_cli("bundle", str(artifact), "-o", str(out), "--force", "--json", timeout=120)
    assert r.returncode == 0, r.stderr
    assert json_result(r.stdout, "bundle")["bytes_out"] == out.stat().st_size


def test_an_unsigned_bundle_is_ingested_under_a_revision_derived_from_its_content(bundle, tmp_path):
    from modelyard.flows.ingest import ingest_flow
    from modelyard.flows.options import IngestOptions

    res = ingest_flow(f"tar://{bundle}", IngestOptions(smoke=False), str(tmp_path / "home"))
    m = json.loads((res.artifact.path / "manifest.json").read_text())
    assert res.artifact.revision == "sha256-" + m["content_digest"][7:19] and res.artifact.revision != COMMIT
    assert (m["source"]["commit"], m["source"]["bundle_claimed_commit"], m["source"]["bundle_signature"]) == (
        None, COMMIT, "none")
    assert {f["origin"] for f in m["files"]} == {"bundle"}


KILLED_WRITER = """
import os, signal, sys
from pathlib import Path
from modelyard.paths import open_partial
path, fh = open_partial(Path(sys.argv[1]), sys.argv[2])
fh.write(b"x" * 4096)
fh.flush()
print(path, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_the_next_bundle_sweeps_what_a_killed_one_left_and_spares_a_live_one(artifact, tmp_path):
    """A bundle writer SIGKILLed mid-write leaves its hidden ``.NAME.<rand>.partial`` (no clean-up runs); the next
    bundle to the same output removes it. A partial that a live writer holds locked, and one younger than the grace
    time, stay."""
    import time

    from modelyard.paths import PARTIAL_GRACE_S, open_partial

    out = tmp_path / "m.tar.zst"
    r = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(tmp_path), out.name], capture_output=True, text=True)
    assert r.returncode == -9, r.stderr
    dead = Path(r.stdout.strip())
    live, fh = open_partial(tmp_path, out.name)
    young = Path(subprocess.run([sys.executable, "-c", KILLED_WRITER, str(tmp_path), out.name], capture_output=True,
                                text=True).stdout.strip())
    old = time.time() - PARTIAL_GRACE_S - 5
    for p in (dead, live):
        os.utime(p, (old, old))
    try:
        bundle_artifact(str(artifact), out, settings=Settings())
        assert sorted(p.name for p in tmp_path.glob(".*.partial")) == sorted([live.name, young.name])
    finally:
        fh.close()
    os.utime(young, (old, old))
    bundle_artifact(str(artifact), out, force=True, settings=Settings())
    assert list(tmp_path.glob(".*.partial")) == [] and out.is_file()
