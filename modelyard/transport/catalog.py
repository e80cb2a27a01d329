"""catalog: what the store at ``MODELYARD_HOME`` holds (``modelyard list``, ``modelyard show``).

Reads ``<home>/<name>/<revision>/manifest.json`` only (and ``report.json`` for ``show``); never
hashes weights. Staging and cache folders (names starting with ``.``) are skipped, and so are
folders without a readable manifest.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from modelyard.artifact.layout import MANIFEST, REPORT_JSON, SIGNATURE
from modelyard.artifact.manifest import Manifest
from modelyard.errors import BundleError, StoreError
from modelyard.transport.bundle import resolve_artifact


@dataclass(frozen=True)
class ArtifactSummary:
    name: str
    revision: str
    content_digest: str
    created_at: str | None
    quantization: str | None  # the scheme, or None when not quantized
    size: int  # bytes of model/ (the manifest's sizes)
    path: Path

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "path": str(self.path)}


def _summary(path: Path, m: Manifest) -> ArtifactSummary:
    return ArtifactSummary(name=m.name or path.parent.name, revision=m.revision or path.name,
                           content_digest=m.content_digest, created_at=m.created_at, quantization=m.scheme,
                           size=m.model_bytes, path=path)


def list_artifacts(home: Path) -> list[ArtifactSummary]:
    """Every artifact under ``home``, sorted by name then creation time (newest last)."""
    home = Path(home).expanduser().absolute()
    if not home.is_dir():
        return []
    out = []
    try:
        for mf in home.glob(f"*/*/{MANIFEST}"):
            if mf.parent.parent.name.startswith("."):
                continue
            try:
                out.append(_summary(mf.parent, Manifest.load(mf.parent)))
            except (OSError, ValueError):
                continue
    except OSError as exc:
        raise StoreError(f"cannot read the store {home}: {exc.strerror or exc}", fix="Check MODELYARD_HOME.") from exc
    return sorted(out, key=lambda a: (a.name, a.created_at or "", a.revision))


def show_artifact(ref: str | Path, home: Path | None = None) -> dict[str, Any]:
    """A summary of one artifact (``NAME[@REV]`` in the store, or a folder): identity, source,
    files, quantization, verification and smoke, signature presence, and the report's counts."""
    try:
        root = resolve_artifact(ref, home)
        m = Manifest.load(root)
    except BundleError as exc:
        raise StoreError(exc.message, fix=exc.fix) from exc
    except (OSError, ValueError) as exc:
        raise StoreError(f"cannot read {ref}/manifest.json: {exc}", fix="Re-ingest the model.") from exc
    s = _summary(root, m)
    report: dict[str, Any] | None = None
    try:
        r = json.loads((root / REPORT_JSON).read_text())
        findings = r.get("findings") or []
        report = {"summary": r.get("summary"),
                  "findings": [{k: f.get(k) for k in ("severity", "code", "file", "message")}
                               for f in findings if f.get("severity") in ("error", "warning")]}
    except (OSError, ValueError, AttributeError):
        pass
    src = m.source
    smoke = m.smoke or None
    return {**s.to_dict(), "source": {k: src.get(k) for k in ("uri", "kind", "repo_id", "revision", "commit")},
            "files": len(m.files), "verification": m.verification if "verification" in m.present else None,
            "smoke": None if not smoke else {k: smoke.get(k) for k in ("vllm_version", "load_seconds",
                                                                          "tokens_per_second", "finish_reason")},
            "patches": (m.patches or {}).get("count", 0), "signed": (root / SIGNATURE).is_file(),
            "report": report}
