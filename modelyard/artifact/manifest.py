"""The artifact manifest (``manifest.json``), schema_version "1".

Keys: ``name``, ``revision``, ``content_digest`` (SHA256 over sorted ``path\\0size\\0sha256`` lines of
``model/``: the artifact's identity, independent of timestamps), ``created_at`` (UTC ISO-8601),
``source`` (uri, kind, repo_id, revision, commit, provenance), ``files`` (path, size in bytes,
sha256, origin of the trusted digest), ``target``, ``verification`` (summary + report sha256),
``smoke`` (vLLM result or null), ``tools`` (versions).

A LoRA adapter artifact (:mod:`modelyard.flows.adapter`) adds ``kind: "lora"`` (absent: ``"model"``) and
``base`` (``name``, ``revision``, ``digest``: the base artifact it applies to); its ``model/`` holds the
adapter's files. Both keys are optional: a reader of schema_version 1 that ignores them still reads it.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import platform
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Literal

from pydantic import ConfigDict, Field

from modelyard.artifact.layout import MANIFEST
from modelyard.artifact.records import (
    BaseRecord,
    ClaimsRecord,
    FileRecord,
    PatchesRecord,
    PromotionRecord,
    QuantizationRecord,
    Record,
    ServePlanRecord,
    SmokeRecord,
    SourceRecord,
    TargetRecord,
    VerificationRecord,
    validate,
)
from modelyard.checks import Report
from modelyard.checks.report import replaced_files
from modelyard.errors import ManifestError
from modelyard.model.digest import tree_digest
from modelyard.model.snapshot import FileEntry, Snapshot
from modelyard.version import __version__, library_versions

if TYPE_CHECKING:
    from modelyard.model.patchplan import PatchPlan

SCHEMA_VERSION = "1"
_TOOLS = ("huggingface_hub", "safetensors", "transformers", "torch", "prefect", "gguf")
_FIX = "Re-create the artifact with `modelyard ingest`; manifest.json was edited or cut."


class Manifest(Record):
    """``manifest.json``, typed: every sub-record is a :mod:`~modelyard.artifact.records` model.
    ``content_digest`` is ``"sha256:<hex>"`` over ``model/``'s sorted ``path\\0size\\0sha256`` lines;
    ``created_at`` UTC ISO-8601; ``promotion`` the latest approval and ``promotions`` the earlier ones.
    Keys of a newer writer are kept, in order, so a round trip loses nothing; :attr:`present` lists the
    keys the stored document had (an absent key stays absent).

    :meth:`to_bytes` is the one serializer (``json.dumps(indent=2)`` plus a newline);
    :meth:`from_bytes` / :meth:`load` the one parser (``model_validate``)."""

    model_config = ConfigDict(json_schema_extra={
        "$id": "https://modelyard.dev/schemas/manifest/1.json", "title": "modelyard artifact manifest",
        "description": "schema_version 1. Additive changes (new optional keys) keep the version; removing or "
                       "retyping a key bumps it."})

    schema_version: str = SCHEMA_VERSION
    name: str = ""
    revision: str = ""
    content_digest: str = Field("", description="sha256:<hex> over model/'s sorted path\\0size\\0sha256 lines")
    created_at: str | None = Field(None, description="UTC ISO-8601")
    source: SourceRecord = SourceRecord()
    files: tuple[FileRecord, ...] = ()
    patches: PatchesRecord | None = None
    target: TargetRecord = TargetRecord()
    verification: VerificationRecord = VerificationRecord()
    quantization: QuantizationRecord | None = None
    smoke: SmokeRecord | None = None
    serve: ServePlanRecord | None = None
    tools: dict[str, str | None] = Field({}, description="versions of modelyard, Python and the libraries used")
    promotion: PromotionRecord | None = None
    promotions: tuple[PromotionRecord, ...] = ()
    kind: Literal["model", "lora"] = Field("model", description="what model/ holds: a model, or a LoRA adapter")
    base: BaseRecord | None = Field(None, description="for kind lora: the base artifact, by name, revision and digest")

    # --- reading -------------------------------------------------------------------------------
    @property
    def scheme(self) -> str | None:
        """The quantization scheme (``w4a16``, ...), or None when not quantized."""
        return self.quantization.scheme if self.quantization else None

    @property
    def is_lora(self) -> bool:
        """True for a LoRA adapter artifact (``kind`` "lora"): model/ holds an adapter of ``base``."""
        return self.kind == "lora"

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
        return self.verification.passed

    def claims(self) -> dict[str, Any]:
        """What this manifest says of the artifact itself (:class:`~modelyard.artifact.records.ClaimsRecord`:
        name, revision, kind, content_digest, a LoRA's base, tools), in the stored form that ``report.json``
        carries under ``artifact`` and the signature covers (:func:`sign_claims`)."""
        return ClaimsRecord(name=self.name, revision=self.revision, kind=self.kind, content_digest=self.content_digest,
                            base=self.base, tools=self.tools).to_dict()

    # --- serializing ---------------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        return (json.dumps(self.to_dict(), indent=2) + "\n").encode()

    @classmethod
    def from_dict(cls, d: Any, where: str = MANIFEST) -> Manifest:
        """Raises :class:`ManifestError` (a ``ValueError``) when ``d`` is not a JSON object, or a key
        holds the wrong type (``files`` not a list of ``{path, size, sha256}``, ``source`` not an object, ...),
        naming ``where`` and the field."""
        if not isinstance(d, dict):
            raise ManifestError(f"{where} is not a JSON object", fix=_FIX)
        return validate(cls, d, where, _FIX)

    @classmethod
    def from_bytes(cls, data: bytes, where: str = MANIFEST) -> Manifest:
        """Parse ``manifest.json`` bytes; raises :class:`ManifestError` for bytes that are not JSON."""
        try:
            d = json.loads(data)
        except ValueError as exc:
            raise ManifestError(f"{where} is not valid JSON: {exc}", fix=_FIX) from exc
        return cls.from_dict(d, where)

    @classmethod
    def load(cls, artifact_dir: Path) -> Manifest:
        """Read ``artifact_dir/manifest.json``. Raises ``OSError`` when it cannot be read,
        :class:`ManifestError` when it is not a manifest."""
        path = Path(artifact_dir) / MANIFEST
        return cls.from_bytes(path.read_bytes(), str(path))

    def with_promotion(self, promotion: dict[str, Any]) -> Manifest:
        """This manifest with ``promotion`` set; an earlier promotion moves into ``promotions`` (the history)."""
        d = self.to_dict()
        if d.get("promotion"):
            d["promotions"] = [*(d.get("promotions") or []), d["promotion"]]
        d["promotion"] = promotion
        return Manifest.from_dict(d)

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


def base_beside(artifact: Path, m: Manifest) -> tuple[Path, str | None]:
    """Where the LoRA artifact ``artifact`` (its manifest ``m``, kind lora) has its base as the store keeps the two,
    ``<store>/<base>/<revision>`` beside ``<store>/<name>/<revision>`` (serve/vllm.yaml reaches it at
    ``../../<base>/<revision>``; a publish with the base and two pulls keep the same layout), and the content
    digest of the artifact found there (None when none is)."""
    assert m.base is not None
    base_dir = artifact.resolve().parent.parent / m.base.name / m.base.revision
    try:
        return base_dir, Manifest.load(base_dir).content_digest
    except (OSError, ValueError):
        return base_dir, None


def tool_versions() -> dict[str, str | None]:
    """Versions of modelyard, Python and the libraries that shaped the artifact (None when absent)."""
    return {"modelyard": __version__, "python": platform.python_version(), **library_versions(_TOOLS)}


def source_record(snapshot: Snapshot) -> dict[str, Any]:
    """The ``source`` record of a snapshot: uri, kind, repo_id, revision, commit and the fetcher's provenance
    keys. The manifest and ``report.json`` (which the signature covers) both carry it."""
    return {"uri": snapshot.source, "kind": snapshot.kind, "repo_id": snapshot.repo_id,
            "revision": snapshot.revision, "commit": snapshot.commit, **snapshot.provenance}


def build_manifest(*, name: str, revision: str, snapshot: Snapshot, report: Report, report_json: bytes,  # noqa: PLR0913
                   smoke: dict[str, Any] | None, files: tuple[FileEntry, ...] | None = None,
                   plan: PatchPlan | None = None, quantization: dict[str, Any] | None = None,
                   serve: dict[str, Any] | None = None) -> Manifest:
    """The manifest. ``files`` are the artifact's ``model/`` entries (default: the snapshot's);
    a patched file lists its new ``sha256`` and its ``original_sha256``; ``patches`` holds the
    plan's ops (``patches.json``) and its digest, and the files modelyard wrote instead of the source's
    (:func:`modelyard.checks.report.replaced_files`: a GGUF import's rebuilt tokenizer); ``serve`` the serve plan
    that serve/ was written for."""
    source = source_record(snapshot)
    replaced = replaced_files(source)
    entries = sorted(files if files is not None else snapshot.files, key=lambda f: f.path)
    tools = tool_versions()
    if smoke and smoke.get("vllm_version"):
        tools["vllm"] = smoke["vllm_version"]
    return Manifest.from_dict({
        "schema_version": SCHEMA_VERSION,
        "name": name,
        "revision": revision,
        "content_digest": "sha256:" + tree_digest(tuple(entries)),
        "created_at": dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat(),
        "source": source,
        "files": [{"path": f"model/{f.path}", "size": f.size, "sha256": f.sha256, "origin": f.origin,
                   **({"original_sha256": f.original_sha256} if f.patched else {})} for f in entries],
        "patches": None if (plan is None or plan.empty) and not replaced else {
            "count": 0 if plan is None else len(plan.ops), "sha256": None if plan is None or plan.empty else plan.digest,
            "ops": [{"file": o.file, "pointer": o.pointer, "old": o.old, "new": o.new, "code": o.code, "reason": o.reason}
                    for o in (plan.ops if plan is not None else ())],
            **({"replaced": replaced} if replaced else {})},
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


def sign_claims(build: Callable[[Report, bytes], Manifest], report: Report) -> tuple[Manifest, Report, bytes]:
    """The manifest, the report and the report's bytes of a stored artifact, the report carrying the manifest's
    identity claims (:meth:`Manifest.claims`) so that the signature over ``report.json`` covers them too.

    ``build(report, report_json)`` makes the manifest (it records ``report_json``'s sha256); it is called twice,
    once to learn the claims and once with the report that carries them. Why: ``manifest.json`` is not signed (a
    promotion rewrites it), and name, revision, base binding and tools edited there verified before."""
    first = build(report, report.to_json().encode())
    report = report.with_artifact(first.claims())
    report_json = report.to_json().encode()
    return build(report, report_json), report, report_json
