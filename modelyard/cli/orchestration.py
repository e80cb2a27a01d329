"""watch, promote, approve and deploy: Prefect orchestration."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Optional

import typer
from rich.markup import escape
from rich.table import Table

from modelyard.artifact.identity import SMOKE_LEVEL_RANK
from modelyard.cli._common import (
    VERBOSE_HELP,
    _quiet_libraries,
    alias_option,
    either,
    json_option,
    out,
    store_option,
    verbose_option,
    working,
)
from modelyard.errors import InvalidTargetError


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
    store: Optional[Path] = store_option(),
    out_dir: Optional[Path] = alias_option("--out"),
    once: bool = typer.Option(False, "--once", help="check every repo once and exit (for cron / a deployment)"),
    interval: int = typer.Option(600, "--interval", min=1, help="seconds between checks without --once"),
    as_json: bool = json_option("print the decisions as JSON on stdout"),
    verbose: bool = verbose_option(VERBOSE_HELP),
) -> None:
    """Ingest new commits of the repos in CONFIG when their weights, config, tokenizer or chat template
    changed; other changes (README, docs) are recorded and skipped. Exit 1 if an ingest failed."""

    _quiet_libraries(verbose)
    store = either(store, out_dir, "--store")
    while True:
        with working(as_json):
            from modelyard.flows.watch import load_config, watch_flow  # noqa: PLC0415 - heavy: prefect, via the flows, imported on first use

            load_config(config)  # bad config is bad usage: fail before any run is created
            decisions = [d.to_dict() for d in watch_flow(str(config.absolute()), str(store) if store else None)]
        if as_json:
            out.print_json(json.dumps({"ok": all(d["action"] != "failed" for d in decisions), "decisions": decisions}))
        else:
            _watch_table(decisions)
        if once:
            raise typer.Exit(1 if any(d["action"] == "failed" for d in decisions) else 0)
        time.sleep(interval)


def promote(
    ref: str = typer.Argument(..., help="NAME@REVISION of an artifact in the staging store"),
    to: list[Path] = typer.Option(..., "--to", help="target store folder (repeatable)"),
    from_dir: Optional[Path] = typer.Option(None, "--from", help="staging store (default: MODELYARD_HOME or ./artifacts)"),
    timeout: int = typer.Option(3600, "--timeout", min=1, help="seconds to wait for approval before failing"),
    require_smoke: str = typer.Option("load", "--require-smoke",
                                      help="the vLLM smoke level the artifact must have passed: load, server or bench"),
    no_smoke_required: bool = typer.Option(False, "--no-smoke-required",
                                           help="promote without vLLM smoke evidence (e.g. an artifact ingested with --no-smoke)"),
    as_json: bool = json_option("print the promotion record as JSON on stdout"),
    verbose: bool = verbose_option(VERBOSE_HELP),
) -> None:
    """Promote a stored artifact to target store(s) once approved (`modelyard approve RUN_ID --by NAME`).
    Needs a Prefect server (PREFECT_API_URL) that the approver can reach."""
    _quiet_libraries(verbose)
    from prefect.exceptions import FlowPauseTimeout  # noqa: PLC0415 - heavy: prefect, imported on first use

    from modelyard.flows.promote import (  # noqa: PLC0415 - heavy: prefect, via the flows, imported on first use
        PromotionRejectedError,
        parse_ref,
        promote_flow,
    )

    parse_ref(ref)
    if require_smoke not in SMOKE_LEVEL_RANK:
        raise InvalidTargetError(f"--require-smoke {require_smoke!r} is not a smoke level",
                                 fix=f"Use one of: {', '.join(SMOKE_LEVEL_RANK)}.")
    try:
        result = promote_flow(ref, [str(t) for t in to], str(from_dir) if from_dir else None, timeout,
                              require_smoke=None if no_smoke_required else require_smoke)
    except FlowPauseTimeout as exc:
        raise PromotionRejectedError(f"nobody approved the promotion of {ref} within {timeout} s; nothing was promoted",
                                     fix="Start it again and answer with `modelyard approve RUN_ID --by NAME`.") from exc
    if as_json:
        out.print_json(json.dumps({"ok": True, **result}, default=str))
    else:
        p = result["promotion"]
        out.print(f"[bold green]promoted[/] {escape(ref)} (approved by {escape(p['approved_by'])} at {p['approved_at']})",
                  highlight=False)
        for d in result["placed"]:
            out.print(f"  -> {escape(d)}", highlight=False, soft_wrap=True)


def approve(
    run_id: str = typer.Argument(..., help="the flow run id printed by `modelyard promote`"),
    by: str = typer.Option(..., "--by", help="who approves (recorded in the manifest)"),
    reject: bool = typer.Option(False, "--reject", help="reject instead: the promote run fails, nothing is promoted"),
    note: str = typer.Option("", "--note", help="a note recorded with the decision"),
    as_json: bool = json_option(None),
    verbose: bool = verbose_option(),
) -> None:
    """Answer a paused promote run headlessly (through PREFECT_API_URL)."""
    _quiet_libraries(verbose)
    from modelyard.flows.promote import approve as approve_run  # noqa: PLC0415 - heavy: prefect, via the flows, imported on first use

    approve_run(run_id, by=by, approved=not reject, note=note)
    if as_json:
        out.print_json(json.dumps({"ok": True, "run_id": run_id, "approved": not reject, "by": by}))
    else:
        out.print(f"{'approved' if not reject else 'rejected'} flow run {run_id} as {escape(by)}", highlight=False)


def deploy(
    config: Path = typer.Option(..., "--config", help="watch YAML (its absolute path must be readable by the worker)"),
    pool: str = typer.Option(..., "--pool", help="Prefect work pool (process, docker or kubernetes)"),
    cron: str = typer.Option("*/30 * * * *", "--cron", help="schedule of the watch runs (cron, UTC by default)"),
    timezone: Optional[str] = typer.Option(None, "--timezone", help="IANA timezone of the cron schedule"),
    name: str = typer.Option("watch", "--name", help="deployment name (watch/NAME)"),
    store: Optional[Path] = store_option("store folder the worker ingests into"),
    out_dir: Optional[Path] = alias_option("--out"),
    image: Optional[str] = typer.Option(None, "--image", help="image with modelyard installed (docker/kubernetes pools)"),
    as_json: bool = json_option(None),
    verbose: bool = verbose_option(),
) -> None:
    """Create (or update) a Prefect deployment running `watch` on a cron schedule (PREFECT_API_URL)."""
    _quiet_libraries(verbose)
    from modelyard.flows.deployments import deploy_watch  # noqa: PLC0415 - heavy: prefect, via the flows, imported on first use

    store = either(store, out_dir, "--store")
    dep_id = deploy_watch(config, work_pool=pool, cron=cron, name=name, home=str(store) if store else None,
                          image=image, timezone=timezone)
    if as_json:
        out.print_json(json.dumps({"ok": True, "deployment_id": str(dep_id), "name": f"watch/{name}", "pool": pool,
                                   "cron": cron}))
    else:
        out.print(f"deployment watch/{escape(name)} ({dep_id}) on pool {escape(pool)}, cron {escape(cron)}", highlight=False)
        out.print(f"start a worker: prefect worker start --pool {escape(pool)}", highlight=False)
