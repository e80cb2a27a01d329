"""rollout: shift traffic to a canary behind the generated nginx front, step by step, with rollback."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer
from rich.markup import escape

from modelyard.artifact.layout import model_root
from modelyard.cli._choices import Serve
from modelyard.cli._common import emit_json, err, json_option, out, quiet_libraries, store_option, stored_path, verbose_option, working
from modelyard.cli._options import STAGE_OPTIONS, stage_flags
from modelyard.errors import MissingConfigError, RolledBackError
from modelyard.model.modes import DEFAULT_SERVE, check_mode
from modelyard.settings import Settings
from modelyard.stages import rollout as ro
from modelyard.stages.serve.canary import parse_steps
from modelyard.stages.serve.options import RolloutFlags
from modelyard.stages.smoke import bench


@stage_flags(RolloutFlags)
def rollout_cmd(  # noqa: PLR0913
    canary: str = typer.Argument(..., help="the canary artifact (folder or NAME[@REVISION]): what the vllm-canary "
                                           "server serves"),
    serve_dir: Path = typer.Option(Path("serve"), "--serve", help="the canary form of serve/ (written by `serve-plan "
                                   "STABLE --canary CANARY -o DIR`: DIR/serve)"),
    options: dict[str, Any] = STAGE_OPTIONS,
    slo: Optional[str] = typer.Option(None, "--slo", help="SLO targets of the canary's bench at each step, "
                                      "key=value,... (as `smoke --slo`)"),
    slo_class: Optional[str] = typer.Option(None, "--slo-class", help="the GPU class whose default targets apply "
                                            "(default: the runtime's device)"),
    serve: Optional[Serve] = typer.Option(None, "--mode", help="chat or completion (default: chat)"),
    store: Optional[str] = store_option("the store CANARY names an artifact of"),
    as_json: bool = json_option("the rollout: passed, percent, rolled_back, steps (each with the canary's smoke), reason"),
    verbose: bool = verbose_option(),
) -> None:
    """Roll the canary out behind the nginx front in --steps: at each, nginx gets the weights
    (serve/canary/upstream.conf) and reloads, the front must answer, the canary is judged at --canary-url
    by the server smoke (API, stop, golden prompts, numerical gate) and the bench load against the --slo
    targets, then bakes for --bake seconds under the front's real traffic (its /health, its 5xx answers). Any
    failure of a step (a gate, an error, --step-timeout, SIGTERM) sends all traffic back to the stable server
    first. serve/canary/rollout.json records each state: --resume continues a killed rollout, --rollback ends
    one. Exit 0 when the canary reached the last step (or --rollback is done), 1 when it was rolled back, 2 for
    bad input, an unfinished rollout on record, or when nginx cannot be reloaded."""
    quiet_libraries(verbose)
    with working(as_json):
        f = RolloutFlags(**options)
        if f.rollback:
            res = ro.rollback(serve_dir, reload=None if f.reload == ro.DEFAULT_RELOAD else f.reload)
            if as_json:
                emit_json(res.to_dict())
                return
            out.print(f"all traffic to the stable server: {escape(str(res.reason))}", highlight=False)
            return
        plan_steps = parse_steps(f.steps)
        targets = bench.parse_slo(slo)
        cls = bench.slo_class(slo_class) if slo_class else None
        mode = check_mode(serve or DEFAULT_SERVE)
        model_dir = model_root(stored_path(Path(canary), store))
        if not (model_dir / "config.json").is_file():
            raise MissingConfigError(f"{model_dir}/config.json does not exist", fix="Pass the canary artifact's folder.")

        def show(s: ro.RolloutStep) -> None:
            if not as_json:
                out.print(f"{'ok ' if s.passed else 'FAIL'} {s.percent:3d} % canary ({s.seconds} s)"
                          + (f": {escape(', '.join(s.failed))}" if s.failed else ""), highlight=False)

        res = ro.rollout(model_dir, serve_dir, Settings(), steps=plan_steps, canary_url=f.canary_url, front_url=f.front,
                         reload=f.reload, stable_server=f.stable_server, canary_server=f.canary_server, slo=targets,
                         slo_class=cls, mode=mode, bake_seconds=f.bake, step_timeout=f.step_timeout,
                         resume=f.resume, on_step=show)
    if as_json:
        emit_json(res.to_dict(), exit_code=0 if res.passed else 1,
                  error=None if res.passed else RolledBackError(f"rolled back to the stable server: {res.reason}",
                                                               fix="See steps[-1].smoke for what the canary failed."))
        return
    if res.passed:
        out.print(f"canary at {res.percent} % of traffic (history: {escape(str(res.history))})", highlight=False)
    else:
        err.print(f"[bold red]rolled back[/] to the stable server: {escape(str(res.reason))}", highlight=False)
    raise typer.Exit(0 if res.passed else 1)
