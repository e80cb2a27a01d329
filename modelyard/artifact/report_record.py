"""``report.json`` read back: the one parser of the stored report (the writer is
:meth:`modelyard.checks.report.Report.to_json`).

A pydantic model of the stored form (:class:`ReportRecord`), validated with ``model_validate``; keys a
newer writer adds are kept (``extra="allow"``), a key of the wrong type is refused with the file and
the field named. :meth:`ReportRecord.to_report` gives the in-memory :class:`~modelyard.checks.report.Report`
back, so a stored verdict and a fresh one are the same type."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from modelyard.artifact.layout import REPORT_JSON
from modelyard.checks.base import Finding, Severity, Target
from modelyard.checks.report import Report
from modelyard.errors import ManifestError


class FindingRecord(BaseModel):
    """One stored finding (:class:`~modelyard.checks.base.Finding` as ``to_dict`` writes it)."""

    model_config = ConfigDict(extra="allow", frozen=True)
    code: str
    severity: Literal["error", "warning", "info"]
    message: str
    file: str | None = None
    field: str | None = None
    value: Any = None
    fix: str | None = None
    source: str | None = None
    limit: Any = None

    def to_finding(self) -> Finding:
        return Finding(self.code, Severity(self.severity), self.message, file=self.file, field=self.field,
                       value=self.value, fix=self.fix, source=self.source, limit=self.limit)


class SummaryRecord(BaseModel):
    """The counts by severity and the verdict (``passed``: no error)."""

    model_config = ConfigDict(extra="allow", frozen=True)
    errors: int
    warnings: int
    infos: int
    passed: bool


class TargetRecord(BaseModel):
    """What the findings were judged against (:class:`~modelyard.checks.base.Target`)."""

    model_config = ConfigDict(extra="allow", frozen=True)
    tensor_parallel_size: int = 1
    max_model_len: int | None = None
    dtype: str | None = None
    serve: str | None = None
    vllm_version: str | None = None
    transformers_version: str | None = None
    gpu_cc: str | None = None


class ReportRecord(BaseModel):
    """``report.json``: ``schema_version``, ``tool``, ``target``, ``summary``, ``findings``, ``smoke`` (the
    smoke record, or null) and ``quantization`` (when quantized)."""

    model_config = ConfigDict(extra="allow", frozen=True)
    schema_version: str
    tool: dict[str, Any] = {}
    target: TargetRecord = TargetRecord()
    summary: SummaryRecord
    findings: list[FindingRecord] = []
    smoke: dict[str, Any] | None = None
    quantization: dict[str, Any] | None = None

    @classmethod
    def from_bytes(cls, data: bytes | str, where: str = REPORT_JSON) -> ReportRecord:
        """Parse and validate ``report.json`` bytes. Raises :class:`~modelyard.errors.ManifestError` (a
        ``ValueError``, exit 2) naming ``where`` and the first field that is wrong, for bytes that are not
        JSON or not a report."""
        try:
            return cls.model_validate_json(data)
        except ValidationError as exc:
            err = exc.errors()[0]
            at = ".".join(str(p) for p in err.get("loc", ())) or "(the document)"
            raise ManifestError(f"{where}: {at}: {err.get('msg')}",
                                fix="Re-create the artifact with `modelyard ingest`; report.json was edited or cut.") from exc

    def to_report(self) -> Report:
        """The in-memory report these figures were written from."""
        known = TargetRecord.model_fields
        target = Target(**{k: v for k, v in self.target.model_dump().items() if k in known})
        return Report(findings=tuple(f.to_finding() for f in self.findings), target=target, smoke=self.smoke,
                      quantization=self.quantization)
