"""What every command shares: the stdout/stderr consoles, stage progress on stderr (:func:`working`),
quiet libraries, the one failure handler (:class:`Command`: a failure becomes one line, or one JSON object,
and an exit code) and the option definitions several commands must agree on (``--serve``, ``--json``,
``--verbose``)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
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
from rich.traceback import Traceback
from typer.core import TyperCommand

from modelyard import progress
from modelyard.errors import InvalidTargetError, ModelyardError, VerificationFailedError
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


#: ``--help`` text of ``--store``
STORE_HELP = "store folder (default: MODELYARD_HOME or ./artifacts)"


def store_option(help: str = STORE_HELP) -> Any:
    """``--store DIR``: the store folder, in every command that reads or writes one. One word per
    meaning: ``--store`` is a store, ``-o/--output`` a new file or folder a command writes, ``--smoke``
    a smoke level. The older spellings (``--out`` for a store or an output folder, ``--into``,
    ``--write``, ``smoke --level``) still work as hidden aliases (:func:`alias_option`)."""
    return typer.Option(None, "--store", help=help)


def output_option(help: str) -> Any:
    """``-o/--output PATH``: the new file or folder a command writes."""
    return typer.Option(None, "-o", "--output", help=help)


def alias_option(*names: str) -> Any:
    """An older spelling of an option, kept working but not shown in ``--help``."""
    return typer.Option(None, *names, hidden=True)


def either(value: Any, alias: Any, flag: str, *, required: bool = False) -> Any:
    """The value of option ``flag`` given under its name or its hidden older spelling. Raises
    :class:`~modelyard.errors.InvalidTargetError` (exit 2) when both are given with different values,
    or ``required`` and neither is."""
    if value is not None and alias is not None and value != alias:
        raise InvalidTargetError(f"{flag} was given twice, under two spellings, with different values",
                                 fix=f"Pass {flag} once.")
    picked = value if value is not None else alias
    if required and picked is None:
        raise InvalidTargetError(f"{flag} is required", fix=f"Pass {flag} PATH.")
    return picked


#: ``--help`` text of ``--json`` in most commands (some say what the object is instead)
JSON_HELP = "print one JSON object on stdout"
#: ``--help`` text of ``--verbose`` where a command documents it
VERBOSE_HELP = "show library logs and tracebacks"


def json_option(text: str | None = JSON_HELP) -> Any:
    """The ``--json`` option. Declare it as ``as_json``: :class:`Command` reads that parameter to print
    a failure as one JSON object on stdout. ``text=None``: no help text."""
    return typer.Option(False, "--json", help=text)


def verbose_option(text: str | None = None) -> Any:
    """The ``--verbose``/``-v`` option. Declare it as ``verbose``: :class:`Command` reads that parameter to
    print a failure's traceback. Help text: none unless given (:data:`VERBOSE_HELP`)."""
    return typer.Option(False, "--verbose", "-v", help=text)


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


_reporter: _RichReporter | None = None  # the live display of the running command, if any


@contextmanager
def working(as_json: bool) -> Iterator[None]:
    """Stage progress as rich bars on stderr while the block runs (none with --json). When the block
    fails the display stays up until :class:`Command` has printed the error beneath it, then closes."""
    global _reporter
    _stop_progress()
    _reporter = None if as_json else _RichReporter(err)
    progress.set_reporter(_reporter)
    yield
    _stop_progress()


def _stop_progress() -> None:
    global _reporter
    progress.set_reporter(None)
    if _reporter is not None:
        _reporter, reporter = None, _reporter
        reporter.close()


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


def _render_failure(exc: BaseException, as_json: bool) -> int:
    """Print ``exc`` as one line on stderr (or, with --json, one JSON object on stdout); return its exit
    code: the error's own for a :class:`ModelyardError`, 130 when interrupted, 3 for anything else."""
    if isinstance(exc, ModelyardError):
        report = getattr(exc, "report", None) if isinstance(exc, VerificationFailedError) else None
        if as_json:
            payload: dict[str, Any] = {"ok": False, "error": type(exc).__name__, "message": exc.message, "fix": exc.fix}
            if report is not None:
                payload["report"] = report.to_dict()
            out.print_json(json.dumps(payload, default=str))
        else:
            if report is not None:
                _findings_table(report)
            err.print(f"[bold red]error:[/] {escape(exc.message)}", highlight=False, soft_wrap=True)
            if exc.fix:
                err.print(f"[bold]fix:[/] {escape(exc.fix)}", highlight=False, soft_wrap=True)
        return exc.exit_code
    if isinstance(exc, KeyboardInterrupt):
        err.print("interrupted")
        return 130
    msg = f"internal error: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    if as_json:
        out.print_json(json.dumps({"ok": False, "error": "InternalError", "message": msg}))
    else:
        err.print(f"[bold red]{escape(msg)}[/] (re-run with --verbose for details)", highlight=False)
    return 3


def _print_traceback(exc: BaseException) -> None:
    """``exc``'s traceback from the command function down (the frames of this handler and of typer's
    dispatch are left out)."""
    tb = exc.__traceback__
    while tb is not None and (tb.tb_frame.f_globals.get("__name__") == __name__
                              or str(tb.tb_frame.f_globals.get("__name__", "")).split(".")[0] == "typer"):
        tb = tb.tb_next
    err.print(Traceback.from_exception(type(exc), exc, tb or exc.__traceback__))


class Command(TyperCommand):
    """Every ``modelyard`` command (``app.command(name, cls=Command)``): the one place where a failure
    becomes output and an exit code, under ``main()`` and ``typer.testing.CliRunner`` alike.

    A command raises; this prints the error as one line on stderr, or as one JSON object on stdout when
    the command's ``as_json`` parameter (``--json``) is set, plus the traceback when its ``verbose``
    parameter is, and exits with :func:`_render_failure`'s code. ``typer.Exit`` passes through. Any
    progress display a failed :func:`working` block left up is closed after the error is printed."""

    def invoke(self, ctx: typer.Context) -> Any:
        try:
            return super().invoke(ctx)
        except typer.Exit:
            raise
        except BaseException as exc:  # noqa: BLE001 - every failure becomes one line and an exit code
            if ctx.params.get("verbose"):
                _print_traceback(exc)
            raise typer.Exit(_render_failure(exc, bool(ctx.params.get("as_json")))) from exc
        finally:
            _stop_progress()


#: the order ``verify`` lists findings in: errors first
SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}


def _findings_table(report, console: Console | None = None, by_severity: bool = False) -> None:  # noqa: ANN001
    """One finding per block: severity, code, file/field, message, then the fix (wraps cleanly), on
    ``console`` (default stderr); ``by_severity`` lists errors, then warnings, then infos (stable)."""
    console = console or err
    colors = {"error": "red", "warning": "yellow", "info": "cyan"}
    findings = sorted(report.findings, key=lambda f: SEVERITY_ORDER[f.severity.value]) if by_severity else report.findings
    for f in findings:
        where = f.file or ""
        if f.field:
            where += f" [{f.field}]" if where else f.field
        console.print(f"[{colors[f.severity.value]}]{f.severity.value:<7}[/] [bold]{escape(f.code)}[/]  {escape(where)}",
                      highlight=False, soft_wrap=True)
        console.print(f"        {escape(f.message)}", highlight=False, soft_wrap=True)
        if f.fix:
            console.print(f"        fix: {escape(f.fix)}", highlight=False, soft_wrap=True)


def _human(n: int) -> str:

    return decimal(n)
