"""The artifact manifest (``manifest.json``), schema_version "1".

Keys: ``name``, ``revision``, ``content_digest`` (SHA256 over sorted ``path\\0size\\0sha256`` lines of
``model/``: the artifact's identity, independent of timestamps), ``created_at`` (UTC ISO-8601),
``source`` (uri, kind, repo_id, revision, commit, provenance), ``files`` (path, size in bytes,
sha256, origin of the trusted digest), ``target``, ``verification`` (summary + report sha256),
``smoke`` (vLLM result or null), ``tools`` (versions).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import importlib.metadata as md
import platform
from typing import TYPE_CHECKING, Any

from modelyard.checks import Report
from modelyard.model.digest import tree_digest
from modelyard.model.snapshot import FileEntry, Snapshot
from modelyard.version import __version__

if TYPE_CHECKING:
    from modelyard.model.patchplan import PatchPlan

SCHEMA_VERSION = "1"
_TOOLS = ("huggingface_hub", "safetensors", "transformers", "torch", "prefect", "gguf")


def tool_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"modelyard": __version__, "python": platform.python_version()}
    for dist in _TOOLS:
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            out[dist] = None
    return out


def build_manifest(*, name: str, revision: str, snapshot: Snapshot, report: Report, report_json: bytes,
                   smoke: dict[str, Any] | None, files: tuple[FileEntry, ...] | None = None,
                   plan: PatchPlan | None = None, quantization: dict[str, Any] | None = None,
                   serve: dict[str, Any] | None = None) -> dict[str, Any]:
    """The manifest dict. ``files`` are the artifact's ``model/`` entries (default: the snapshot's);
    a patched file lists its new ``sha256`` and its ``original_sha256``; ``patches`` holds the
    plan's ops (``patches.json``) and its digest; ``serve`` the serve plan that serve/ was written for."""
    files = sorted(files if files is not None else snapshot.files, key=lambda f: f.path)
    tools = tool_versions()
    if smoke and smoke.get("vllm_version"):
        tools["vllm"] = smoke["vllm_version"]
    return {
        "schema_version": SCHEMA_VERSION,
        "name": name,
        "revision": revision,
        "content_digest": "sha256:" + tree_digest(tuple(files)),
        "created_at": dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat(),
        "source": {"uri": snapshot.source, "kind": snapshot.kind, "repo_id": snapshot.repo_id,
                   "revision": snapshot.revision, "commit": snapshot.commit, **snapshot.provenance},
        "files": [{"path": f"model/{f.path}", "size": f.size, "sha256": f.sha256, "origin": f.origin,
                   **({"original_sha256": f.original_sha256} if f.patched else {})} for f in files],
        "patches": None if plan is None or plan.empty else {
            "count": len(plan.ops), "sha256": plan.digest,
            "ops": [{"file": o.file, "pointer": o.pointer, "old": o.old, "new": o.new, "code": o.code, "reason": o.reason}
                    for o in plan.ops]},
        "target": report.target.to_dict(),
        "verification": {"passed": report.passed, "errors": len(report.errors),
                         "warnings": sum(1 for f in report.findings if f.severity.value == "warning"),
                         "report_sha256": hashlib.sha256(report_json).hexdigest()},
        "quantization": None if quantization is None else {
            **{k: v for k, v in quantization.items() if k != "recipe"},
            "recipe": {k: v for k, v in quantization["recipe"].items() if k != "text"}},
        "smoke": smoke,
        "serve": serve,
        "tools": {**tools, **((quantization or {}).get("tools") or {})},
    }
