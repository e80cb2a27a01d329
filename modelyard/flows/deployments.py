"""Deployments: the ``watch`` flow on a cron schedule, run by a Prefect worker.

The deployment points at the flow by module path (``modelyard.flows.watch.watch_flow``), so a worker
needs only modelyard installed: a *process* worker on a host with ``pip install modelyard``, or a
*docker* / *kubernetes* worker with an image that has it (``--image``; nothing is built or pushed).
Overlapping watch runs are prevented by a deployment concurrency limit of 1; GPU-bound ingests share
a GPU pool through the global concurrency limit ``gpu-<pool>`` (see :mod:`modelyard.flows.watch`).
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any
from uuid import UUID

from modelyard.errors import DeployError, InvalidTargetError, ModelyardError
from modelyard.flows.watch import load_config, watch_flow


def deploy_watch(config: Path, *, work_pool: str, cron: str, name: str = "watch", home: str | None = None,
                 image: str | None = None, job_variables: dict[str, Any] | None = None,
                 timezone: str | None = None) -> UUID:
    """Create or update the deployment ``watch/<name>``; returns its id."""
    from prefect.client.schemas.schedules import CronSchedule  # noqa: PLC0415 - heavy: prefect, imported on first use
    from prefect.deployments.runner import EntrypointType  # noqa: PLC0415 - heavy: prefect, imported on first use


    config = Path(config).absolute()
    load_config(config)  # fail on a bad config now, not at 3 a.m. on the worker
    try:
        CronSchedule(cron=cron, timezone=timezone or "UTC")
    except ValueError as exc:

        raise InvalidTargetError(f"--cron {cron!r} is not a valid cron expression: {exc}") from exc
    params: dict[str, Any] = {"config": str(config)}
    if home:
        params["home"] = str(Path(home).absolute())

    try:
        # Prefect prints its own deployments table on stdout; the CLI prints ours.
        with contextlib.redirect_stdout(io.StringIO()):
            return watch_flow.deploy(
                name=name, work_pool_name=work_pool, image=image, build=False, push=False,
                schedules=[CronSchedule(cron=cron, timezone=timezone or "UTC")], parameters=params,
                job_variables=job_variables or {}, concurrency_limit=1, tags=["modelyard", "watch"],
                description=f"modelyard watch of {config}", entrypoint_type=EntrypointType.MODULE_PATH,
                print_next_steps=False, ignore_warnings=True)
    except ModelyardError:
        raise
    except Exception as exc:  # noqa: BLE001 - Prefect raises ValueError/ObjectNotFound/httpx errors here
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DeployError(f"cannot create the deployment watch/{name} on work pool {work_pool!r}: {msg}",
                          fix=f"Check PREFECT_API_URL, and create the pool first: prefect work-pool create {work_pool} "
                              "--type process") from exc
