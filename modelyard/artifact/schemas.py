"""The JSON Schemas of ``manifest.json`` and ``report.json``, generated from the records that read them
back (:class:`~modelyard.artifact.manifest.Manifest`, :class:`~modelyard.artifact.report_record.ReportRecord`)
with pydantic's ``model_json_schema`` (draft 2020-12), so the published schema and the parser cannot
disagree. The files ship beside this module (:data:`MANIFEST_SCHEMA`, :data:`REPORT_SCHEMA`); a test
keeps them equal to what :func:`render` gives (``MODELYARD_UPDATE_GOLDEN=1`` rewrites them)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from modelyard.artifact.manifest import Manifest
from modelyard.artifact.records import Record
from modelyard.artifact.report_record import ReportRecord

HERE = Path(__file__).parent
#: the published schema of ``manifest.json``
MANIFEST_SCHEMA = HERE / "manifest.schema.json"
#: the published schema of ``report.json`` (also the ``result`` of ``verify --json``)
REPORT_SCHEMA = HERE / "report.schema.json"
#: each published schema file and the record it is generated from
SCHEMAS: dict[Path, type[Record]] = {MANIFEST_SCHEMA: Manifest, REPORT_SCHEMA: ReportRecord}
DRAFT = "https://json-schema.org/draft/2020-12/schema"


def json_schema(model: type[Record]) -> dict[str, Any]:
    """The JSON Schema (a dict) of the stored form of ``model``: what ``model_validate`` accepts."""
    return {"$schema": DRAFT, **model.model_json_schema(by_alias=True, mode="validation")}


def render(model: type[Record]) -> str:
    """:func:`json_schema` as the file holds it: ``json.dumps(indent=2)`` plus a newline."""
    return json.dumps(json_schema(model), indent=2) + "\n"


def load(path: Path) -> dict[str, Any]:
    """A published schema file, parsed. Raises ``OSError`` when it cannot be read."""
    schema: dict[str, Any] = json.loads(path.read_text())
    return schema
