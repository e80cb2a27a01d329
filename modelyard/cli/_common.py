"""What every command shares: the stdout/stderr consoles, stage progress on stderr (:func:`working`),
quiet libraries, the one ``--json`` shape (:func:`emit_json`, :func:`envelope`), the one failure handler
(:class:`Command`: a failure becomes one line, or one JSON object, and an exit code), the choice types built
from modelyard's registries (:func:`choice`) and the option definitions several commands must agree on
(``--serve``, ``--json``, ``--verbose``)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import sys
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal, TextIO

import typer
from rich.console import Console, ConsoleDimensions
from rich.filesize import decimal
from rich.markup import escape
from rich.segment import Segment
from rich.traceback import Traceback
from typer._click.core import Context as ClickContext  # the context typer's commands receive; typer exports no name for it
from typer.core import TyperCommand

from modelyard import progress
from modelyard.cli._reporters import LineReporter, RichReporter
from modelyard.errors import BundleError, InvalidTargetError, ModelyardError, StoreError, VerificationFailedError, redact, verdict
from modelyard.model.modes import DEFAULT_SERVE, SERVE_MODES
from modelyard.text import printable

# Our own handle on the terminal's stderr: libraries that print progress bars and warnings to fd 2 are
# silenced during long stages (pipeline.quantize.quiet_libraries) while this console keeps reporting.
try:
    _ERR_FILE: TextIO | None = os.fdopen(os.dup(2), "w", buffering=1, encoding="utf-8", errors="replace")
except OSError:  # no stderr (a daemon): let rich pick
    _ERR_FILE = None

#: the width a console that is not a terminal renders at: wide enough that no line is ever wrapped
NO_WRAP_WIDTH = 1_000_000


class _Console(Console):
    """A rich Console that never wraps a line when it is not a terminal (CI logs, pipes, files): rich
    renders at 80 columns there, which split long paths and verdicts over two lines. On a terminal it
    renders at the terminal's width, as rich does. Control characters in what it prints are written as
    escapes (:func:`modelyard.text.printable`)."""

    @property
    def size(self) -> ConsoleDimensions:
        size = super().size
        return size if self.is_terminal else ConsoleDimensions(NO_WRAP_WIDTH, size.height)

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        self._width, self._height = new_size

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        """Every piece of text (not rich's own control segments) through :func:`modelyard.text.printable`:
        no file name, tokenizer string or message reaches the terminal with a raw escape sequence."""
        return super()._render_buffer(seg if seg.control else Segment(printable(seg.text), seg.style, seg.control)
                                      for seg in buffer)


err = _Console(file=_ERR_FILE, stderr=_ERR_FILE is None)
out = _Console()


def choice(values: Iterable[str]) -> Any:
    """A typer choice type (``Literal``) of ``values``, in order: ``--help`` shows them as
    ``<a|b|c>`` and a value outside them is typer's own usage error (``Invalid value for '--x': 'y'
    is not one of 'a', 'b', 'c'.``, exit 2) before the command runs. Build it from the registry that
    owns the valid set (schemes, the GPU table, smoke levels...), so that the CLI and the code that
    uses the value agree; the command receives a plain ``str``. Case-sensitive."""
    return Literal[tuple(values)]


#: ``--help`` text of ``--serve``: ``ingest`` and ``verify`` judge the same folder the same way by default
SERVE_HELP = (f"how it will be served: chat (needs a chat template) or completion (plain-text prompts); "
              f"default: {DEFAULT_SERVE}; use --serve completion for a base model")


#: ``--serve``'s choices: :data:`~modelyard.model.modes.SERVE_MODES` (with the other choice types in
#: :mod:`modelyard.cli._choices`; here because :func:`serve_option` is)
Serve = choice(SERVE_MODES)


def serve_option() -> Any:
    """The ``--serve`` option of ``ingest`` and ``verify`` (one definition, one default:
    :data:`~modelyard.model.modes.DEFAULT_SERVE`); declare it as ``serve: Serve``."""
    return typer.Option(DEFAULT_SERVE, "--serve", help=SERVE_HELP, show_default=False)


#: ``--help`` text of ``--store``
STORE_HELP = "store: a folder or s3://BUCKET/PREFIX (default: MODELYARD_STORE, else MODELYARD_HOME or ./artifacts)"


def revision_option() -> Any:
    """``--revision REV``: the hub revision (branch, tag or commit) of an ``hf://`` source, as ``hf download``
    takes it; the same as ``hf://org/name@REV``."""
    return typer.Option(None, "--revision", help="the hub revision (branch, tag or commit sha) of an hf:// SOURCE; "
                                                 "the same as hf://org/name@REV")


def store_option(help: str = STORE_HELP) -> Any:
    """``--store STORE``: the store, in every command that reads or writes one: a folder or an object
    store ``s3://bucket/prefix`` (declare it ``Optional[str]``: a ``Path`` would fold ``s3://`` into
    ``s3:/``). One word per meaning: ``--store`` is a store, ``-o/--output`` a new file or folder a command
    writes, ``--smoke`` a smoke level. The older spellings (``--out`` for a store or an output folder,
    ``--into``, ``--write``, ``smoke --level``) still work as hidden aliases (:func:`alias_option`)."""
    return typer.Option(None, "--store", help=help)


def stored_path(path: Path, store: str | None) -> Path:
    """``path`` itself, or, when it names no file or folder and reads as a store reference (``NAME`` or ``NAME@REV``, no
    ``/``), that artifact's folder in ``store`` (default: ``MODELYARD_STORE``, else ``MODELYARD_HOME``), as ``show`` and
    ``bundle`` read it: from an object store, downloaded to the local cache with every file checked. With an explicit
    ``store`` a bare name is looked up there first, so that a folder of the same name in the working directory does not
    shadow it (``./NAME`` names the folder); the folder is the answer only when the store has no such artifact. Raises
    :class:`StoreError` (exit 2) when neither holds it."""
    from modelyard.settings import Settings  # noqa: PLC0415 - heavy: pydantic-settings, imported on first use
    from modelyard.transport.refs import resolve_artifact  # noqa: PLC0415 - heavy: zstandard, boto3 for s3://

    text = str(path)
    if "/" in text or (path.exists() and store is None):
        return path
    try:
        return resolve_artifact(text, store, settings=Settings())
    except BundleError as exc:
        if path.exists():
            return path
        raise StoreError(exc.message, fix=exc.fix) from exc


def in_store(path: Path, store: str | None) -> bool:
    """True when the folder ``path`` lies in a local store (``--store`` when it is a folder, ``MODELYARD_STORE``
    when it is one, ``MODELYARD_HOME``, which also holds an object store's local cache), whose artifacts are
    never rewritten."""
    from modelyard.settings import Settings  # noqa: PLC0415 - heavy: pydantic-settings, imported on first use

    settings = Settings()
    roots = [settings.store_dir()] + [Path(s).expanduser() for s in (store, settings.store) if s and "://" not in s]
    p = path.expanduser().resolve()
    return any(p.is_relative_to(r.resolve()) for r in roots)


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


#: the keys of every ``--json`` object, in this order (docs/reference/json.md)
ENVELOPE_KEYS = ("ok", "command", "exit_code", "result", "error")
#: ``--help`` text of ``--verbose`` where a command documents it
VERBOSE_HELP = "show library logs and tracebacks"


def json_option(result: str = "the command's result") -> Any:
    """The ``--json`` option. Declare it as ``as_json`` and print through :func:`emit_json`:
    :class:`Command` reads that parameter to print a failure in the same shape. ``result`` says, in
    ``--help``, what the envelope's ``result`` holds."""
    return typer.Option(False, "--json", help=f"print one JSON object on stdout: {{ok, command, exit_code, result, "
                                               f"error}}, result = {result}")


def verbose_option(text: str | None = None) -> Any:
    """The ``--verbose``/``-v`` option. Declare it as ``verbose``: :class:`Command` reads that parameter to
    print a failure's traceback and to let libraries print. Help text: none unless given
    (:data:`VERBOSE_HELP`)."""
    return typer.Option(False, "--verbose", "-v", help=text)


def error_object(exc: BaseException) -> dict[str, Any]:
    """The envelope's ``error`` for ``exc``: ``{type, code, message, fix}``, ``type`` the modelyard error class
    (modelyard/errors.py) and ``code`` its stable code, ``InternalError`` for anything else (its message names the
    Python exception) or ``Interrupted``; a :class:`VerificationFailedError` adds the verification ``report`` (the
    report schema, modelyard/artifact/report.schema.json)."""
    if isinstance(exc, ModelyardError):
        d: dict[str, Any] = {"type": type(exc).__name__, "code": exc.code, "message": exc.message, "fix": exc.fix}
        report = getattr(exc, "report", None) if isinstance(exc, VerificationFailedError) else None
        if report is not None:
            d["report"] = report.to_dict()
        return d
    if isinstance(exc, KeyboardInterrupt):
        return verdict("Interrupted", "interrupted", None)
    return verdict("InternalError", _internal_message(exc), "Re-run with --verbose for details.")


def envelope(command: str, result: Any, *, exit_code: int = 0, error: dict[str, Any] | None = None) -> dict[str, Any]:
    """The one ``--json`` shape of every command, success and failure alike:
    ``{"ok": exit_code == 0, "command": command, "exit_code": exit_code, "result": result, "error": error}``.
    ``result`` is the command's own object (null when it failed before producing one); ``error`` is null on
    success, else ``{type, code, message, fix}`` (:func:`error_object`, :func:`modelyard.errors.verdict`).
    A gate that judged and failed (verify with errors, a failed smoke, unmet host needs) carries both its result
    and its error."""
    return {"ok": exit_code == 0, "command": command, "exit_code": exit_code, "result": result, "error": error}


def emit_json(result: Any, *, exit_code: int = 0, error: BaseException | dict[str, Any] | None = None,
              final: bool = True) -> None:
    """Print the running command's :func:`envelope` of ``result`` as one JSON object on stdout; with a
    non-zero ``exit_code``, then exit with it (so the object's ``exit_code`` is the process's), unless
    ``final`` is False (a command that goes on printing one object per round: ``watch`` without
    ``--once``). ``error``: a :class:`ModelyardError` (not raised: a gate's verdict) or an
    :func:`error_object`; required when ``exit_code`` is not 0. Raises :class:`ValueError` when it is
    missing."""
    if exit_code and error is None:
        raise ValueError("a failed result needs an error")
    err_obj = error_object(error) if isinstance(error, BaseException) else error
    _write_json(envelope(_state.command, result, exit_code=exit_code, error=err_obj))
    if exit_code and final:
        raise typer.Exit(exit_code)


def _write_json(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")
    sys.stdout.flush()


class _State:
    """What :class:`Command` knows of the running command: its name (the envelope's ``command``) and
    whether ``--verbose`` was given."""

    command = "modelyard"
    verbose = False


_state = _State()
_reporter: RichReporter | LineReporter | None = None  # the progress display of the running command, if any


@contextmanager
def working(as_json: bool) -> Iterator[None]:
    """Stage progress on stderr while the block runs: rich bars on a terminal, one plain line per finished
    stage otherwise (:class:`~modelyard.cli._reporters.LineReporter`), nothing with --json. Unless --verbose, what libraries print
    on stderr meanwhile (tqdm bars, warnings) is dropped (:func:`_quiet_stderr`). When the block fails
    the display stays up until :class:`Command` has printed the error beneath it, then closes."""
    global _reporter
    _stop_progress()
    _reporter = None if as_json else RichReporter(err) if err.is_terminal else LineReporter(err)
    progress.set_reporter(_reporter)
    with _quiet_stderr(_state.verbose):
        yield
    _stop_progress()


@contextmanager
def _quiet_stderr(verbose: bool) -> Iterator[None]:
    """Unless ``verbose``: send file descriptor 2 and ``sys.stderr`` to /dev/null and ignore Python
    warnings while the block runs, so that libraries' progress bars (transformers' GGUF conversion bar,
    tqdm) and warnings never reach the user's stderr. modelyard's own stderr output goes through
    :data:`err`, a duplicate of the original descriptor 2, and stays visible. No-op when ``err`` writes
    to ``sys.stderr`` itself (no descriptor 2 to duplicate: it would be silenced too)."""
    if verbose or err.file is sys.stderr or err.file is sys.__stderr__:
        yield
        return
    with contextlib.ExitStack() as stack, open(os.devnull, "w") as devnull:
        try:
            sys.stderr.flush()
            saved = os.dup(2)
        except (OSError, ValueError, AttributeError):
            saved = None
        if saved is not None:
            os.dup2(devnull.fileno(), 2)
            stack.callback(os.close, saved)
            stack.callback(os.dup2, saved, 2)
        stack.enter_context(contextlib.redirect_stderr(devnull))
        stack.enter_context(warnings.catch_warnings())
        warnings.simplefilter("ignore")
        yield


def _stop_progress() -> None:
    global _reporter
    progress.set_reporter(None)
    if _reporter is not None:
        reporter, _reporter = _reporter, None
        reporter.close()


def quiet_libraries(verbose: bool) -> None:
    """Keep Prefect/transformers/huggingface_hub logs and tracebacks off the user's terminal."""
    if not verbose:
        # Forced, not defaulted: Prefect logs a failed run's traceback at ERROR level, and the user
        # gets one line from us instead. --verbose shows Prefect's own logs.
        os.environ["PREFECT_LOGGING_LEVEL"] = "CRITICAL"
        os.environ["PREFECT_LOGGING_LOG_PRINTS"] = "false"
        # Prefect's queue services (the API log and event workers) log "Still processing items" on loggers
        # named after their class, outside "prefect", while the interpreter shuts down; a failed ingest then
        # printed that warning and, with stderr already closed, a logging traceback after our one error line.
        for name in ("APILogWorker", "EventsWorker", "QueueService"):
            logging.getLogger(name).setLevel(logging.ERROR)
        logging.raiseExceptions = False  # a handler's write to a closed stream at exit stays silent
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # Prefect's ephemeral API server gets 20 s to start; a first run (database migrations) on a busy
    # 2-core host took longer and failed with "Timed out while attempting to connect".
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")


#: the exit code when stdout's reader went away (``| head``): 128 + SIGPIPE, what a shell reports for a
#: program that SIGPIPE ended (``yes | head`` under ``set -o pipefail``)
EXIT_BROKEN_PIPE = 141


def broken_pipe(exc: BaseException) -> bool:
    """True when ``exc`` is a write to a closed pipe: a ``BrokenPipeError``, or the ``SystemExit(1)`` that rich
    raises after one (``Console.on_broken_pipe``), anywhere in its ``__context__`` chain."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, BrokenPipeError):
            return True
        seen = seen.__context__
    return False


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's final flush does not fail on the closed pipe
    again (Python's documented handling of SIGPIPE, ``signal`` module notes)."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


def _internal_message(exc: BaseException) -> str:
    return redact(f"internal error: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")


def _print_error(code: str, message: str, fix: str | None) -> None:
    err.print(f"[bold red]error\\[{code}]:[/] {escape(message)}" + (f"\n[bold]fix:[/] {escape(fix)}" if fix else ""),
              highlight=False, soft_wrap=True)


def _render_failure(exc: BaseException, as_json: bool) -> int:
    """Print ``exc`` as one line on stderr (or, with --json, the :func:`envelope` with its
    :func:`error_object` on stdout); return its exit code: the error's own for a :class:`ModelyardError`,
    130 when interrupted, 3 for anything else."""
    code = exc.exit_code if isinstance(exc, ModelyardError) else 130 if isinstance(exc, KeyboardInterrupt) else 3
    if as_json:
        _write_json(envelope(_state.command, None, exit_code=code, error=error_object(exc)))
        return code
    if isinstance(exc, ModelyardError):
        report = getattr(exc, "report", None) if isinstance(exc, VerificationFailedError) else None
        if report is not None:
            findings_table(report)
        _print_error(exc.code, exc.message, exc.fix)
    elif isinstance(exc, KeyboardInterrupt):
        err.print("interrupted")
    else:
        err.print(f"[bold red]{escape(_internal_message(exc))}[/] (re-run with --verbose for details)", highlight=False,
                  soft_wrap=True)
    return code


def _print_traceback(exc: BaseException) -> None:
    """``exc``'s traceback from the command function down (the frames of this handler and of typer's
    dispatch are left out)."""
    tb = exc.__traceback__
    while tb is not None and (tb.tb_frame.f_globals.get("__name__") == __name__
                              or str(tb.tb_frame.f_globals.get("__name__", "")).split(".")[0] == "typer"):
        tb = tb.tb_next
    err.print(Traceback.from_exception(type(exc), exc, tb or exc.__traceback__), width=min(err.width, 120))


def first_sentence(text: str) -> str:
    """The first sentence of ``text``'s first paragraph, on one line: what ``modelyard --help`` lists
    beside each command (click would cut it at about 45 characters and add "...")."""
    para = " ".join(text.strip().split("\n\n")[0].split())
    m = re.match(r"(.+?[.!?])(?:\s|$)", para)
    return m.group(1) if m else para


class Command(TyperCommand):
    """Every ``modelyard`` command (``app.command(name, cls=Command)``): the one place where a failure
    becomes output and an exit code, under ``main()`` and ``typer.testing.CliRunner`` alike.

    A command raises; this prints the error as one line on stderr, or as the JSON :func:`envelope` on
    stdout when the command's ``as_json`` parameter (``--json``) is set, plus the traceback when its
    ``verbose`` parameter is, and exits with :func:`_render_failure`'s code. ``typer.Exit`` passes
    through. Any progress display a failed :func:`working` block left up is closed after the error is
    printed. A bad command line (typer's usage errors) is ``error[usage]:`` with typer's message and a
    ``fix:`` line on stderr, exit 2; with ``--json`` among the arguments it is the envelope on stdout
    (``error.type`` ``UsageError``). ``modelyard --help`` lists the command with the first sentence of its help."""

    def make_context(self, info_name: str | None, args: list[str], parent: Any = None, **extra: Any) -> Any:
        given = list(args)  # the parser consumes ``args``
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except typer.TyperException as exc:  # typer's usage errors (its bundled click's ClickException)
            # typer validates a choice (Literal) through pydantic, whose message starts "Value error, "
            if isinstance(exc, typer.BadParameter) and exc.message.startswith("Value error, "):
                exc.message = exc.message.removeprefix("Value error, ")
            if "--help" in given:
                raise
            code, fix, message = exc.exit_code, f"See `modelyard {info_name} --help`.", exc.format_message()
            if "--json" in given:
                _write_json(envelope(_command_name(parent, info_name), None, exit_code=code,
                                     error=verdict("UsageError", message, fix)))
            else:
                _print_error("usage", message, fix)
            raise typer.Exit(code) from exc

    def invoke(self, ctx: ClickContext) -> Any:
        _state.command = _command_name(ctx.parent, ctx.info_name)
        _state.verbose = bool(ctx.params.get("verbose"))
        try:
            return super().invoke(ctx)
        except typer.Exit:
            raise
        except BaseException as exc:  # noqa: BLE001 - every failure becomes one line and an exit code
            if broken_pipe(exc):  # `modelyard ... | head`: the reader has all it wanted
                _silence_stdout()
                raise typer.Exit(EXIT_BROKEN_PIPE) from None
            if ctx.params.get("verbose"):
                _print_traceback(exc)
            raise typer.Exit(_render_failure(exc, bool(ctx.params.get("as_json")))) from exc
        finally:
            _stop_progress()

    def get_short_help_str(self, limit: int = 45) -> str:
        return first_sentence(self.help or "")


def _command_name(parent: Any, info_name: str | None) -> str:
    """The command as typed after ``modelyard``: ``ingest``, or ``server start`` for a subcommand."""
    names = [info_name or ""]
    while parent is not None and parent.parent is not None:
        names.insert(0, parent.info_name or "")
        parent = parent.parent
    return " ".join(n for n in names if n)


#: the order ``verify`` lists findings in: errors first
SEVERITY_ORDER = {"error": 0, "warning": 1, "not_judged": 2, "info": 3}


def findings_table(report, console: Console | None = None, by_severity: bool = False) -> None:  # noqa: ANN001
    """One finding per block: severity, code, file/field, message, then the fix (wraps cleanly), on
    ``console`` (default stderr); ``by_severity`` lists errors, then warnings, then infos (stable)."""
    console = console or err
    colors = {"error": "red", "warning": "yellow", "info": "cyan", "not_judged": "magenta"}
    findings = sorted(report.findings, key=lambda f: SEVERITY_ORDER[f.severity.value]) if by_severity else report.findings
    for f in findings:
        where = f"{f.file} [{f.field}]" if f.file and f.field else f.file or f.field or ""
        console.print(f"[{colors[f.severity.value]}]{f.severity.value:<7}[/] [bold]{escape(f.code)}[/]  {escape(where)}",
                      highlight=False, soft_wrap=True)
        console.print(f"        {escape(f.message)}", highlight=False, soft_wrap=True)
        if f.fix:
            console.print(f"        fix: {escape(f.fix)}", highlight=False, soft_wrap=True)


def human_bytes(n: int) -> str:
    return decimal(n)
