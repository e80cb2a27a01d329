"""server start, stop and status: keep a local Prefect server that ingests find by themselves."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from modelyard.cli._common import Command, emit_json, json_option, out, store_option, verbose_option
from modelyard.errors import verdict
from modelyard.runtime import prefect_server as server
from modelyard.settings import Settings

app = typer.Typer(no_args_is_help=True, add_completion=False, rich_markup_mode=None,
                  context_settings={"help_option_names": ["--help", "-h"]},
                  help="Keep a local Prefect server: ingests of the same store use it instead of starting "
                       "Prefect's ephemeral API each time (seconds per command).",
                  # click shortens a group's help to 45 characters in the parent's list; the command list shows
                  # each command's whole first sentence
                  short_help="Keep a local Prefect server: ingests of the same store use it instead of starting "
                             "Prefect's ephemeral API each time (seconds per command).")


_DEFAULT = "(default: MODELYARD_STORE when it is a folder, else MODELYARD_HOME or ./artifacts)"


def _store(store: Optional[Path]) -> Path:
    return (store or Settings().local_store()).expanduser().absolute()


def _show(st: server.ServerState, what: str, as_json: bool, **extra: Any) -> None:
    facts = what != "stopped" and server.facts_running(st)
    if as_json:
        emit_json({**extra, **st.to_dict(), **({"facts_running": facts} if what != "stopped" else {})})
        return
    out.print(f"prefect server {what}: {st.api_url} (pid {st.pid})", highlight=False, soft_wrap=True)
    if what != "stopped":
        out.print(f"facts worker: running (pid {st.facts_pid})" if facts else
                  "facts worker: not running (verify imports transformers itself); `modelyard server start` starts it again",
                  highlight=False, soft_wrap=True)
    out.print(f"log: {st.log}", highlight=False, soft_wrap=True)


@app.command("start", cls=Command)
def start_cmd(
    store: Optional[Path] = store_option("the store whose ingests use it " + _DEFAULT),
    port: Optional[int] = typer.Option(None, "--port", min=1, max=65535, help="port on 127.0.0.1 (default: a free one)"),
    ui: bool = typer.Option(False, "--ui", help="also serve Prefect's web UI"),
    as_json: bool = json_option(),
    verbose: bool = verbose_option(),
) -> None:
    """Start `prefect server start` on 127.0.0.1 in the background (its database and log in
    STORE/.prefect-server/) unless it runs, with a warm facts worker beside it (started again when it died);
    wait until the server answers. Commands of the same store set PREFECT_API_URL to it while it runs (unless
    PREFECT_API_URL is set), and verify asks the worker."""
    st, started = server.start(_store(store), port=port, ui=ui)
    _show(st, "started" if started else "already running", as_json, started=started)


@app.command("stop", cls=Command)
def stop_cmd(
    store: Optional[Path] = store_option("the store whose server to stop " + _DEFAULT),
    as_json: bool = json_option(),
    verbose: bool = verbose_option(),
) -> None:
    """Stop the store's server (SIGTERM, SIGKILL after 20 s); exit 0 also when none was running."""
    st = server.stop(_store(store))
    if st is None:
        if as_json:
            emit_json({"stopped": False})
        else:
            out.print(f"no prefect server was running for {_store(store)}", highlight=False, soft_wrap=True)
        return
    _show(st, "stopped", as_json, stopped=True)


@app.command("status", cls=Command)
def status_cmd(
    store: Optional[Path] = store_option("the store whose server to look for " + _DEFAULT),
    as_json: bool = json_option(),
    verbose: bool = verbose_option(),
) -> None:
    """Say whether the store's server runs and answers: exit 0 when it does, 1 when it does not."""
    st = server.running(_store(store))
    if st is not None:
        _show(st, "running", as_json, running=True)
        return
    if as_json:
        emit_json({"running": False}, exit_code=1,
                  error=verdict("ServerNotRunning", f"no prefect server running for {_store(store)}",
                                      "Start one with `modelyard server start`."))
    else:
        out.print(f"no prefect server running for {_store(store)}; start one with `modelyard server start`",
                  highlight=False, soft_wrap=True)
    raise typer.Exit(1)
