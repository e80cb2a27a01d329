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
import json
import os
import platform
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from modelyard.artifact.layout import MANIFEST
from modelyard.checks import Report
from modelyard.errors import ManifestError
from modelyard.model.digest import tree_digest
from modelyard.model.snapshot import FileEntry, Snapshot
from modelyard.version import __version__, library_versions

if TYPE_CHECKING:
    from modelyard.model.patchplan import PatchPlan

SCHEMA_VERSION = "1"
_TOOLS = ("huggingface_hub", "safetensors", "transformers", "torch", "prefect", "gguf")
#: the keys of a manifest, in the order ``manifest.json`` lists them
_KEYS = ("schema_version", "name", "revision", "content_digest", "created_at", "source", "files", "patches", "target",
         "verification", "quantization", "smoke", "serve", "tools")


@dataclass(frozen=True)
class ManifestFile:
    """One ``files[]`` entry: ``path`` (``model/...``), ``size`` in bytes, ``sha256`` (hex), ``origin``
    of the trusted digest (``hub-lfs``, ``computed``, ``patched``, ``quantized``, ...); a patched or
    created file also lists ``original_sha256`` (None for a created one)."""

    path: str
    size: int
    sha256: str
    origin: str | None = None
    patched: bool = False
    original_sha256: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"path": self.path, "size": self.size, "sha256": self.sha256, "origin": self.origin}
        if self.patched:
            d["original_sha256"] = self.original_sha256
        return d

    @classmethod
    def from_dict(cls, d: Any, where: str) -> ManifestFile:
        """Raises :class:`ManifestError` when ``d`` lacks a string ``path``/``sha256`` or an int ``size``."""
        if not (isinstance(d, dict) and isinstance(d.get("path"), str) and isinstance(d.get("sha256"), str)
                and isinstance(d.get("size"), int) and not isinstance(d.get("size"), bool)):
            raise ManifestError(f"{where}: files[] entry {d!r:.120} is not {{path, size, sha256}}",
                                fix="Re-create the artifact with `modelyard ingest`; manifest.json was edited or cut.")
        return cls(d["path"], d["size"], d["sha256"], d.get("origin"), "original_sha256" in d, d.get("original_sha256"))


@dataclass(frozen=True)
class Manifest:
    """``manifest.json``, typed. ``content_digest`` is ``"sha256:<hex>"`` over ``model/``'s sorted
    ``path\\0size\\0sha256`` lines; ``created_at`` UTC ISO-8601; ``source``, ``target``,
    ``verification``, ``smoke``, ``serve``, ``quantization``, ``patches`` and ``tools`` are the JSON
    objects their stages record (see the module docstring); ``extra`` keeps keys a later stage adds
    (``promotion``, ``promotions``) and keys of a newer writer, in order, so a round trip loses nothing.

    :meth:`to_bytes` is the one serializer (``json.dumps(indent=2)`` plus a newline);
    :meth:`from_bytes` / :meth:`load` the one parser."""

    name: str = ""
    revision: str = ""
    content_digest: str = ""
    created_at: str | None = None
    source: dict[str, Any] = field(default_factory=dict)
    files: tuple[ManifestFile, ...] = ()
    patches: dict[str, Any] | None = None
    target: dict[str, Any] = field(default_factory=dict)
    verification: dict[str, Any] = field(default_factory=dict)
    quantization: dict[str, Any] | None = None
    smoke: dict[str, Any] | None = None
    serve: dict[str, Any] | None = None
    tools: dict[str, Any] = field(default_factory=dict)
    schema_version: str = SCHEMA_VERSION
    extra: dict[str, Any] = field(default_factory=dict)
    present: frozenset[str] = frozenset(_KEYS)  # the keys the source document had (absent ones stay absent)

    # --- reading -------------------------------------------------------------------------------
    @property
    def scheme(self) -> str | None:
        """The quantization scheme (``w4a16``, ...), or None when not quantized."""
        return (self.quantization or {}).get("scheme")

    @property
    def model_bytes(self) -> int:
        """Bytes of ``model/`` as the manifest lists them."""
        return sum(f.size for f in self.files)

    @property
    def modified(self) -> bool:
        """True when ``model/`` differs from the source: patched or quantized."""
        return bool(self.patches or self.quantization)

    @property
    def verification_passed(self) -> bool:
        return bool(self.verification.get("passed"))

    # --- serializing ---------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k in _KEYS:
            if k not in self.present:
                continue
            v = getattr(self, k)
            out[k] = [f.to_dict() for f in v] if k == "files" else v
        out.update(self.extra)
        return out

    def to_bytes(self) -> bytes:
        return (json.dumps(self.to_dict(), indent=2) + "\n").encode()

    @classmethod
    def from_dict(cls, d: Any, where: str = MANIFEST) -> Manifest:
        """Raises :class:`ManifestError` (a ``ValueError``) when ``d`` is not a JSON object, or a
        key holds the wrong type (``files`` not a list of entries, ``source`` not an object, ...)."""
        if not isinstance(d, dict):
            raise ManifestError(f"{where} is not a JSON object",
                                fix="Re-create the artifact with `modelyard ingest`; manifest.json was edited or cut.")
        kw: dict[str, Any] = {}
        for k in _KEYS:
            if k not in d:
                continue
            v = d[k]
            if k == "files":
                if not isinstance(v, list):
                    raise ManifestError(f"{where}: files is {type(v).__name__}, not a list",
                                        fix="Re-create the artifact with `modelyard ingest`.")
                v = tuple(ManifestFile.from_dict(e, where) for e in v)
            elif k in ("source", "target", "verification", "tools", "patches", "quantization", "smoke", "serve"):
                if v is not None and not isinstance(v, dict):
                    raise ManifestError(f"{where}: {k} is {type(v).__name__}, not an object",
                                        fix="Re-create the artifact with `modelyard ingest`.")
                if v is None and k in ("source", "target", "verification", "tools"):
                    v = {}
            elif k in ("name", "revision", "content_digest", "schema_version"):
                v = "" if v is None else str(v)
            kw[k] = v
        extra = {k: v for k, v in d.items() if k not in _KEYS}
        return cls(**kw, extra=extra, present=frozenset(k for k in _KEYS if k in d))

    @classmethod
    def from_bytes(cls, data: bytes, where: str = MANIFEST) -> Manifest:
        """Parse ``manifest.json`` bytes; raises :class:`ManifestError` for bytes that are not JSON."""
        try:
            d = json.loads(data)
        except ValueError as exc:
            raise ManifestError(f"{where} is not valid JSON: {exc}",
                                fix="Re-create the artifact with `modelyard ingest`; manifest.json was edited or cut.") from exc
        return cls.from_dict(d, where)

    @classmethod
    def load(cls, artifact_dir: Path) -> Manifest:
        """Read ``artifact_dir/manifest.json``. Raises ``OSError`` when it cannot be read,
        :class:`ManifestError` when it is not a manifest."""
        path = Path(artifact_dir) / MANIFEST
        return cls.from_bytes(path.read_bytes(), str(path))

    def with_promotion(self, promotion: dict[str, Any]) -> Manifest:
        """This manifest with ``promotion`` set; an earlier promotion moves into ``promotions`` (the history)."""
        extra = dict(self.extra)
        if extra.get("promotion"):
            extra["promotions"] = [*(extra.get("promotions") or []), extra["promotion"]]
        extra["promotion"] = promotion
        return replace(self, extra=extra)

    def save(self, artifact_dir: Path) -> Path:
        """Write ``artifact_dir/manifest.json`` atomically (temp file, fsync, rename; mode 0644).
        Raises ``OSError`` on a filesystem error; the old file then stays as it was."""
        path = Path(artifact_dir) / MANIFEST
        fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(self.to_bytes())
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path


def tool_versions() -> dict[str, str | None]:
    """Versions of modelyard, Python and the libraries that shaped the artifact (None when absent)."""
    return {"modelyard": __version__, "python": platform.python_version(), **library_versions(_TOOLS)}


def build_manifest(*, name: str, revision: str, snapshot: Snapshot, report: Report, report_json: bytes,
                   smoke: dict[str, Any] | None, files: tuple[FileEntry, ...] | None = None,
                   plan: PatchPlan | None = None, quantization: dict[str, Any] | None = None,
                   serve: dict[str, Any] | None = None) -> Manifest:
    """The manifest. ``files`` are the artifact's ``model/`` entries (default: the snapshot's);
    a patched file lists its new ``sha256`` and its ``original_sha256``; ``patches`` holds the
    plan's ops (``patches.json``) and its digest; ``serve`` the serve plan that serve/ was written for."""
    files = sorted(files if files is not None else snapshot.files, key=lambda f: f.path)
    tools = tool_versions()
    if smoke and smoke.get("vllm_version"):
        tools["vllm"] = smoke["vllm_version"]
    return Manifest.from_dict({
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
    })
