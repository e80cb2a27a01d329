import hashlib
import os
import subprocess

import pytest

from modelyard.errors import HashMismatchError
from modelyard.model import digest as hashing
from modelyard.model.digest import DigestCache, file_digest, git_blob_id, hash_snapshot, tree_digest
from modelyard.model.snapshot import FileEntry, Snapshot


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


class _CountingOpen:
    """Stands in for ``open`` inside modelyard.model.digest and counts the bytes read from files."""

    def __init__(self):
        self.bytes = 0

    def __call__(self, *args, **kwargs):
        fh = open(*args, **kwargs)  # noqa: SIM115 - returned to the caller, which closes it
        counter = self
        real_read, real_readinto = fh.read, fh.readinto

        class _Fh:
            def __getattr__(self, name):
                return getattr(fh, name)

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                fh.close()

            def read(self, *a):
                data = real_read(*a)
                counter.bytes += len(data)
                return data

            def readinto(self, b):
                n = real_readinto(b)
                counter.bytes += n or 0
                return n

        return _Fh()


def _past(p, seconds=3600):
    t = p.stat().st_mtime - seconds
    os.utime(p, (t, t))


def test_digest_cache_second_hash_reads_nothing_and_touch_invalidates(tmp_path, monkeypatch):
    monkeypatch.setattr(hashing, "RACY_S", 0.0)  # the file was just written; its ctime is "now"
    p = tmp_path / "w.safetensors"
    data = os.urandom(5_000_000)
    p.write_bytes(data)
    _past(p)
    cache = DigestCache(tmp_path / "home" / ".cache" / "digests")
    reads = _CountingOpen()
    monkeypatch.setattr(hashing, "open", reads, raising=False)

    first = file_digest(p, git=True, cache=cache)
    assert (first.sha256, first.git_sha1, first.size) == (hashlib.sha256(data).hexdigest(), git_blob_id(data), len(data))
    assert not first.cached and reads.bytes == len(data)
    assert len(list(cache.folder.glob("*.json"))) == 1 and not list(cache.folder.glob(".tmp-*"))

    reads.bytes = 0
    second = file_digest(p, git=True, cache=cache)
    assert second.cached and second.bytes_read == 0 and reads.bytes == 0
    assert (second.sha256, second.git_sha1, second.size) == (first.sha256, first.git_sha1, first.size)

    os.utime(p)  # touch: a new mtime (and ctime) invalidates the entry
    reads.bytes = 0
    third = file_digest(p, git=True, cache=cache)
    assert not third.cached and reads.bytes == len(data) and third.sha256 == first.sha256


def test_digest_cache_not_fooled_by_restored_mtime(tmp_path, monkeypatch):
    monkeypatch.setattr(hashing, "RACY_S", 0.0)
    p = tmp_path / "c.json"
    p.write_bytes(b'{"a": 1}')
    _past(p)
    cache = DigestCache(tmp_path / "digests")
    before = file_digest(p, cache=cache)
    st = p.stat()
    with open(p, "r+b") as fh:  # same size, then the old mtime put back: only ctime tells
        fh.write(b'{"a": 2}')
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = file_digest(p, cache=cache)
    assert not after.cached and after.sha256 == hashlib.sha256(b'{"a": 2}').hexdigest() != before.sha256


def test_digest_cache_skips_racy_files_and_survives_corruption(tmp_path, monkeypatch):
    p = tmp_path / "f.bin"
    p.write_bytes(b"x" * 10)  # just written: within RACY_S, so hashed but not remembered
    cache = DigestCache(tmp_path / "digests")
    assert not file_digest(p, cache=cache).cached
    assert not file_digest(p, cache=cache).cached
    assert not cache.folder.exists() or not list(cache.folder.iterdir())
    monkeypatch.setattr(hashing, "RACY_S", 0.0)
    file_digest(p, cache=cache)
    (entry,) = cache.folder.glob("*.json")
    entry.write_text("{not json")
    d = file_digest(p, cache=cache)
    assert not d.cached and d.sha256 == hashlib.sha256(b"x" * 10).hexdigest()
    assert file_digest(p, git=True, cache=cache).git_sha1 == git_blob_id(b"x" * 10)  # entry lacked git: re-read
    assert file_digest(p, git=True, cache=cache).cached


def test_hash_snapshot_uses_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(hashing, "RACY_S", 0.0)
    snap = _snap(tmp_path, c={"expected_git_oid": git_blob_id(b"{}")})
    cache = DigestCache(tmp_path / "digests")
    first = hash_snapshot(snap, cache=cache)
    reads = _CountingOpen()
    monkeypatch.setattr(hashing, "open", reads, raising=False)
    assert hash_snapshot(snap, cache=cache) == first and reads.bytes == 0


def test_hash_while_copying_reads_each_byte_once_and_packaging_moves_the_copy(tmp_path):
    """Issue 9: a user's files are copied while hashed (the copy is exactly the bytes hashed);
    files under a linkable cache are not copied; stage_model moves the copies (no byte read)."""
    from modelyard.artifact.draft import stage_model

    src, cache_dir, pre, staging = (tmp_path / n for n in ("src", "cache", "pre", "staging"))
    src.mkdir(), cache_dir.mkdir(), staging.mkdir()
    snap = _snap(src)
    (cache_dir / "blob").write_bytes(b"cached")
    (src / "t.json").symlink_to(cache_dir / "blob")  # like a hub snapshot's symlink into our cache
    snap = Snapshot(root=src, source=snap.source, kind="file", files=(*snap.files, FileEntry("t.json", 6)))
    hashed, read = hashing.hash_snapshot_counted(snap, copy_to=pre, link_from=(cache_dir,))
    assert read == 5_000_000 + 2 + 6
    assert sorted(p.name for p in pre.iterdir()) == ["c.json", "w.safetensors"]
    assert (pre / "w.safetensors").read_bytes() == b"x" * 5_000_000 and (pre / "c.json").stat().st_mode & 0o777 == 0o444
    ino = (pre / "w.safetensors").stat().st_ino
    model = stage_model(hashed, staging, link_from=(cache_dir,), precopied=pre)
    assert (model / "w.safetensors").stat().st_ino == ino  # moved, not read again
    assert (model / "t.json").stat().st_ino == (cache_dir / "blob").stat().st_ino  # hard-linked from the cache
    assert list(pre.iterdir()) == []


def test_packaging_copy_refuses_a_file_changed_after_hashing(tmp_path):
    from modelyard.artifact.draft import stage_model

    src, staging = tmp_path / "src", tmp_path / "staging"
    src.mkdir(), staging.mkdir()
    hashed = hash_snapshot(_snap(src))
    (src / "w.safetensors").write_bytes(b"y" * 5_000_000)  # same size, other bytes
    with pytest.raises(HashMismatchError, match="w.safetensors changed after it was hashed"):
        stage_model(hashed, staging)
    assert not (staging / "model" / "w.safetensors").exists()


def test_copy_into_a_full_disk_is_a_store_error(tmp_path, monkeypatch):
    from modelyard.errors import StoreError

    (tmp_path / "a").write_bytes(b"abc")

    def full(fd, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(hashing.os, "write", full)
    with pytest.raises(StoreError, match="No space left on device"):
        hashing.copy_with_digest(tmp_path / "a", tmp_path / "b")


def test_digest_writer_hashes_what_it_writes_and_restarts_at_zero(tmp_path):
    """The download stream's digests are those of the bytes written; when a server ignores a resume
    Range, huggingface_hub's http_get seeks back to 0 and truncates: the digests restart with it."""
    data = b"{" + b"a" * 9_999 + b"}"
    seen = []
    with open(tmp_path / "f", "wb") as fh:
        w = hashing.DigestWriter(fh, git_size=len(data), advance=seen.append)
        w.write(b"garbage a broken connection left there")
        assert w.tell() == 38
        w.seek(max(w.tell() - 38, 0))
        w.truncate()
        for i in range(0, len(data), 4096):
            w.write(data[i:i + 4096])
        with pytest.raises(OSError):
            w.seek(5)
    d = w.digest()
    assert (d.sha256, d.git_sha1, d.size, d.bytes_read) == (hashlib.sha256(data).hexdigest(), git_blob_id(data), 10_001, 0)
    assert (tmp_path / "f").read_bytes() == data
    assert seen == [38, 4096, 4096, 1809]


def test_a_resumed_download_hashes_the_partial_file_then_appends(tmp_path):
    """absorb(): the bytes a killed download left are read once into the digests and the rest is appended;
    a server that ignores Range (200) makes http_get seek back to 0: the digests restart there."""
    data = bytes(range(256)) * 100
    (tmp_path / "f").write_bytes(data[:9_000])
    seen = []
    with open(tmp_path / "f", "r+b") as fh:
        w = hashing.DigestWriter(fh, git_size=len(data), advance=seen.append)
        assert w.absorb(chunk_bytes=4096) == 9_000 and w.tell() == 9_000
        w.write(data[9_000:])
    d = w.digest()
    assert (d.sha256, d.git_sha1, d.size) == (hashlib.sha256(data).hexdigest(), git_blob_id(data), 25_600)
    assert (tmp_path / "f").read_bytes() == data and seen == [4096, 4096, 808, 16_600]
    (tmp_path / "g").write_bytes(data[:100])
    with open(tmp_path / "g", "r+b") as fh:
        w = hashing.DigestWriter(fh)
        resumed = w.absorb()
        w.seek(max(w.tell() - resumed, 0))  # what http_get does when the answer is 200, not 206
        w.truncate()
        w.write(data)
    assert w.digest().sha256 == hashlib.sha256(data).hexdigest() and (tmp_path / "g").read_bytes() == data


def test_received_files_are_not_read_again(tmp_path):
    """A file hashed while it was downloaded (``received``) is not read by the hash stage; the others are."""
    w = hashlib.sha256(b"x" * 5_000_000).hexdigest()
    snap = _snap(tmp_path, w={"expected_sha256": w, "sha256": w, "received": True, "expected_size": 5_000_000})
    out, read = hashing.hash_snapshot_counted(snap)
    assert (read, out.file("w.safetensors").sha256, out.file("c.json").sha256) == (2, w, hashlib.sha256(b"{}").hexdigest())
    again, read = hashing.hash_snapshot_counted(snap.without_received())
    assert read == 5_000_002 and [f.sha256 for f in again.files] == [f.sha256 for f in out.files]


def test_unverifiable_files_are_hashed_never_compared(tmp_path):
    snap = hash_snapshot(_snap(tmp_path, w={"unverifiable": True, "expected_size": 5_000_000}))
    assert [(f.path, f.origin) for f in snap.files] == [("w.safetensors", "unverified"), ("c.json", "computed")]
    assert snap.unverifiable == ("w.safetensors",)
