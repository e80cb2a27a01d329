"""A patch plan: the changes ``patch`` makes to a model's JSON files, as data.

``PatchOp`` names one change (file, RFC 6901 pointer, old, new, the finding it fixes, why);
``PatchPlan`` carries the ops with the patched files' new bytes, their original sha256 and the
unified diff; :func:`apply_plan` writes them into a copy. The planner lives in
:mod:`modelyard.stages.patch`; the artifact draft writes ``patches.json`` from :meth:`PatchPlan.to_json`.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class PatchOp:
    """One change: ``file`` (relative), ``pointer`` (RFC 6901; ``""`` = the whole file), ``old`` and
    ``new`` values (``old`` None when absent), the finding ``code`` it fixes and the ``reason``."""

    file: str
    pointer: str
    old: Any
    new: Any
    code: str
    reason: str


@dataclass(frozen=True)
class PatchPlan:
    """Ops plus the patched files' new bytes and their original sha256 (None for created files)."""

    ops: tuple[PatchOp, ...] = ()
    files: dict[str, bytes] = field(default_factory=dict)
    originals: dict[str, str | None] = field(default_factory=dict)
    diff: str = ""

    @property
    def empty(self) -> bool:
        return not self.ops

    @property
    def fixes(self) -> frozenset[str]:
        return frozenset(op.code for op in self.ops)

    def to_json(self) -> bytes:
        """``patches.json``: ``{schema_version, patches: [{file, pointer, old, new, code, reason}],
        files: [{path, original_sha256, sha256}]}``."""
        doc = {"schema_version": "1", "patches": [asdict(op) for op in self.ops],
               "files": [{"path": p, "original_sha256": self.originals.get(p),
                          "sha256": hashlib.sha256(b).hexdigest()} for p, b in sorted(self.files.items())]}
        return (json.dumps(doc, indent=2, ensure_ascii=False) + "\n").encode()

    @property
    def digest(self) -> str:
        """sha256 hex of :meth:`to_json`: identifies the patch set."""
        return hashlib.sha256(self.to_json()).hexdigest()


def apply_plan(plan: PatchPlan, model_dir: Path) -> None:
    """Write the plan's files into ``model_dir`` (a copy, never the source): each to a temp name,
    fsynced, then renamed over the entry, which also breaks any hard link to the source; read-only.
    Raises ``OSError`` on a filesystem error."""
    for rel, data in sorted(plan.files.items()):
        dst = model_dir / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_name(f".{dst.name}.modelyard-tmp")
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o444)
        os.replace(tmp, dst)
