"""What every command shares: the stdout/stderr consoles, stage progress on stderr, quiet libraries,
turning a failure into one line (or one JSON object) and an exit code, and the option definitions
several commands must agree on (``--serve``)."""

from __future__ import annotations

import json
import os
from typing import Any

import typer
from rich.console import Console
from rich.filesize import decimal
from rich.markup import escape
from rich.progress import (
    BarColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

from modelyard import progress
from modelyard.errors import ModelyardError, VerificationFailedError
from modelyard.model.modes import DEFAULT_SERVE

# Our own handle on the terminal's stderr: libraries that print progress bars and warnings to fd 2 are
# silenced during long stages (pipeline.quantize._quiet_libraries) while this console keeps reporting.
try:
    _ERR_FILE = os.fdopen(os.dup(2), "w", buffering=1, encoding="utf-8", errors="replace")
except OSError:  # no stderr (a daemon): let rich pick
    _ERR_FILE = None
err = Console(file=_ERR_FILE, stderr=_ERR_FILE is None)
out = Console()


#: ``--help`` text of ``--serve``: ``ingest`` and ``verify`` judge the same folder the same way by default
SERVE_HELP = (f"how it will be served: chat (needs a chat template) or completion (plain-text prompts); "
              f"default: {DEFAULT_SERVE}; use --serve completion for a base model")


def serve_option() -> Any:
    """The ``--serve`` option of ``ingest`` and ``verify`` (one definition, one default:
    :data:`~modelyard.model.modes.DEFAULT_SERVE`). The value is validated by ``Target.create``
    (exit 2 naming the accepted modes), so a bad value fails the same way in every command."""
    return typer.Option(DEFAULT_SERVE, "--serve", help=SERVE_HELP, show_default=False)


class _AmountColumn(ProgressColumn):
    """Bytes as sizes, files as counts, indeterminate work as 'done' when finished."""

    def render(self, task):  # noqa: ANN001, ANN201

        unit = task.fields.get("unit")
        if task.fields.get("spin") or task.total is None:
            return Text("done" if task.finished else "")
        if unit == "B":
            return Text(f"{decimal(int(task.completed))}/{decimal(int(task.total))}")
        return Text(f"{int(task.completed)}/{int(task.total)} {unit}")


class _RichReporter:
    """progress.Reporter drawing rich bars on stderr; one live display for the whole command."""

    def __init__(self, console: Console) -> None:
        self.p = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(bar_width=16), _AmountColumn(),
                          TimeElapsedColumn(), console=console, transient=False)
        self.p.start()

    def start(self, description: str, total: float | None, unit: str) -> object:
        return self.p.add_task(description, total=total, unit=unit, spin=total is None)

    def advance(self, handle: object, amount: float) -> None:
        self.p.advance(handle, amount)  # type: ignore[arg-type]

    def finish(self, handle: object) -> None:
        task = next(t for t in self.p.tasks if t.id == handle)
        if task.total is None:
            self.p.update(handle, total=1, completed=1)  # type: ignore[arg-type]
        else:
            self.p.update(handle, completed=task.total)  # type: ignore[arg-type]

    def close(self) -> None:
        self.p.stop()


def _quiet_libraries(verbose: bool) -> None:
    """Keep Prefect/transformers/huggingface_hub logs and tracebacks off the user's terminal."""
    if not verbose:
        # Forced, not defaulted: Prefect logs a failed run's traceback at ERROR level, and the user
        # gets one line from us instead. --verbose shows Prefect's own logs.
        os.environ["PREFECT_LOGGING_LEVEL"] = "CRITICAL"
        os.environ["PREFECT_LOGGING_LOG_PRINTS"] = "false"
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # Prefect's ephemeral API server gets 20 s to start; a first run (database migrations) on a busy
    # 2-core host took longer and failed with "Timed out while attempting to connect".
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")


def _fail(exc: BaseException, as_json: bool) -> None:

    if isinstance(exc, ModelyardError):
        code = exc.exit_code
        kind = type(exc).__name__
        report = getattr(exc, "report", None) if isinstance(exc, VerificationFailedError) else None
        if as_json:
            payload: dict[str, Any] = {"ok": False, "error": kind, "message": exc.message, "fix": exc.fix}
            if report is not None:
                payload["report"] = report.to_dict()
            out.print_json(json.dumps(payload, default=str))
        else:
            if report is not None:
                _findings_table(report)
            err.print(f"[bold red]error:[/] {escape(exc.message)}", highlight=False, soft_wrap=True)
            if exc.fix:
                err.print(f"[bold]fix:[/] {escape(exc.fix)}", highlight=False, soft_wrap=True)
        raise typer.Exit(code)
    if isinstance(exc, KeyboardInterrupt):
        err.print("interrupted")
        raise typer.Exit(130)
    msg = f"internal error: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    if as_json:
        out.print_json(json.dumps({"ok": False, "error": "InternalError", "message": msg}))
    else:
        err.print(f"[bold red]{escape(msg)}[/] (re-run with --verbose for details)", highlight=False)
    raise typer.Exit(3)


def _findings_table(report) -> None:  # noqa: ANN001
    """One finding per block: severity, code, file/field, message, then the fix (wraps cleanly)."""
    colors = {"error": "red", "warning": "yellow", "info": "cyan"}
    for f in report.findings:
        where = f.file or ""
        if f.field:
            where += f" [{f.field}]" if where else f.field
        err.print(f"[{colors[f.severity.value]}]{f.severity.value:<7}[/] [bold]{escape(f.code)}[/]  {escape(where)}",
                  highlight=False, soft_wrap=True)
        err.print(f"        {escape(f.message)}", highlight=False, soft_wrap=True)
        if f.fix:
            err.print(f"        fix: {escape(f.fix)}", highlight=False, soft_wrap=True)


def _start_progress(as_json: bool) -> _RichReporter | None:
    """Route stage progress to a rich reporter on stderr (none with --json); pair with _stop_progress."""

    reporter = None if as_json else _RichReporter(err)
    progress.set_reporter(reporter)
    return reporter


def _stop_progress(reporter: _RichReporter | None) -> None:

    progress.set_reporter(None)
    if reporter is not None:
        reporter.close()


def _guard(as_json: bool, verbose: bool, fn):  # noqa: ANN001, ANN202
    """Run ``fn`` with progress on stderr; every failure becomes one line and an exit code."""
    reporter = _start_progress(as_json)
    try:
        return fn()
    except typer.Exit:
        raise
    except BaseException as exc:  # noqa: BLE001
        if verbose:
            err.print_exception()
        _fail(exc, as_json)
    finally:
        _stop_progress(reporter)


def _human(n: int) -> str:

    return decimal(n)
