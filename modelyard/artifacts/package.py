"""package: assemble the artifact folder of DESIGN.md in a staging folder.

``model/`` receives the snapshot's files (copied; the source is never modified, and a copy keeps
the artifact independent of the download cache), made read-only. ``report.json``, ``report.md``
and ``manifest.json`` are written by :func:`write_metadata` once the smoke result is known.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from modelyard import progress
from modelyard.checks import Report
from modelyard.errors import StoreError
from modelyard.pipeline.snapshot import Snapshot


def stage_model(snapshot: Snapshot, staging: Path) -> Path:
    """Copy the snapshot's files into ``staging/model`` (bytes); returns that folder.
    Raises :class:`StoreError` on a filesystem error (e.g. disk full)."""
    model = staging / "model"
    try:
        with progress.task("packaging model/", total=snapshot.total_bytes) as adv:
            for f in snapshot.files:
                dst = model / f.path
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(snapshot.root / f.path, dst)  # follows hub-cache symlinks to the blob
                os.chmod(dst, 0o444)
                adv(f.size)
    except OSError as exc:
        raise StoreError(f"cannot write {model}: {exc.strerror}", fix="Free disk space under MODELYARD_HOME.") from None
    return model


def write_metadata(staging: Path, manifest: dict[str, Any], report: Report, report_json: bytes, title: str) -> None:
    """Write report.json, report.md and (last) manifest.json into ``staging``, each fsynced."""
    _write(staging / "report.json", report_json)
    _write(staging / "report.md", report.to_markdown(title).encode())
    _write(staging / "manifest.json", (json.dumps(manifest, indent=2) + "\n").encode())


def _write(path: Path, data: bytes) -> None:
    try:
        with open(path, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as exc:
        raise StoreError(f"cannot write {path}: {exc.strerror}", fix="Free disk space under MODELYARD_HOME.") from None
