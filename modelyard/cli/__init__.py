"""The ``modelyard`` command: parse, call, render, exit code. Thin on purpose.

Exit codes: 0 success; 1 a gate failed (verification errors, hash mismatch, smoke failure);
2 bad usage or unreadable input (missing source, no config.json, unreachable endpoint, pickle-only
weights, store conflict); 3 an internal error; 130 interrupted.

Every command is a :class:`~modelyard.cli._common.Command`: a command raises, and that one handler prints
the failure (one line, or one JSON object with --json) and picks the exit code.

One module a concern: ``_common`` (consoles, progress, the failure handler, shared options), ``ingest``, ``checks``
(verify, patch, quantize), ``serving`` (smoke, serve-plan, doctor), ``upgrade`` (upgrade-check), ``rollout``,
``artifacts`` (bundle ... show), ``orchestration`` (watch ... deploy) and ``server`` (server start, stop, status).
Commands are registered here, in the order ``--help`` lists them. Heavy modules are imported inside the commands, so
that ``modelyard --help`` stays fast.
"""

from __future__ import annotations

import os
import signal
import sys

import typer

from modelyard.cli import artifacts, checks, ingest, orchestration, rollout, server, serving, upgrade
from modelyard.cli._common import Command
from modelyard.cli.ingest import demo_gguf_path
from modelyard.version import __version__

__all__ = ["app", "demo_gguf_path", "main"]

app = typer.Typer(no_args_is_help=True, add_completion=True, pretty_exceptions_enable=False, rich_markup_mode=None,
                  context_settings={"help_option_names": ["--help", "-h"]},
                  help="Turn an LLM checkpoint into a verified, servable artifact for vLLM.")


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"modelyard {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True, expose_value=False,
                                 help="print the version and exit"),
) -> None:
    pass


for _name, _command in (
    ("ingest", ingest.ingest),
    ("verify", checks.verify),
    ("patch", checks.patch_cmd),
    ("quantize", checks.quantize_cmd),
    ("smoke", serving.smoke_cmd),
    ("upgrade-check", upgrade.upgrade_check_cmd),
    ("serve-plan", serving.serve_plan_cmd),
    ("bundle", artifacts.bundle_cmd),
    ("unbundle", artifacts.unbundle_cmd),
    ("doctor", serving.doctor),
    ("rollout", rollout.rollout_cmd),
    ("publish", artifacts.publish_cmd),
    ("pull", artifacts.pull_cmd),
    ("sign", artifacts.sign_cmd),
    ("verify-signature", artifacts.verify_signature_cmd),
    ("list", artifacts.list_cmd),
    ("show", artifacts.show_cmd),
    ("bom", artifacts.bom_cmd),
    ("demo", ingest.demo),
    ("watch", orchestration.watch),
    ("promote", orchestration.promote),
    ("approve", orchestration.approve),
    ("deploy", orchestration.deploy),
    ("deploy-ingest", orchestration.deploy_ingest),
):
    app.command(_name, cls=Command)(_command)
app.add_typer(server.app, name="server")


#: the termination signals received (SIGTERM, SIGHUP): the command then ends without waiting for background work
_SIGNALLED: list[int] = []


def _interrupted(signum: int, _frame: object) -> None:
    _SIGNALLED.append(signum)
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main() -> None:
    """The ``modelyard`` command. SIGTERM and SIGHUP end it as Ctrl-C does (exit 130, "interrupted"): the
    ``finally`` blocks run, so a vLLM server it started (in its own process group) is stopped instead of being left
    to PID 1, and temp folders are removed. Python's default for SIGTERM ends the process with no clean-up. Once
    the failure is printed, background threads (the numerical gate's early reference computation, a warm-up
    import) are abandoned, not joined: the interpreter's exit would otherwise wait for them for minutes."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupted)
    try:
        app()
    except SystemExit as exc:
        if _SIGNALLED:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(exc.code if isinstance(exc.code, int) else 130)
        raise
