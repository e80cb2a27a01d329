"""Deployments: the ``watch`` flow on a cron schedule, and the ``ingest`` flow for many workers.

A deployment points at its flow by module path (``modelyard.flows.watch.watch_flow``,
``modelyard.flows.ingest.ingest_flow``), so a worker needs only modelyard installed: a *process*
worker on a host with ``pip install modelyard``, or a *docker* / *kubernetes* worker with an image
that has it (``--image``; nothing is built or pushed). Overlapping watch runs are prevented by a
deployment concurrency limit of 1; GPU-bound ingests share a GPU pool through the global concurrency
limit ``gpu-<pool>`` (:func:`modelyard.flows.ingest.gpu_slot`), which holds across every worker of the
Prefect server.

Many workers, one store: the ``ingest`` deployment's runs go to whichever worker of the pool polls
first; each worker has its own local cache (``MODELYARD_HOME``) and all share the object store
(``MODELYARD_STORE=s3://...``). A worker that dies mid-run is recovered with Prefect's own machinery,
two automations (:func:`ensure_crash_recovery`): a run of the deployment whose heartbeats
(``PREFECT_FLOWS_HEARTBEAT_FREQUENCY`` on the workers) stop for ``within`` seconds is marked
``Crashed`` (Prefect's zombie-flow detection), and a ``Crashed`` run of the deployment is set back to
``Scheduled`` (``AwaitingRetry``), as ``prefect flow-run retry`` does, so another worker picks it up.
The ingest flow refuses to start a run for the ``MODELYARD_INGEST_MAX_ATTEMPTS``-th time and more
(``flow_run.run_count``), so a run that kills its worker every time stops being retried.
"""

from __future__ import annotations

import contextlib
import io
from datetime import timedelta
from pathlib import Path
from typing import Any, cast
from uuid import UUID

from modelyard.errors import DeployError, InvalidTargetError, ModelyardError
from modelyard.flows.ingest import ingest_flow
from modelyard.flows.watch import load_config, watch_flow
from modelyard.transport.objectstore import is_remote


def deploy_watch(config: Path, *, work_pool: str, cron: str, name: str = "watch", home: str | None = None,
                 image: str | None = None, job_variables: dict[str, Any] | None = None,
                 timezone: str | None = None) -> UUID:
    """Create or update the deployment ``watch/<name>``; returns its id."""
    from prefect.client.schemas.schedules import CronSchedule  # noqa: PLC0415 - heavy: prefect, imported on first use


    config = Path(config).absolute()
    load_config(config)  # fail on a bad config now, not at 3 a.m. on the worker
    try:
        CronSchedule(cron=cron, timezone=timezone or "UTC")
    except ValueError as exc:

        raise InvalidTargetError(f"--cron {cron!r} is not a valid cron expression: {exc}") from exc
    params: dict[str, Any] = {"config": str(config), **_store_param(home)}

    return _deploy(watch_flow, "watch", name, work_pool, image=image, schedules=[CronSchedule(cron=cron, timezone=timezone or "UTC")],
                   parameters=params, job_variables=job_variables or {}, concurrency_limit=1, tags=["modelyard", "watch"],
                   description=f"modelyard watch of {config}")


def _store_param(home: str | None) -> dict[str, str]:
    """The deployment parameter ``home`` for a ``--store``: an ``s3://`` URI as given, a folder made absolute."""
    if not home:
        return {}
    return {"home": home if is_remote(home) else str(Path(home).absolute())}


def _deploy(flow: Any, flow_name: str, name: str, work_pool: str, **kw: Any) -> UUID:
    """``flow.deploy`` by module path (nothing built or pushed), Prefect's own table kept off stdout;
    raises :class:`DeployError` naming the deployment and the pool when the Prefect API refuses."""
    from prefect.deployments.runner import EntrypointType  # noqa: PLC0415 - heavy: prefect, imported on first use

    try:
        # Prefect prints its own deployments table on stdout; the CLI prints ours.
        with contextlib.redirect_stdout(io.StringIO()):
            return flow.deploy(name=name, work_pool_name=work_pool, build=False, push=False,
                               entrypoint_type=EntrypointType.MODULE_PATH, print_next_steps=False, ignore_warnings=True, **kw)
    except ModelyardError:
        raise
    except Exception as exc:  # noqa: BLE001 - Prefect raises ValueError/ObjectNotFound/httpx errors here
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DeployError(f"cannot create the deployment {flow_name}/{name} on work pool {work_pool!r}: {msg}",
                          fix=f"Check PREFECT_API_URL, and create the pool first: prefect work-pool create {work_pool} "
                              "--type process") from exc


def deploy_ingest(*, work_pool: str, name: str = "ingest", home: str | None = None, image: str | None = None,
                  job_variables: dict[str, Any] | None = None) -> UUID:
    """Create or update the deployment ``ingest/<name>`` on ``work_pool`` (no schedule: runs are submitted
    with ``run_deployment`` or ``prefect deployment run``, parameters ``source``, ``options`` (a dict of
    ingest options, e.g. ``{"smoke": false}``) and ``gpu_pool``). ``home``: the store its runs ingest into
    (a folder or ``s3://bucket/prefix``; default: each worker's ``MODELYARD_STORE``). Returns its id.
    Raises :class:`DeployError` naming the pool when the Prefect API refuses."""
    return _deploy(ingest_flow, "ingest", name, work_pool, image=image, parameters=_store_param(home),
                   job_variables=job_variables or {}, tags=["modelyard", "ingest"],
                   description="modelyard ingest: one SOURCE into the shared store")


#: the names of the two automations :func:`ensure_crash_recovery` keeps, per deployment id
ZOMBIE_AUTOMATION = "modelyard: crash silent runs of {deployment}"
RETRY_AUTOMATION = "modelyard: reschedule crashed runs of {deployment}"


def ensure_crash_recovery(deployment_id: UUID, *, within: float = 90.0) -> tuple[UUID, UUID]:
    """Create (or replace) the two automations that recover the runs of the deployment ``deployment_id``
    from a lost worker (module doc): a run that emitted a heartbeat and then nothing for ``within``
    seconds (at least two heartbeat periods; Prefect's heartbeat is at least 30 s) is set ``Crashed``;
    a ``Crashed`` run is set ``Scheduled`` (``AwaitingRetry``). Both match only that deployment's runs
    (the related resource ``prefect.deployment.<id>``). Returns their ids. Raises :class:`DeployError`
    when the Prefect API refuses."""
    from prefect.automations import Automation  # noqa: PLC0415 - heavy: prefect, imported on first use
    from prefect.client.schemas.objects import StateType  # noqa: PLC0415 - heavy: prefect, imported on first use
    from prefect.events.actions import ChangeFlowRunState  # noqa: PLC0415 - heavy: prefect, imported on first use
    from prefect.events.schemas.automations import EventTrigger, Posture  # noqa: PLC0415 - heavy: prefect, imported on first use

    if within < 60:
        raise InvalidTargetError(f"crash detection after {within} s would fire between two heartbeats (30 s at least)",
                                 fix="Use 60 s or more (two heartbeat periods of PREFECT_FLOWS_HEARTBEAT_FREQUENCY).")
    runs = {"prefect.resource.id": "prefect.flow-run.*"}
    of_deployment = {"prefect.resource.role": "deployment", "prefect.resource.id": f"prefect.deployment.{deployment_id}"}
    zombie = Automation(
        name=ZOMBIE_AUTOMATION.format(deployment=deployment_id),
        description="A run of this deployment stopped sending heartbeats: its worker is gone. Mark it Crashed.",
        trigger=EventTrigger(
            after={"prefect.flow-run.heartbeat"},
            expect={"prefect.flow-run.heartbeat", "prefect.flow-run.Completed", "prefect.flow-run.Failed",
                    "prefect.flow-run.Cancelled", "prefect.flow-run.Crashed"},
            match=runs, match_related=of_deployment, for_each={"prefect.resource.id"},
            posture=Posture.Proactive, threshold=1, within=timedelta(seconds=within)),
        actions=[ChangeFlowRunState(state=StateType.CRASHED,
                                    message=f"no heartbeat for {within:.0f} s: the worker running it was lost")])
    retry = Automation(
        name=RETRY_AUTOMATION.format(deployment=deployment_id),
        description="A run of this deployment crashed: schedule it again for any worker of the pool.",
        trigger=EventTrigger(expect={"prefect.flow-run.Crashed"}, match=runs, match_related=of_deployment,
                             for_each={"prefect.resource.id"}, posture=Posture.Reactive, threshold=1),
        actions=[ChangeFlowRunState(state=StateType.SCHEDULED, name="AwaitingRetry",
                                    message="rescheduled after a crash; another worker of the pool picks it up")])
    # Prefect's async_dispatch methods are annotated as (or as possibly) coroutines; called outside an event
    # loop, as here, they return the automation itself
    ids: list[UUID] = []
    try:
        for automation in (zombie, retry):
            with contextlib.suppress(ValueError):  # not there yet
                cast(Automation, Automation.read(name=automation.name)).delete()
            created = cast(Automation, automation.create())
            assert created.id is not None  # the server gave it one
            ids.append(created.id)
    except Exception as exc:  # noqa: BLE001 - httpx and Prefect errors
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DeployError(f"cannot create the crash-recovery automations of deployment {deployment_id}: {msg}",
                          fix="Check PREFECT_API_URL (automations need a Prefect server, not the ephemeral API).") from exc
    return ids[0], ids[1]
