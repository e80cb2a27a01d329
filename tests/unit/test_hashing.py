import hashlib
import subprocess

import pytest

from modelyard.errors import HashMismatchError
from modelyard.pipeline.hashing import git_blob_id, hash_snapshot, tree_digest
from modelyard.pipeline.snapshot import FileEntry, Snapshot


def test_git_blob_id_matches_git(tmp_path):
    p = tmp_path / "f.json"
    p.write_bytes(b'{"a": 1}\n')
    want = subprocess.run(["git", "hash-object", str(p)], capture_output=True, text=True, check=True).stdout.strip()
    assert git_blob_id(p.read_bytes()) == want


def _snap(tmp_path, **exp):
    (tmp_path / "w.safetensors").write_bytes(b"x" * 5_000_000)  # > one 4 MiB read
    (tmp_path / "c.json").write_bytes(b"{}")
    files = (FileEntry("w.safetensors", 5_000_000, **exp.get("w", {})), FileEntry("c.json", 2, **exp.get("c", {})))
    return Snapshot(root=tmp_path, source="hf://o/r@main", kind="hf", files=files)


def test_hash_snapshot_fills_and_checks(tmp_path):
    w = hashlib.sha256(b"x" * 5_000_000).hexdigest()
    snap = hash_snapshot(_snap(tmp_path, w={"expected_sha256": w, "expected_size": 5_000_000},
                               c={"expected_git_oid": git_blob_id(b"{}")}))
    assert [(f.path, f.sha256, f.origin) for f in snap.files] == [
        ("w.safetensors", w, "hub-lfs"), ("c.json", hashlib.sha256(b"{}").hexdigest(), "hub-git")]


def test_hash_mismatch_names_file_and_digests(tmp_path):
    bad = "0" * 64
    with pytest.raises(HashMismatchError) as ei:
        hash_snapshot(_snap(tmp_path, w={"expected_sha256": bad}))
    actual = hashlib.sha256(b"x" * 5_000_000).hexdigest()
    assert f"w.safetensors: expected sha256 {bad}, got {actual}" in str(ei.value)
    assert ei.value.exit_code == 1


def test_tree_digest_order_independent():
    a = FileEntry("a", 1, sha256="1" * 64)
    b = FileEntry("b", 2, sha256="2" * 64)
    assert tree_digest((a, b)) == tree_digest((b, a))
    assert tree_digest((a, b)) == hashlib.sha256(f"a\0{1}\0{'1' * 64}\nb\0{2}\0{'2' * 64}\n".encode()).hexdigest()
