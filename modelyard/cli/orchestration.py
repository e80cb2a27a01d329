"""watch, promote, approve and deploy: Prefect orchestration."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Optional

import typer
from rich.markup import escape
from rich.table import Table

from modelyard.cli._choices import RequiredSmoke
from modelyard.cli._common import (
    VERBOSE_HELP,
    alias_option,
    either,
    emit_json,
    json_option,
    out,
    quiet_libraries,
    store_option,
    verbose_option,
    working,
)
from modelyard.errors import verdict


def _watch_table(decisions: list[dict[str, Any]]) -> None:

    t = Table(show_lines=False)
    for c in ("repo", "revision", "commit", "action", "reason"):
        t.add_column(c, overflow="fold")
    for d in decisions:
        color = {"ingested": "green", "skipped": "yellow", "failed": "red"}.get(d["action"], "")
        t.add_row(escape(d["repo"]), escape(d["revision"]), (d["commit"] or "")[:12],
                  f"[{color}]{d['action']}[/]" if color else d["action"], escape(d["reason"]))
    out.print(t)


def watch(
    config: Path = typer.Option(..., "--config", help="watch YAML: repos with branch, name and ingest options"),
    store: Optional[str] = store_option(),
    out_dir: Optional[str] = alias_option("--out"),
    once: bool = typer.Option(False, "--once", help="check every repo once and exit (for cron / a deployment)"),
    interval: int = typer.Option(600, "--interval", min=1, help="seconds between checks without --once"),
    as_json: bool = json_option("{decisions: [{repo, revision, commit, action, reason, changed, ...}]}"),
    verbose: bool = verbose_option(VERBOSE_HELP),
) -> None:
    """Ingest new commits of the repos in CONFIG when their weights, config, tokenizer or chat template
    changed; other changes (README, docs) are recorded and skipped. Exit 1 if an ingest failed."""

    quiet_libraries(verbose)
    store = either(store, out_dir, "--store")
    while True:
        with working(as_json):
            from modelyard.flows.watch import load_config, watch_flow  # noqa: PLC0415 - heavy: prefect, via the flows, imported on first use

            load_config(config)  # bad config is bad usage: fail before any run is created
            decisions = [d.to_dict() for d in watch_flow(str(config.absolute()), str(store) if store else None)]
        failed = [d for d in decisions if d["action"] == "failed"]
        if as_json:  # one envelope per round (with --once, the only one)
            emit_json({"decisions": decisions}, exit_code=1 if failed else 0, error=_watch_error(failed) if failed else None,
                      final=once)
        else:
            _watch_table(decisions)
        if once:
            raise typer.Exit(1 if failed else 0)
        time.sleep(interval)


def promote(
    ref: str = typer.Argument(..., help="NAME@REVISION of an artifact in the staging store"),
    to: list[str] = typer.Option(..., "--to", help="target store: a folder or s3://BUCKET/PREFIX (repeatable)"),
    from_dir: Optional[str] = typer.Option(None, "--from", help="staging store: a folder or s3://BUCKET/PREFIX "
                                                                "(default: MODELYARD_STORE, else MODELYARD_HOME or ./artifacts)"),
    timeout: int = typer.Option(3600, "--timeout", min=1, help="seconds to wait for approval before failing"),
    require_smoke: RequiredSmoke = typer.Option("load", "--require-smoke",
                                                help="the vLLM smoke level the artifact must have passed"),
    no_smoke_required: bool = typer.Option(False, "--no-smoke-required",
                                           help="promote without vLLM smoke evidence (e.g. an artifact ingested with --no-smoke)"),
    as_json: bool = json_option("{promotion: the record, placed: the artifact folders written}"),
    verbose: bool = verbose_option(VERBOSE_HELP),
) -> None:
    """Promote a stored artifact to target store(s) once approved (`modelyard approve RUN_ID --by NAME`).
    Needs a Prefect server (PREFECT_API_URL) that the approver can reach."""
    quiet_libraries(verbose)
    from prefect.exceptions import FlowPauseTimeout  # noqa: PLC0415 - heavy: prefect, imported on first use

    from modelyard.flows.promote import (  # noqa: PLC0415 - heavy: prefect, via the flows, imported on first use
        PromotionRejectedError,
        parse_ref,
        promote_flow,
    )

    parse_ref(ref)
    try:
        result = promote_flow(ref, list(to), from_dir, timeout,
                              require_smoke=None if no_smoke_required else require_smoke)
    except FlowPauseTimeout as exc:
        raise PromotionRejectedError(f"nobody approved the promotion of {ref} within {timeout} s; nothing was promoted",
                                     fix="Start it again and answer with `modelyard approve RUN_ID --by NAME`.") from exc
    if as_json:
        emit_json(result.to_dict())
    else:
        p = result.promotion
        out.print(f"[bold green]promoted[/] {escape(ref)} (approved by {escape(p.approved_by or '')} at {p.approved_at})",
                  highlight=False)
        for d in result.placed:
            out.print(f"  -> {escape(d)}", highlight=False, soft_wrap=True)


def approve(
    run_id: str = typer.Argument(..., help="the flow run id printed by `modelyard promote`"),
    by: str = typer.Option(..., "--by", help="who approves (recorded in the manifest)"),
    reject: bool = typer.Option(False, "--reject", help="reject instead: the promote run fails, nothing is promoted"),
    note: str = typer.Option("", "--note", help="a note recorded with the decision"),
    as_json: bool = json_option("{run_id, approved, by}"),
    verbose: bool = verbose_option(),
) -> None:
    """Answer a paused promote run headlessly (through PREFECT_API_URL)."""
    quiet_libraries(verbose)
    from modelyard.flows.promote import approve as approve_run  # noqa: PLC0415 - heavy: prefect, via the flows, imported on first use

    approve_run(run_id, by=by, approved=not reject, note=note)
    if as_json:
        emit_json({"run_id": run_id, "approved": not reject, "by": by})
    else:
        out.print(f"{'approved' if not reject else 'rejected'} flow run {run_id} as {escape(by)}", highlight=False)


def deploy(  # noqa: PLR0913
    config: Path = typer.Option(..., "--config", help="watch YAML (its absolute path must be readable by the worker)"),
    pool: str = typer.Option(..., "--pool", help="Prefect work pool (process, docker or kubernetes)"),
    cron: str = typer.Option("*/30 * * * *", "--cron", help="schedule of the watch runs (cron, UTC by default)"),
    timezone: Optional[str] = typer.Option(None, "--timezone", help="IANA timezone of the cron schedule"),
    name: str = typer.Option("watch", "--name", help="deployment name (watch/NAME)"),
    store: Optional[str] = store_option("store the worker ingests into: a folder or s3://BUCKET/PREFIX"),
    out_dir: Optional[str] = alias_option("--out"),
    image: Optional[str] = typer.Option(None, "--image", help="image with modelyard installed (docker/kubernetes pools)"),
    as_json: bool = json_option("{deployment_id, name, pool, cron}"),
    verbose: bool = verbose_option(),
) -> None:
    """Create (or update) a Prefect deployment running `watch` on a cron schedule (PREFECT_API_URL)."""
    quiet_libraries(verbose)
    from modelyard.flows.deployments import deploy_watch  # noqa: PLC0415 - heavy: prefect, via the flows, imported on first use

    store = either(store, out_dir, "--store")
    dep_id = deploy_watch(config, work_pool=pool, cron=cron, name=name, home=str(store) if store else None,
                          image=image, timezone=timezone)
    if as_json:
        emit_json({"deployment_id": str(dep_id), "name": f"watch/{name}", "pool": pool, "cron": cron})
    else:
        out.print(f"deployment watch/{escape(name)} ({dep_id}) on pool {escape(pool)}, cron {escape(cron)}", highlight=False)
        out.print(f"start a worker: prefect worker start --pool {escape(pool)}", highlight=False)


def _watch_error(failed: list[dict[str, Any]]) -> dict[str, Any]:
    """The envelope's ``error`` of a watch round where ingests failed: type ``IngestFailed``, naming each
    repo@revision and its reason."""
    return verdict("IngestFailed", "; ".join(f"{d['repo']}@{d['revision']}: {d['reason']}" for d in failed),
                         "Each failed decision in result.decisions says why; fix it and the next round retries.")


def deploy_ingest(
    pool: str = typer.Option(..., "--pool", help="Prefect work pool whose workers run the ingests (process, docker or kubernetes)"),
    name: str = typer.Option("ingest", "--name", help="deployment name (ingest/NAME)"),
    store: Optional[str] = store_option("store the runs ingest into: a folder or s3://BUCKET/PREFIX "
                                        "(default: each worker's MODELYARD_STORE, else its MODELYARD_HOME)"),
    image: Optional[str] = typer.Option(None, "--image", help="image with modelyard installed (docker/kubernetes pools)"),
    crash_after: int = typer.Option(90, "--crash-after", min=0,
                                    help="seconds without a heartbeat after which a run's worker counts as lost: the run "
                                         "is marked Crashed and scheduled again for another worker (60 or more; "
                                         "0: no recovery automations)"),
    as_json: bool = json_option("{deployment_id, name, pool, automations}"),
    verbose: bool = verbose_option(),
) -> None:
    """Create (or update) the deployment ingest/NAME for many workers sharing one store, and the automations
    that give a lost worker's runs to another (PREFECT_API_URL; workers need PREFECT_FLOWS_HEARTBEAT_FREQUENCY)."""
    quiet_libraries(verbose)
    from modelyard.flows.deployments import deploy_ingest as deploy_it  # noqa: PLC0415 - heavy: prefect, via the flows, imported on first use
    from modelyard.flows.deployments import ensure_crash_recovery  # noqa: PLC0415 - heavy: prefect, via the flows, imported on first use

    dep_id = deploy_it(work_pool=pool, name=name, home=store, image=image)
    automations = [str(a) for a in ensure_crash_recovery(dep_id, within=crash_after)] if crash_after else []
    if as_json:
        emit_json({"deployment_id": str(dep_id), "name": f"ingest/{name}", "pool": pool, "automations": automations})
        return
    out.print(f"deployment ingest/{escape(name)} ({dep_id}) on pool {escape(pool)}", highlight=False)
    if automations:
        out.print(f"crash recovery: runs silent for {crash_after} s are marked Crashed and scheduled again "
                  f"(automations {', '.join(automations)})", highlight=False, soft_wrap=True)
    out.print(f"start workers: PREFECT_FLOWS_HEARTBEAT_FREQUENCY=30 prefect worker start --pool {escape(pool)}", highlight=False)
    out.print(f"submit a run:  prefect deployment run ingest/{escape(name)} -p source=hf://org/name@main", highlight=False)
