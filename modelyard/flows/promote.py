"""The ``promote`` Prefect flow: copy a stored artifact to production target(s) after a human approved it.

1. ``check-gates``: the artifact's manifest says verification passed (and the smoke, when one ran).
2. The run pauses with ``pause_flow_run(wait_for_input=Approval, timeout=...)``; an operator answers
   in the Prefect UI or headlessly with ``modelyard approve RUN_ID --by NAME [--reject]``
   (:func:`approve`, i.e. ``resume_flow_run(run_id, run_input={...})``). No answer within the timeout
   fails the run (Prefect's ``FlowPauseTimeout``); a rejection fails it with
   :class:`PromotionRejectedError`. Either way nothing is written to the targets.
3. On approval, for each target: the artifact is assembled in ``<target>/.staging/`` (model files
   hard-linked when on the same filesystem, copied otherwise), its ``manifest.json`` gains a
   ``promotion`` block (approver, UTC time, note, evidence: report sha256 and smoke summary, from/to,
   flow run id) written atomically, and the folder is renamed into ``<target>/<name>/<revision>``.

A store is a folder or an object store (``s3://bucket/prefix``, :mod:`modelyard.transport.objectstore`):
the artifact is read from the source store (downloaded to the local cache when it is remote), and an
object-store target is written blobs first, then the manifest by compare-and-swap (``If-None-Match: *``,
or ``If-Match`` with the ETag read), so two promoters at once lose neither promotion. Registries are
reached through ``modelyard publish``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from uuid import UUID

from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from prefect.input import RunInput

from modelyard.artifact.identity import SMOKE_LEVEL_RANK
from modelyard.artifact.manifest import Manifest
from modelyard.artifact.records import PromotionRecord
from modelyard.errors import (
    InvalidSourceError,
    PromotionGateError,
    PromotionRejectedError,
    SourceNotFoundError,
)
from modelyard.settings import Settings
from modelyard.transport.objectstore import is_remote, open_store


class Approval(RunInput):
    """What ``modelyard approve`` (or the Prefect UI form) sends to a paused promote run."""

    approved: bool
    by: str
    note: str = ""


def parse_ref(ref: str) -> tuple[str, str]:
    name, sep, rev = ref.partition("@")
    if not sep or not name or not rev or "/" in name or "/" in rev:

        raise InvalidSourceError(f"{ref!r} is not NAME@REVISION", fix="Use the name and revision of a stored artifact, "
                                                                        "e.g. tiny@<commit> (see `modelyard list`).")
    return name, rev


@dataclass(frozen=True)
class GateEvidence:
    """What the approver is shown and the promotion records as its ``evidence``: the signed report's sha256
    (hex), the verification's verdict and counts, the stored smoke's summary (None when no smoke ran) and the
    artifact's ``content_digest`` (``sha256:<hex>``; None in a manifest written before it existed)."""

    report_sha256: str | None
    verification: dict[str, Any]
    smoke: dict[str, Any] | None
    content_digest: str | None

    def to_dict(self) -> dict[str, Any]:
        """The ``evidence`` block of the promotion record (manifest.json)."""
        return {"report_sha256": self.report_sha256, "verification": dict(self.verification),
                "smoke": None if self.smoke is None else dict(self.smoke), "content_digest": self.content_digest}


@dataclass(frozen=True)
class PromotionResult:
    """A promotion done: the ``ref`` (NAME@REVISION), the promotion record written into each target's manifest
    and where the artifact now is in each target store (in ``to_targets``' order)."""

    ref: str
    promotion: PromotionRecord
    placed: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        """``promote --json``'s document: ``{ref, promotion, placed}``."""
        return {"ref": self.ref, "promotion": self.promotion.to_dict(), "placed": list(self.placed)}


@task(name="check-gates", cache_policy=NO_CACHE)
def check_gates(artifact: Path, require_smoke: str | None = "load") -> GateEvidence:
    """The evidence for the approver; raises :class:`PromotionGateError` when a gate failed: the
    verification did not pass, the smoke failed, or ``require_smoke`` (load, server, bench; None: no
    smoke needed) asks for smoke evidence at a level the stored smoke does not reach (a server smoke
    stands for a load one, a bench smoke for both)."""
    try:
        m = Manifest.load(artifact)
    except OSError as exc:
        raise SourceNotFoundError(f"no artifact at {artifact} (manifest.json missing)",
                                  fix="Check NAME@REVISION and --from (the staging store).") from exc
    v = m.verification
    if not v.passed:
        raise PromotionGateError(f"{artifact}: verification did not pass ({v.errors} errors)",
                                 fix="Fix the findings in report.md and ingest again.")
    smoke = m.smoke
    if smoke is not None and not smoke.passed:
        raise PromotionGateError(f"{artifact}: the vLLM smoke test failed ({smoke.error})",
                                 fix="See the smoke block of manifest.json; ingest again once it passes.")
    if require_smoke is not None:
        have = smoke.level_name if smoke else None
        if have is None or SMOKE_LEVEL_RANK.get(have, -1) < SMOKE_LEVEL_RANK[require_smoke]:
            raise PromotionGateError(
                f"{artifact}: no vLLM smoke evidence at level {require_smoke} "
                f"({'it was stored without a smoke test' if have is None else f'its smoke ran at level {have}'})",
                fix=f"Ingest it again with --smoke {require_smoke}, or promote with --no-smoke-required "
                    "to accept it without that evidence.")
    summary: dict[str, Any] | None = None
    if smoke:
        stored = smoke.to_dict()
        summary = {k: stored[k] for k in ("passed", "level", "vllm_version", "finish_reason", "load_seconds",
                                          "tokens_per_second") if k in stored}
    return GateEvidence(report_sha256=v.report_sha256,
                        verification={k: getattr(v, k) for k in ("passed", "errors", "warnings")}, smoke=summary,
                        content_digest=m.content_digest if "content_digest" in m.present else None)


@task(name="promote-copy", cache_policy=NO_CACHE)
def copy_to_target(artifact: Path, target: str, name: str, revision: str, promotion: dict[str, Any],
                   settings: Settings) -> str:
    """Place the artifact (with the promotion block in its manifest) in the store ``target`` (a folder or
    ``s3://bucket/prefix``, reached with the run's ``settings``); returns where it now is."""

    return open_store(target, settings=settings).promote(artifact, name, revision, promotion).location


def _absolute(store: str) -> str:
    """A store as recorded in the promotion block: an ``s3://`` URI as given, a folder made absolute."""
    return store if is_remote(store) else str(Path(store).absolute())


def _announce(run_id: UUID, ref: str, timeout: int) -> None:
    # For the operator at the terminal that started the run (the CLI prints nothing else meanwhile).
    sys.stderr.write(f"promotion of {ref} waits for approval (timeout {timeout} s): flow run {run_id}\n"
                     f"  approve: modelyard approve {run_id} --by NAME   reject: add --reject\n")
    sys.stderr.flush()


@flow(name="promote", log_prints=False, validate_parameters=False)
def promote_flow(ref: str, to_targets: list[str], from_target: str | None = None, timeout: int = 3600,
                 poll_interval: int = 2, require_smoke: str | None = "load") -> PromotionResult:
    """Promote artifact ``ref`` (NAME@REVISION) from the store ``from_target`` (a folder or ``s3://``;
    default MODELYARD_STORE, else MODELYARD_HOME) to each store of ``to_targets`` once a human approved;
    returns the promotion record. ``require_smoke``: the smoke level the artifact must have passed (None:
    none needed)."""
    from prefect.context import FlowRunContext  # noqa: PLC0415 - heavy: prefect, imported on first use
    from prefect.flow_runs import pause_flow_run  # noqa: PLC0415 - heavy: prefect, imported on first use


    name, revision = parse_ref(ref)
    settings = Settings()
    store = open_store(from_target, settings=settings)
    source = _absolute(store.where)
    found = store.get(name, revision)
    if found is None:
        raise SourceNotFoundError(f"the store {source} holds no artifact {ref}",
                                  fix="Check NAME@REVISION and --from (the staging store): `modelyard list --store ...`.")
    artifact = store.local(found)
    evidence = check_gates(artifact, require_smoke)
    ctx = FlowRunContext.get()
    run_id = ctx.flow_run.id if ctx and ctx.flow_run else None
    if run_id is not None:
        _announce(run_id, ref, timeout)
    answer = pause_flow_run(wait_for_input=Approval.with_initial_data(
        description=f"Promote **{ref}** from `{source}` to {', '.join(f'`{t}`' for t in to_targets)}?\n\n"
                    f"Evidence: report sha256 `{evidence.report_sha256}`, smoke: {evidence.smoke or 'not run'}.",
        approved=False, by=""), timeout=timeout, poll_interval=poll_interval, key="approval")
    if not answer.approved:
        raise PromotionRejectedError(f"promotion of {ref} was rejected by {answer.by or 'an operator'}"
                                     + (f": {answer.note}" if answer.note else ""))
    promotion = PromotionRecord(approved_by=answer.by,
                                approved_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                                note=answer.note, from_=source, to=tuple(_absolute(t) for t in to_targets),
                                flow_run_id=str(run_id) if run_id else None, evidence=evidence.to_dict())
    placed = [copy_to_target(artifact, _absolute(t), name, revision, promotion.to_dict(), settings) for t in to_targets]
    return PromotionResult(ref=ref, promotion=promotion, placed=tuple(placed))


def approve(run_id: str, *, by: str, approved: bool = True, note: str = "") -> None:
    """Answer a paused promote run through the Prefect API (``PREFECT_API_URL``)."""
    from prefect.exceptions import FlowPauseTimeout, NotPausedError, ObjectNotFound  # noqa: PLC0415 - heavy: prefect, imported on first use
    from prefect.flow_runs import resume_flow_run  # noqa: PLC0415 - heavy: prefect, imported on first use


    try:
        uid = UUID(run_id)
    except ValueError as exc:
        raise InvalidSourceError(f"{run_id!r} is not a flow run id", fix="Copy the id that `modelyard promote` printed.") from exc
    try:
        resume_flow_run(uid, run_input={"approved": approved, "by": by, "note": note})
    except ObjectNotFound as exc:
        raise SourceNotFoundError(f"no flow run {run_id} on the Prefect API",
                                  fix="Point PREFECT_API_URL at the server the promote run uses.") from exc
    except NotPausedError as exc:
        raise PromotionRejectedError(f"flow run {run_id} is not waiting for approval (already answered, timed out or not "
                                     "a promote run)", fix="Check it with `prefect flow-run inspect`.") from exc
    except FlowPauseTimeout as exc:
        raise PromotionRejectedError(f"flow run {run_id} timed out waiting for approval; nothing was promoted",
                                     fix="Start `modelyard promote` again.") from exc
