"""Snapshot: a local read-only model folder plus its provenance (docs/architecture.md).

For each file: size and SHA256 (filled by the hashing stage) and what the source promised
(``expected_sha256`` from the hub's LFS metadata, ``expected_git_oid`` for non-LFS files).
"""

from __future__ import annotations

from dataclasses import dataclass, field
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

    @property
    def origin(self) -> str:
        """Where the trusted digest comes from: ``hub-lfs``, ``hub-git``, ``computed``, ``patched`` or the producing stage."""
        if self.made_by:
            return self.made_by
        if self.patched:
            return "patched"
        if self.expected_sha256:
            return "hub-lfs"
        if self.expected_git_oid:
            return "hub-git"
        return "computed"


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

    def file(self, rel: str) -> FileEntry:
        for f in self.files:
            if f.path == rel:
                return f
        raise KeyError(rel)

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)
