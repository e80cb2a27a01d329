"""hashing: SHA256 and size of every file, compared with what the source promised.

The whole-file SHA256 is the custody chain's identity (DESIGN.md): the hub's LFS sha256, the
manifest entry, the OCI layer digest. Non-LFS files on the hub are identified by their git blob
id, ``sha1(b"blob <size>\\0" + content)`` (git's object format). Files are hashed in a thread
pool (hashlib releases the GIL on large updates) with 4 MiB reads; each byte is read once and
feeds both digests when both are needed.
"""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

from modelyard import progress
from modelyard.errors import HashMismatchError
from modelyard.pipeline.snapshot import FileEntry, Snapshot

CHUNK = 4 * 1024 * 1024  # bytes per read


def _digest(path: Path, want_git: bool, advance=None) -> tuple[str, str | None, int]:  # noqa: ANN001
    size = os.stat(path).st_size
    h = hashlib.sha256()
    g = hashlib.sha1(f"blob {size}\0".encode()) if want_git else None
    n = 0
    with open(path, "rb", buffering=0) as fh:
        while chunk := fh.read(CHUNK):
            h.update(chunk)
            if g is not None:
                g.update(chunk)
            n += len(chunk)
            if advance is not None:
                advance(len(chunk))
    return h.hexdigest(), (g.hexdigest() if g else None), n


def sha256_file(path: Path, label: str | None = None) -> str:
    """SHA256 (hex) of ``path``, with a progress bar named ``label`` (bytes)."""
    with progress.task(label or f"hashing {path.name}", total=path.stat().st_size) as adv:
        return _digest(path, False, adv)[0]


def git_blob_id(data: bytes) -> str:
    """Git's blob object id of ``data`` (what the hub reports as ``blob_id`` for non-LFS files)."""
    return hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest()


def hash_snapshot(snapshot: Snapshot, workers: int | None = None) -> Snapshot:
    """Return ``snapshot`` with every ``FileEntry.sha256`` filled and checked.

    Raises :class:`HashMismatchError` listing every file whose size, LFS sha256 or git blob id
    differs from the source's promise (file, expected, actual).
    """
    workers = workers or min(8, (os.cpu_count() or 2) * 2)
    entries = snapshot.files
    out: list[FileEntry] = []
    problems: list[str] = []
    with progress.task("hashing (sha256)", total=sum(e.size for e in entries)) as adv:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            futs = [pool.submit(_digest, snapshot.root / e.path, e.expected_git_oid is not None, adv) for e in entries]
            for e, fut in zip(entries, futs):
                sha, git, n = fut.result()
                if e.expected_size is not None and n != e.expected_size:
                    problems.append(f"{e.path}: expected {e.expected_size} bytes, got {n}")
                if e.expected_sha256 and sha != e.expected_sha256:
                    problems.append(f"{e.path}: expected sha256 {e.expected_sha256}, got {sha}")
                if e.expected_git_oid and git != e.expected_git_oid:
                    problems.append(f"{e.path}: expected git blob {e.expected_git_oid}, got {git}")
                out.append(replace(e, sha256=sha, size=n))
    if problems:
        raise HashMismatchError(
            f"{len(problems)} file(s) differ from what {snapshot.source} promised: " + "; ".join(problems),
            fix="The download or cache is corrupt: delete the file from the cache (<home>/.cache/hf) and ingest again.")
    return replace(snapshot, files=tuple(out))


def tree_digest(files: tuple[FileEntry, ...]) -> str:
    """SHA256 over sorted ``path\\0size\\0sha256\\n`` lines: the content identity of a set of files."""
    h = hashlib.sha256()
    for f in sorted(files, key=lambda f: f.path):
        h.update(f"{f.path}\0{f.size}\0{f.sha256}\n".encode())
    return h.hexdigest()
