"""The artifact's AI-BOM: a CycloneDX 1.6 ML-BOM of what the artifact is and what made it.

Built with cyclonedx-python-lib (the model, components, hashes, pedigree, dependencies, tools and the
JSON serializer) and validated with its JSON Schema validator for 1.6. The library does not model the
``modelCard`` object yet, so that one object is added to the serialized document before validation.

What it holds, all read from the artifact (``manifest.json``, ``report.json``, ``model/config.json``):

- ``metadata.component``: the model (``machine-learning-model``), named ``name`` at ``revision``, with a
  ``pkg:huggingface`` purl when it is the hub's checkpoint unchanged; one ``file`` component per file of
  the artifact (``model/`` from the manifest, ``manifest.json``, ``report.json``, ``serve/`` hashed here),
  SHA-256 each; ``pedigree.ancestors`` the base model a quantized or patched artifact was derived from;
- ``modelCard``: task, architecture family and class, the calibration dataset, and the measured figures
  (quantization quality gate, smoke numerical gate) as performance metrics;
- ``components``: the calibration data (``data``, its SHA-256), when quantized;
- ``metadata.tools``: modelyard and every library version the manifest records (``pkg:pypi`` purls);
- properties ``modelyard:*``: content digest, verification verdict and report sha256, smoke verdict,
  quantization scheme.

Deterministic: the serial number is a UUID5 of the content digest and revision, the timestamp the
artifact's ``created_at``. Source: CycloneDX 1.6 specification (ML-BOM: ``machine-learning-model``,
``modelCard``, ``data``); cyclonedx-python-lib 11 (``Bom``, ``JsonV1Dot6``, ``make_schemabased_validator``)."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from pathlib import Path
from typing import Any

from modelyard.artifact.layout import MANIFEST, REPORT_JSON
from modelyard.artifact.manifest import Manifest
from modelyard.errors import ManifestError
from modelyard.model.digest import file_digest
from modelyard.version import __version__

SPEC_VERSION = "1.6"
#: ``name`` -> pypi project name where they differ (the purl names the project)
_PYPI = {"llmcompressor": "llmcompressor", "huggingface_hub": "huggingface-hub"}


def _metric(kind: str, value: Any, slice_: str) -> dict[str, Any]:
    return {"type": kind, "value": f"{value}", "slice": slice_}


def model_card(m: Manifest, config: dict[str, Any], calibration_ref: str | None) -> dict[str, Any]:
    """The CycloneDX ``modelCard`` of the artifact: parameters from ``config.json`` and the calibration
    dataset, the measured figures as performance metrics (quality gate of quantize, numerical gate of the
    smoke: perplexity, mean KL in nats per token)."""
    params: dict[str, Any] = {"task": "text-generation"}
    text: dict[str, Any] = config["text_config"] if isinstance(config.get("text_config"), dict) else config
    if isinstance(text.get("model_type") or config.get("model_type"), str):
        params["architectureFamily"] = text.get("model_type") or config.get("model_type")
    arch = config.get("architectures")
    if isinstance(arch, list) and arch and isinstance(arch[0], str):
        params["modelArchitecture"] = arch[0]
    if calibration_ref:
        params["datasets"] = [{"ref": calibration_ref}]
    metrics = []
    q = m.quantization.quality if m.quantization else None
    if q is not None:
        metrics += [_metric("perplexity ratio (quantized / parent)", q.ppl_ratio, "held-out text"),
                    _metric("mean KL(parent || quantized), nats per token", q.kl_mean, "held-out text")]
    numeric = (m.smoke.numeric or {}) if m.smoke else {}
    if numeric.get("prose_ppl") is not None:
        metrics.append(_metric("perplexity (vLLM)", numeric["prose_ppl"], "prose"))
    if numeric.get("kl_mean") is not None:
        metrics.append(_metric("mean KL(reference || vLLM), nats per token", numeric["kl_mean"], "smoke texts"))
    card: dict[str, Any] = {"bom-ref": "model-card", "modelParameters": params}
    if metrics:
        card["quantitativeAnalysis"] = {"performanceMetrics": metrics}
    return card


def build_bom(artifact_dir: Path) -> dict[str, Any]:  # noqa: C901
    """The CycloneDX 1.6 ML-BOM (a JSON-ready dict) of the artifact folder ``artifact_dir``. Raises
    ``OSError`` when a listed file cannot be read, :class:`~modelyard.errors.ManifestError` when
    ``manifest.json`` is not a manifest."""
    from cyclonedx.model import ExternalReference, ExternalReferenceType, HashAlgorithm, HashType, Property, XsUri  # noqa: PLC0415
    from cyclonedx.model.bom import Bom  # noqa: PLC0415 - cyclonedx is imported by `modelyard bom` only
    from cyclonedx.model.component import Component, ComponentType, Pedigree  # noqa: PLC0415
    from cyclonedx.output.json import JsonV1Dot6  # noqa: PLC0415
    from packageurl import PackageURL  # noqa: PLC0415

    root = Path(artifact_dir)
    m = Manifest.load(root)
    try:
        config = json.loads((root / "model" / "config.json").read_text())
    except (OSError, ValueError):
        config = {}
    config = config if isinstance(config, dict) else {}
    src = m.source

    def sha(hexdigest: str) -> list[Any]:
        return [HashType(alg=HashAlgorithm.SHA_256, content=hexdigest)]

    def hf_purl(repo_id: str | None, commit: str | None) -> Any:
        if not repo_id or "/" not in repo_id or not commit:
            return None
        org, name = repo_id.split("/", 1)
        return PackageURL(type="huggingface", namespace=org, name=name, version=commit)

    ref = f"model:{m.name}@{m.revision}"
    props = [Property(name="modelyard:content_digest", value=m.content_digest),
             Property(name="modelyard:verification.passed", value=str(m.verification.passed).lower()),
             Property(name="modelyard:verification.errors", value=str(m.verification.errors)),
             Property(name="modelyard:verification.warnings", value=str(m.verification.warnings))]
    if m.verification.report_sha256:
        props.append(Property(name="modelyard:verification.report_sha256", value=m.verification.report_sha256))
    if m.smoke is not None:
        props += [Property(name="modelyard:smoke.passed", value=str(m.smoke.passed).lower()),
                  Property(name="modelyard:smoke.level", value=m.smoke.level_name)]
        if m.smoke.vllm_version:
            props.append(Property(name="modelyard:smoke.vllm_version", value=m.smoke.vllm_version))
    if m.quantization is not None:
        props.append(Property(name="modelyard:quantization.scheme", value=m.quantization.scheme))
    if m.patches is not None and m.patches.sha256:
        props += [Property(name="modelyard:patches.count", value=str(m.patches.count)),
                  Property(name="modelyard:patches.sha256", value=m.patches.sha256)]
    model = Component(type=ComponentType.MACHINE_LEARNING_MODEL, name=m.name or root.name, version=m.revision,
                      bom_ref=ref, properties=props,
                      purl=None if m.modified else hf_purl(src.repo_id, src.commit))
    card = src.to_dict()
    if card.get("license"):  # the model card's license, as the fetch recorded it (an SPDX id when it is one)
        from cyclonedx.contrib.license.factories import LicenseFactory  # noqa: PLC0415

        named = str(card["license_name"] if card["license"] == "other" and card.get("license_name") else card["license"])
        link = card.get("license_link")  # the card's link to the license text (an "other" license's terms)
        url = XsUri(str(link)) if link and " AND " not in named and str(link).startswith(("https://", "http://")) else None
        model.licenses.add(LicenseFactory().make_from_string(named, license_url=url))
    if src.uri and src.uri.startswith(("https://", "http://", "hf://")):
        model.external_references.add(ExternalReference(type=ExternalReferenceType.DISTRIBUTION, url=XsUri(src.uri)))
    for f in m.files:
        model.components.add(Component(type=ComponentType.FILE, name=f.path, bom_ref=f"file:{f.path}", hashes=sha(f.sha256)))
    others = [root / MANIFEST, root / REPORT_JSON, *sorted(p for p in (root / "serve").rglob("*") if p.is_file())]
    for p in others:
        if p.is_file():
            rel = p.relative_to(root).as_posix()
            model.components.add(Component(type=ComponentType.FILE, name=rel, bom_ref=f"file:{rel}", hashes=sha(file_digest(p).sha256)))
    if m.modified:
        base = Component(type=ComponentType.MACHINE_LEARNING_MODEL, name=src.repo_id or src.uri or "source",
                         version=src.commit or src.revision, bom_ref=f"base:{src.repo_id or src.uri}@{src.commit or src.revision}",
                         purl=hf_purl(src.repo_id, src.commit))
        model.pedigree = Pedigree(ancestors=[base])
    bom = Bom()
    bom.serial_number = uuid.uuid5(uuid.NAMESPACE_URL, f"modelyard:{m.content_digest}:{m.revision}")
    if m.created_at:
        try:
            bom.metadata.timestamp = dt.datetime.fromisoformat(str(m.created_at))
        except ValueError as exc:
            raise ManifestError(f"{root / MANIFEST}: created_at is {str(m.created_at)[:80]!r}, not an ISO 8601 time",
                                fix="Restore the manifest from the store or the publisher (a stored manifest's "
                                    "created_at is written as e.g. 2026-12-06T19:39:00+00:00).") from exc
    bom.metadata.component = model
    bom.metadata.tools.components.add(Component(type=ComponentType.APPLICATION, name="modelyard", version=__version__,
                                                bom_ref="tool:modelyard"))
    for name, version in sorted(m.tools.items()):
        if not version or name in ("modelyard",):
            continue
        kind = ComponentType.PLATFORM if name == "python" else ComponentType.LIBRARY
        purl = None if name == "python" else PackageURL(type="pypi", name=_PYPI.get(name, name).replace("_", "-").lower(),
                                                        version=version)
        bom.metadata.tools.components.add(Component(type=kind, name=name, version=version, purl=purl,
                                                    bom_ref=f"tool:{name}"))
    calibration_ref = None
    q = m.quantization
    if q is not None and q.calibration.get("sha256"):
        calibration_ref = "data:calibration"
        data = Component(type=ComponentType.DATA, name=str(q.calibration.get("source") or "calibration text"),
                         bom_ref=calibration_ref, hashes=sha(str(q.calibration["sha256"])),
                         properties=[Property(name=f"modelyard:calibration.{k}", value=str(q.calibration[k]))
                                     for k in ("samples", "max_seq_len", "used") if k in q.calibration])
        bom.components.add(data)
        bom.register_dependency(model, [data])
    doc: dict[str, Any] = json.loads(JsonV1Dot6(bom).output_as_string())
    doc["metadata"]["component"]["modelCard"] = model_card(m, config, calibration_ref)
    return doc


def validate_bom(doc: dict[str, Any]) -> None:
    """Validate ``doc`` against the CycloneDX 1.6 JSON Schema (cyclonedx-python-lib's validator). Raises
    :class:`~modelyard.errors.ManifestError` naming the first violation."""
    from cyclonedx.schema import OutputFormat, SchemaVersion  # noqa: PLC0415
    from cyclonedx.validation import make_schemabased_validator  # noqa: PLC0415

    error = make_schemabased_validator(OutputFormat.JSON, SchemaVersion.V1_6).validate_str(json.dumps(doc))
    if error is not None:
        raise ManifestError(f"the AI-BOM does not follow the CycloneDX {SPEC_VERSION} schema: {str(error)[:400]}",
                            fix="Report this to the modelyard maintainers with the artifact's manifest.json.")
