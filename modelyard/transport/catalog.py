"""catalog: what a store holds (``modelyard list``, ``modelyard show``): the store folder
(``MODELYARD_HOME``) or an object store (``MODELYARD_STORE=s3://bucket/prefix``).

Reads manifests only (and ``report.json`` and the presence of ``model.sig`` for ``show``); never
hashes or downloads weights. In a folder, staging and cache folders (names starting with ``.``) are
skipped, and so are folders without a readable manifest.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from modelyard.artifact.layout import MANIFEST, REPORT_JSON, SIGNATURE
from modelyard.artifact.manifest import Manifest
from modelyard.artifact.report_record import ReportRecord
from modelyard.artifact.store import Artifact, Store, StoreProtocol
from modelyard.checks.report import replaced_files
from modelyard.errors import BundleError, ManifestError, PublishError, SourceNotFoundError, StoreError
from modelyard.settings import Settings
from modelyard.transport.objectstore import is_remote, open_store
from modelyard.transport.refs import find_artifact, resolve_artifact


@dataclass(frozen=True)
class ArtifactSummary:
    name: str
    revision: str
    content_digest: str
    created_at: str | None
    quantization: str | None  # the scheme, or None when not quantized
    size: int  # bytes of model/ (the manifest's sizes)
    path: str  # the artifact's folder, or its s3:// URI in an object store

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ArtifactDetail:
    """What ``modelyard show`` says of one artifact: its :class:`ArtifactSummary`; the source (``uri``, ``kind``,
    ``repo_id``, ``revision``, ``commit``); the number of model files; the manifest's verification block (None in
    a manifest without one) and smoke summary (``vllm_version``, ``load_seconds``, ``tokens_per_second``,
    ``finish_reason``; None when no smoke ran); the number of patches and the files written instead of the
    source's (``{file, by, evidence}``); whether ``model.sig`` is there; the report's counts and its errors and
    warnings (``{summary, findings}``; None without a readable ``report.json``)."""

    summary: ArtifactSummary
    source: dict[str, Any]
    files: int
    verification: dict[str, Any] | None
    smoke: dict[str, Any] | None
    patches: int
    replaced: tuple[dict[str, Any], ...]
    signed: bool
    report: dict[str, Any] | None

    def to_dict(self) -> dict[str, Any]:
        """``show --json``'s document: the summary's keys, then the rest in declaration order."""
        return {**self.summary.to_dict(), "source": self.source, "files": self.files, "verification": self.verification,
                "smoke": self.smoke, "patches": self.patches, "replaced": list(self.replaced), "signed": self.signed,
                "report": self.report}


def _summary(artifact: Artifact, m: Manifest) -> ArtifactSummary:
    return ArtifactSummary(name=m.name or artifact.name, revision=m.revision or artifact.revision,
                           content_digest=m.content_digest, created_at=m.created_at, quantization=m.scheme,
                           size=m.model_bytes, path=artifact.location)


def list_artifacts(home: str | Path | None = None, *, settings: Settings) -> list[ArtifactSummary]:
    """Every artifact in the store ``home`` (a folder or ``s3://bucket/prefix``; default: the store of the run's
    ``settings``, MODELYARD_STORE, else MODELYARD_HOME), sorted by name then creation time (newest last); a folder that does not exist
    holds none. Raises :class:`StoreError` when the store cannot be read."""
    store = open_store(home, settings=settings)
    if not is_remote(store.where) and not store.home.is_dir():
        return []
    try:
        found = store.list()
    except PublishError as exc:
        raise StoreError(exc.message, fix=exc.fix) from exc
    out = [_summary(a, m) for a, m in found]
    return sorted(out, key=lambda a: (a.name, a.created_at or "", a.revision))


def show_artifact(ref: str | Path, home: str | Path | None = None, *, settings: Settings) -> ArtifactDetail:
    """What is known of one artifact (``NAME[@REV]`` in the store ``home`` read with the run's ``settings``, or a
    folder): identity, source, files, quantization, verification and smoke, signature presence, and the report's
    counts. Raises :class:`StoreError` (exit 2) when its manifest cannot be found or read."""
    store: StoreProtocol
    text = str(ref)
    if not Path(ref).expanduser().exists() and (isinstance(ref, Path) or "/" in text.partition("@")[0]
                                                or text.startswith((".", "~"))):
        raise SourceNotFoundError(f"{ref} does not exist", fix="Pass an artifact folder's path, or NAME@REVISION of an "
                                                               "artifact in the store (`modelyard list`).")
    try:
        if Path(ref).expanduser().exists():
            root = resolve_artifact(ref, home, settings=settings)
            store, artifact = Store(root.parent.parent), Artifact(root.parent.name, root.name, root, "")
        else:
            store, artifact = find_artifact(text, home, settings=settings)
        m = Manifest.from_bytes(store.read(artifact, MANIFEST), where=f"{ref}/manifest.json")
    except (BundleError, PublishError, ManifestError) as exc:
        raise StoreError(exc.message, fix=exc.fix) from exc
    except (OSError, ValueError) as exc:
        raise StoreError(f"cannot read {ref}/manifest.json: {exc}", fix="Re-ingest the model.") from exc
    missing = [k for k in ("name", "revision", "content_digest", "files") if k not in m.present]
    if missing:  # {} parses (every key has a default) but is no artifact's manifest
        raise StoreError(f"{ref}/manifest.json is not a modelyard manifest: it has no {', '.join(missing)}",
                         fix="Re-create the artifact with `modelyard ingest`; manifest.json was edited or cut.")
    s = _summary(artifact, m)
    report: dict[str, Any] | None = None
    try:
        r = ReportRecord.from_bytes(store.read(artifact, REPORT_JSON))
        report = {"summary": r.summary.model_dump(),
                  "findings": [{k: getattr(f, k) for k in ("severity", "code", "file", "message")}
                               for f in r.findings if f.severity in ("error", "warning")]}
    except (OSError, ValueError):
        pass
    src, smoke = m.source, m.smoke
    # the manifest's patch list names the files written instead of the source's; a manifest older than that list
    # still has the record they are read from (source.tokenizer_check)
    replaced = ([r.to_dict() for r in m.patches.replaced] if m.patches and m.patches.replaced
                else replaced_files(src.to_dict()))
    return ArtifactDetail(
        summary=s, source={k: getattr(src, k) for k in ("uri", "kind", "repo_id", "revision", "commit")},
        files=len(m.files), verification=m.verification.to_dict() if "verification" in m.present else None,
        smoke=None if not smoke else {k: getattr(smoke, k) for k in ("vllm_version", "load_seconds",
                                                                      "tokens_per_second", "finish_reason")},
        patches=m.patches.count if m.patches else 0, replaced=tuple(replaced), signed=_has(store, artifact, SIGNATURE),
        report=report)


def _has(store: StoreProtocol, artifact: Artifact, rel: str) -> bool:
    try:
        store.read(artifact, rel)
    except OSError:
        return False
    return True
