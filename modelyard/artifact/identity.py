"""An artifact's identity in the store: its revision name and whether a stored one can be reused.

Revision names: a hub snapshot keeps its commit sha (with ``-files-<8 hex>`` when the user chose
other files than the default selection); anything else is ``sha256-<12 hex>`` of its
``model/`` tree digest. A patched artifact is a variant of its source revision
(``<rev>-patched-<8 hex of the patch set>``), a quantized one too
(``<rev>-<scheme>-<8 hex of scheme, recipe, calibration and sizes>``).

Reuse: a stored artifact with the same content (or the same quantized variant, which is named by
everything that determines it) is reused instead of built again, unless a smoke test is asked for
that its stored smoke does not stand for (:func:`smoke_covers`).
"""

from __future__ import annotations

import hashlib

from modelyard.artifact.manifest import Manifest
from modelyard.artifact.records import SmokeRecord
from modelyard.artifact.store import Artifact, StoreProtocol
from modelyard.model.digest import tree_digest
from modelyard.model.snapshot import FileEntry

#: a stored smoke stands for the level asked for, or a lower one
SMOKE_LEVEL_RANK = {"load": 0, "server": 1, "bench": 2}


def source_revision(commit: str | None, files: tuple[FileEntry, ...], selection: tuple[str, ...] | None = None) -> str:
    """The hub ``commit`` (40 hex), else ``sha256-`` and the first 12 hex of the files' tree digest. A commit
    taken with a file selection of the user's own (``selection``: the selected paths, when they differ from
    the default selection, :func:`modelyard.stages.fetch.own_selection`) is ``<commit>-files-<8 hex>``, the
    first 8 hex of the sha256 of the sorted paths, one per line: the same commit with other files is other
    content, so it must not claim the same revision (the store would refuse it as a conflict after the run)."""
    if commit and selection is not None:
        return f"{commit}-files-{hashlib.sha256(chr(10).join(sorted(selection)).encode()).hexdigest()[:8]}"
    return commit or f"sha256-{tree_digest(files)[:12]}"


def variant_revision(revision: str, *, patch_digest: str | None = None, scheme: str | None = None,
                     variant_digest: str | None = None) -> str:
    """``revision`` with the patched (``-patched-<8>``) and quantized (``-<scheme>-<8>``) suffixes."""
    if patch_digest:
        revision = f"{revision}-patched-{patch_digest[:8]}"
    if scheme:
        revision = f"{revision}-{scheme}-{(variant_digest or '')[:8]}"
    return revision


def smoke_covers(prev: SmokeRecord | None, *, level: str, mode: str) -> bool:
    """Whether a stored artifact's smoke result ``prev`` stands for a smoke at ``level`` (load, server,
    bench) in serving ``mode``: it passed, at that level or a higher one, in that mode. A chat smoke
    also stands for a completion one (it loaded and generated, and passed the stricter stop rule); a
    completion smoke never stands for chat (it did not exercise the chat template). A result without
    ``mode`` was stored before modes were recorded, when every smoke chatted. A result without a passed
    numerical gate (``numeric``) was stored before the gate existed: it stands for nothing, so the smoke runs
    again (a model that answers garbage once passed every earlier gate)."""
    if prev is None or not prev.passed or SMOKE_LEVEL_RANK[prev.level_name] < SMOKE_LEVEL_RANK[level]:
        return False
    if not prev.numeric_passed:
        return False
    return (prev.mode or "chat") in (mode, "chat")


def find_reusable(store: StoreProtocol, name: str, revision: str, content_digest: str, *, variant: bool,
                  smoke_level: str | None, mode: str) -> tuple[Artifact, Manifest] | None:
    """The stored ``name@revision`` and its manifest when it can be reused: same ``content_digest``
    (or ``variant``, a quantized revision named by its inputs), and either no smoke asked for
    (``smoke_level`` None) or a stored smoke that covers it. Call it under ``store.lock``."""
    found = store.load(name, revision)
    if found is None:
        return None
    existing, prev = found
    if not (existing.content_digest == content_digest or variant):
        return None
    if smoke_level is not None and not smoke_covers(prev.smoke, level=smoke_level, mode=mode):
        return None
    return existing, prev
