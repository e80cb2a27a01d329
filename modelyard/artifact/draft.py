"""draft: assemble the artifact folder (:mod:`modelyard.artifact.layout`) in a staging folder.

``model/`` receives the snapshot's files, read-only: hard-linked from modelyard's own caches (no
bytes copied), copied from a user's folder (the source is never modified, not even its mode). Patched files are then
replaced by rename (:func:`modelyard.model.patchplan.apply_plan`), which never writes through a link. ``report.json``,
``report.md`` and ``manifest.json`` are written by :func:`write_metadata` once the smoke result is known.
:class:`Draft` is the one way the ingest flow writes an artifact: a staging folder every stage writes
through, committed into the :class:`~modelyard.artifact.store.Store` with one rename.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from modelyard import progress
from modelyard.artifact.layout import (
    MANIFEST,
    MODEL_DIR,
    PATCH_DIFF,
    PATCHES,
    QUANTIZATION,
    RECIPE,
    REPORT_JSON,
    REPORT_MD,
)
from modelyard.artifact.store import Artifact, StoreProtocol
from modelyard.checks import Report
from modelyard.errors import StoreError
from modelyard.model.digest import copy_with_digest, hash_snapshot
from modelyard.model.patchplan import apply_plan
from modelyard.model.snapshot import FileEntry, Snapshot

if TYPE_CHECKING:
    from modelyard.artifact.manifest import Manifest
    from modelyard.model.patchplan import PatchPlan


def stage_model(snapshot: Snapshot, staging: Path, link_from: tuple[Path, ...] = (),
                precopied: Path | None = None) -> Path:
    """Place the snapshot's (hashed) files into ``staging/model``, read-only; returns that folder.

    A file copied while it was hashed (``precopied/<path>``, see
    :func:`modelyard.model.digest.hash_snapshot_counted`) is moved in (no byte read). A file is
    hard-linked (no bytes copied) when it lies under one of ``link_from`` (modelyard's own download and
    conversion caches) and the link succeeds (same filesystem); otherwise it is copied, hashing the
    bytes copied against the snapshot's sha256. A user's file is always copied: through a link,
    making the artifact read-only (or a later edit of it) would change the source. Raises
    :class:`StoreError` on a filesystem error (e.g. disk full), :class:`HashMismatchError` when a
    file changed after it was hashed."""

    model = staging / MODEL_DIR
    roots = tuple(r.resolve() for r in link_from)
    try:
        with progress.task("packaging model/", total=snapshot.total_bytes) as adv:
            for f in snapshot.files:
                dst = model / f.path
                dst.parent.mkdir(parents=True, exist_ok=True)
                src = (snapshot.root / f.path).resolve()  # follows hub-cache symlinks to the blob
                pre = precopied / f.path if precopied is not None else None
                if pre is not None and pre.is_file() and not pre.is_symlink():
                    os.replace(pre, dst)
                elif not _link(src, dst, roots):
                    copy_with_digest(src, dst, f.sha256)
                adv(f.size)
    except StoreError:
        raise
    except OSError as exc:
        raise StoreError(f"cannot write {model}: {exc.strerror}", fix="Free disk space under MODELYARD_HOME.") from exc
    return model


def _link(src: Path, dst: Path, roots: tuple[Path, ...]) -> bool:
    """Hard-link ``src`` to ``dst`` when that is safe (see :func:`stage_model`); True when linked."""
    if not any(src.is_relative_to(r) for r in roots):
        return False  # a user's file: a link would let an edit of the artifact reach the source
    try:
        os.link(src, dst)
    except OSError:  # another filesystem (EXDEV), a filesystem without links, ...
        return False
    os.chmod(dst, 0o444)  # our cache's blob: read-only is what it should be anyway
    return True


def write_metadata(staging: Path, manifest: Manifest, report: Report, report_json: bytes, title: str) -> None:
    """Write report.json, report.md and (last) manifest.json into ``staging``, each fsynced."""
    with progress.task("writing report and manifest", total=3, unit="files") as adv:
        _write(staging / REPORT_JSON, report_json)
        adv(1)
        _write(staging / REPORT_MD, report.to_markdown(title).encode())
        adv(1)
        _write(staging / MANIFEST, manifest.to_bytes())
        adv(1)


def _write(path: Path, data: bytes) -> None:
    try:
        with open(path, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as exc:
        raise StoreError(f"cannot write {path}: {exc.strerror}", fix="Free disk space under MODELYARD_HOME.") from exc


def patched_files(snapshot: Snapshot, plan: PatchPlan) -> tuple[FileEntry, ...]:
    """The artifact's ``model/`` entries: the snapshot's, with patched files' size and sha256
    replaced (``origin`` "patched") and created files added. Sizes in bytes."""
    out = {f.path: f for f in snapshot.files}
    for rel, data in plan.files.items():
        out[rel] = FileEntry(path=rel, size=len(data), sha256=hashlib.sha256(data).hexdigest(), patched=True,
                             original_sha256=plan.originals.get(rel))
    return tuple(sorted(out.values(), key=lambda f: f.path))


def write_patch_records(staging: Path, plan: PatchPlan, model: Path) -> None:
    """Apply ``plan`` to ``model`` (the staged copy) and write ``patches.json`` and ``patch.diff``
    beside it. Raises :class:`StoreError` on a filesystem error."""
    try:
        apply_plan(plan, model)
    except OSError as exc:
        raise StoreError(f"cannot write {model}: {exc.strerror}", fix="Free disk space under MODELYARD_HOME.") from exc
    _write(staging / PATCHES, plan.to_json())
    _write(staging / PATCH_DIFF, plan.diff.encode())


def quantized_files(model: Path) -> tuple[FileEntry, ...]:
    """Hash the quantized ``model`` folder: entries with size (bytes) and sha256, origin "quantized"."""

    entries = tuple(FileEntry(p.relative_to(model).as_posix(), p.stat().st_size, made_by="quantized")
                    for p in sorted(model.rglob("*")) if p.is_file())
    snap = hash_snapshot(Snapshot(root=model, source=str(model), kind="file", files=entries))
    for p in model.rglob("*"):
        if p.is_file():
            os.chmod(p, 0o444)
    return snap.files


def write_quantization_records(staging: Path, record: dict[str, Any]) -> None:
    """``quantization.json`` (the record) and ``recipe.yaml`` (the effective recipe) beside model/."""
    _write(staging / RECIPE, record["recipe"]["text"].encode())
    _write(staging / QUANTIZATION, (json.dumps(record, indent=2) + "\n").encode())


class Draft:
    """An artifact under construction: a private staging folder of ``store`` that every stage writes
    through, committed to ``<home>/<name>/<revision>`` with one rename (:meth:`commit`) or removed
    (leaving the ``with`` block, committed or not). ``model`` is ``<staging>/model``.

    Raises :class:`StoreError` when the staging folder cannot be made or written."""

    def __init__(self, store: StoreProtocol) -> None:
        self.store = store
        self.path = store.new_staging()
        self.model = self.path / MODEL_DIR

    def __enter__(self) -> Draft:
        return self

    def __exit__(self, *exc: object) -> None:
        self.discard()

    def discard(self) -> None:
        """Remove the staging folder (a no-op once committed: it was renamed into the store)."""
        shutil.rmtree(self.path, ignore_errors=True)

    def add_model(self, snapshot: Snapshot, link_from: tuple[Path, ...] = (), precopied: Path | None = None) -> Path:
        """:func:`stage_model` into this draft; returns ``model/``."""
        return stage_model(snapshot, self.path, link_from=link_from, precopied=precopied)

    def add_patches(self, plan: PatchPlan) -> None:
        """Apply ``plan`` to ``model/`` and write ``patches.json`` and ``patch.diff`` (:func:`write_patch_records`)."""
        write_patch_records(self.path, plan, self.model)

    def replace_model(self, new_model: Path) -> tuple[FileEntry, ...]:
        """Swap ``model/`` for ``new_model`` (a folder inside this draft, e.g. a quantizer's output),
        read-only and hashed; returns its entries (sizes in bytes, sha256, origin "quantized")."""
        try:
            shutil.rmtree(self.model)
            new_model.rename(self.model)
        except OSError as exc:
            raise StoreError(f"cannot replace {self.model}: {exc.strerror}", fix="Free disk space under MODELYARD_HOME.") from exc
        return quantized_files(self.model)

    def add_quantization(self, record: dict[str, Any]) -> None:
        """``quantization.json`` and ``recipe.yaml`` (:func:`write_quantization_records`)."""
        write_quantization_records(self.path, record)

    def add_metadata(self, manifest: Manifest, report: Report, report_json: bytes, title: str) -> None:
        """``report.json``, ``report.md`` and, last, ``manifest.json`` (:func:`write_metadata`)."""
        write_metadata(self.path, manifest, report, report_json, title)

    def commit(self, name: str, revision: str, content_digest: str) -> Artifact:
        """Publish into the store (:meth:`Store.publish`): idempotent for equal content; raises
        :class:`~modelyard.errors.ArtifactConflictError` for different content at that place."""
        return self.store.publish(self.path, name, revision, content_digest)
