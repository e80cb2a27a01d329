"""``report.json`` read back: the one parser of the stored report (the writer is
:meth:`modelyard.checks.report.Report.to_json`).

A pydantic model of the stored form (:class:`ReportRecord`), validated with ``model_validate``; keys a
newer writer adds are kept (``extra="allow"``), a key of the wrong type is refused with the file and
the field named. :meth:`ReportRecord.to_report` gives the in-memory :class:`~modelyard.checks.report.Report`
back, so a stored verdict and a fresh one are the same type."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict

from modelyard.artifact.layout import REPORT_JSON
from modelyard.artifact.records import (
    ClaimsRecord,
    FindingRecord,
    QuantizationRecord,
    Record,
    SmokeRecord,
    SourceRecord,
    SummaryRecord,
    TargetRecord,
    validate,
)
from modelyard.checks.base import Finding, Severity, Target
from modelyard.checks.report import Report

_FIX = "Re-create the artifact with `modelyard ingest`; report.json was edited or cut."


def to_finding(f: FindingRecord) -> Finding:
    """The in-memory :class:`~modelyard.checks.base.Finding` of a stored one."""
    return Finding(f.code, Severity(f.severity), f.message, file=f.file, field=f.field, value=f.value, fix=f.fix,
                   source=f.source, limit=f.limit)


class ToolRecord(Record):
    """The writer: ``{"name": "modelyard", "version": ...}``."""

    name: Literal["modelyard"] = "modelyard"
    version: str | None = None


class ReportRecord(Record):
    """``report.json``: ``schema_version``, ``tool``, ``target``, ``summary``, ``findings``, ``smoke`` (the
    smoke record, or null), ``quantization`` (when quantized), ``source`` (a stored artifact's origin, the
    manifest's source record, signed with the report) and ``artifact`` (its identity claims, signed likewise)."""

    model_config = ConfigDict(json_schema_extra={
        "$id": "https://modelyard.dev/schemas/report/1.json", "title": "modelyard verification report",
        "description": "schema_version 1. Additive changes (new optional keys, new finding codes) keep the "
                       "version; removing or retyping a key bumps it."})

    schema_version: Literal["1"]
    tool: ToolRecord = ToolRecord()
    target: TargetRecord = TargetRecord()
    summary: SummaryRecord
    findings: tuple[FindingRecord, ...] = ()
    smoke: SmokeRecord | None = None
    quantization: QuantizationRecord | None = None
    source: SourceRecord | None = None
    artifact: ClaimsRecord | None = None

    @classmethod
    def from_bytes(cls, data: bytes | str, where: str = REPORT_JSON) -> ReportRecord:
        """Parse and validate ``report.json`` bytes. Raises :class:`~modelyard.errors.ManifestError` (a
        ``ValueError``, exit 2) naming ``where`` and the first field that is wrong, for bytes that are not
        JSON or not a report."""
        return validate(cls, data, where, _FIX)

    def to_report(self) -> Report:
        """The in-memory report these figures were written from."""
        known = TargetRecord.model_fields
        target = Target(**{k: v for k, v in self.target.to_dict().items() if k in known})
        return Report(findings=tuple(to_finding(f) for f in self.findings), target=target,
                      smoke=self.smoke.to_dict() if self.smoke else None,
                      quantization=self.quantization.to_dict() if self.quantization else None,
                      source=self.source.to_dict() if self.source else None,
                      artifact=self.artifact.to_dict() if self.artifact else None)
