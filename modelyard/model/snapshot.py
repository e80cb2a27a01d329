"""Snapshot: a local read-only model folder plus its provenance (docs/architecture.md).

For each file: size and SHA256 (filled by the hashing stage) and what the source promised
(``expected_sha256`` from the hub's LFS metadata, ``expected_git_oid`` for non-LFS files).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class FileEntry:
    """One file of a snapshot. ``path`` is relative POSIX; sizes in bytes; digests lower-case hex."""

    path: str
    size: int
    sha256: str | None = None
    expected_sha256: str | None = None
    expected_git_oid: str | None = None
    expected_size: int | None = None
    patched: bool = False
    original_sha256: str | None = None  # for a patched file: the source's sha256 (None when created)
    made_by: str | None = None  # a stage that produced the file (e.g. "quantized")
    #: the source listed the file without a digest it vouches for (a gated repo's redacted or missing hash):
    #: its sha256 is computed here and never compared, and its origin is ``unverified``
    unverifiable: bool = False
    #: ``sha256`` and ``size`` are those of the bytes received from the hub as they were written, already
    #: compared with the expected digests then: the hash stage does not read the file again
    received: bool = False

    @property
    def origin(self) -> str:
        """Where the trusted digest comes from: ``hub-lfs``, ``hub-git``, ``computed``, ``unverified`` (the
        hub could not vouch for it), ``patched`` or the producing stage."""
        if self.made_by:
            return self.made_by
        if self.patched:
            return "patched"
        if self.expected_sha256:
            return "hub-lfs"
        if self.expected_git_oid:
            return "hub-git"
        return "unverified" if self.unverifiable else "computed"


@dataclass(frozen=True)
class Snapshot:
    root: Path
    source: str
    kind: str
    files: tuple[FileEntry, ...]
    repo_id: str | None = None
    revision: str | None = None  # as requested (branch, tag or sha)
    commit: str | None = None  # resolved once, at fetch
    provenance: dict[str, Any] = field(default_factory=dict)
    #: the source's files that are not in ``files`` (not read by a runtime, or excluded): relative POSIX
    #: paths, sorted; the report names each one
    left_out: tuple[str, ...] = ()

    def file(self, rel: str) -> FileEntry:
        for f in self.files:
            if f.path == rel:
                return f
        raise KeyError(rel)

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def unverifiable(self) -> tuple[str, ...]:
        """Paths of the files whose digest the source could not vouch for (:attr:`FileEntry.unverifiable`)."""
        return tuple(f.path for f in self.files if f.unverifiable)

    def without_received(self) -> Snapshot:
        """This snapshot with the digests of the download stream dropped (``sha256`` None, ``received``
        False): for a fetch result reused from an earlier run, whose files may have changed since and
        must be hashed from disk."""
        return replace(self, files=tuple(replace(f, sha256=None, received=False) if f.received else f
                                         for f in self.files))


#: a file's identity on disk: (inode, size in bytes, mtime ns, ctime ns); the kernel moves ctime on every write
#: and on every change of mtime, so a file changed and restored still shows a new ctime
Fingerprint = tuple[int, int, int, int]


def fingerprints(snapshot: Snapshot) -> dict[str, Fingerprint | None]:
    """:data:`Fingerprint` of each file of ``snapshot`` (following links; None when it cannot be read)."""
    out: dict[str, Fingerprint | None] = {}
    for f in snapshot.files:
        try:
            st = (snapshot.root / f.path).stat()
            out[f.path] = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        except OSError:
            out[f.path] = None
    return out


def changed_since(snapshot: Snapshot, before: dict[str, Fingerprint | None]) -> list[str]:
    """The files of ``snapshot`` whose :data:`Fingerprint` is not ``before``'s, sorted."""
    now = fingerprints(snapshot)
    return sorted(p for p in before if now.get(p) != before[p])
