"""What one ingest run returns: :class:`IngestResult`, holding the stage records (the smoke's :class:`SmokeRecord`,
each publish's :class:`PublishResult`), and :func:`smoke_record`, the one place a smoke stage's result becomes its
record."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from modelyard.artifact.records import SmokeRecord, validate
from modelyard.artifact.store import Artifact
from modelyard.checks import Report
from modelyard.stages import smoke
from modelyard.stages.smoke import server as serve_smoke
from modelyard.transport.publish import PublishResult


@dataclass(frozen=True)
class IngestResult:
    """One ingest's outcome: the stored ``artifact``, its ``report``, the records of its stages, and what the run
    reused (``cached`` stages, ``hashed_bytes`` read). :meth:`to_dict` is ``ingest --json``'s result."""

    artifact: Artifact
    report: Report
    smoke: SmokeRecord | None  # this run's smoke, or the stored artifact's (reused); None: no smoke
    source: str
    commit: str | None
    patches: int = 0  # repairs applied (patches.json beside model/)
    published: tuple[PublishResult, ...] = ()  # --publish results, in the order asked
    cached: tuple[str, ...] = ()  # stages whose result came from the stage cache (e.g. "fetch", "verify")
    hashed_bytes: int = 0  # bytes read to hash the source (0: every digest came from the digest cache)
    left_out: tuple[str, ...] = ()  # the source's files model/ does not hold (each a files.left_out finding)

    def to_dict(self) -> dict[str, Any]:
        """The ``ingest --json`` result (docs/reference/json.md): the one place the result becomes a dict; the
        human output reads the same attributes."""
        a = self.artifact
        return {"artifact": a.location, "name": a.name, "revision": a.revision, "content_digest": a.content_digest,
                "reused": a.reused, "source": self.source, "commit": self.commit,
                "verification": self.report.to_dict()["summary"], "patches": self.patches,
                "smoke": self.smoke.to_dict() if self.smoke is not None else None,
                "published": [{"uri": p.uri, "files": p.files, "bytes": p.bytes, "digest": p.digest, "skipped": p.skipped}
                              for p in self.published],
                "cached_stages": list(self.cached), "hashed_bytes": self.hashed_bytes, "left_out": list(self.left_out)}


def smoke_record(result: smoke.SmokeResult | serve_smoke.ServerSmokeResult | dict[str, Any]) -> SmokeRecord:
    """The stored record of a smoke stage's result (its keys and their order kept): built here once, then held by
    the report, the manifest and :class:`IngestResult`."""
    return validate(SmokeRecord, result if isinstance(result, dict) else result.to_dict(), "the smoke's result",
                    fix="Report this: a smoke result must fit the manifest's smoke record.")
