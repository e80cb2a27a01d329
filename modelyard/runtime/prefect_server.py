"""The Prefect API a command's flow runs talk to: a kept local server, or a private one per command.

Prefect needs an API for every flow run. Without ``PREFECT_API_URL``, Prefect starts its ephemeral API
server (uvicorn in a subprocess, on the SQLite database of ``PREFECT_HOME``) inside the first flow call
and stops it at exit: seconds of every ingest, before any model work (benchmarks/README.md, "Everyday
speed"). Two ways out, both chosen by :func:`connect` before Prefect is imported:

- **a kept server**: ``modelyard server start`` runs ``prefect server start`` on 127.0.0.1 in the
  background, detached from the terminal, with its own ``PREFECT_HOME`` and SQLite database in
  ``<store>/.prefect-server/`` (``server.json`` there records its pid, port and API URL, ``server.log``
  its output). A command of the same store (``--store``, else ``MODELYARD_HOME``) finds it and sets
  ``PREFECT_API_URL`` to it when it answers ``/api/health``. ``modelyard server stop`` stops it. A warm
  facts worker runs beside it (:mod:`modelyard.runtime.facts_server`, :func:`use_facts_worker`).
- **a private API server, started early**: otherwise the same ephemeral server Prefect would start
  (``prefect.server.api.server.SubprocessASGIServer``: uvicorn with ``create_app``,
  ``PREFECT__SERVER_EPHEMERAL=1``, on the caller's ``PREFECT_HOME``) is started by :func:`connect`
  right after the input checks, so that it boots on another core while this process imports Prefect
  and the flows (Prefect starts its own only inside the first flow call, after importing its server
  code in this process too); it is stopped at exit.

An API URL the user configured for Prefect (``PREFECT_API_URL``, a profile, ``prefect.toml``, ``.env``)
always wins. ``MODELYARD_PREFECT_API=ephemeral`` leaves the choice to Prefect (its own ephemeral
server, started inside the flow call).
"""

from __future__ import annotations

import atexit
import dataclasses
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelyard.checks import facts_worker
from modelyard.errors import ServerError
from modelyard.model.digest import pid_alive
from modelyard.runtime import facts_server
from modelyard.runtime.process import free_port
from modelyard.settings import env_value

#: folder of the kept server, under the store
SERVER_DIR = ".prefect-server"
STATE = "server.json"
LOG = "server.log"
FACTS_LOG = "facts-worker.log"
#: seconds a first start may take (it creates and migrates the SQLite database; 16 s on the 2-core machine)
START_TIMEOUT = 180.0
#: seconds ``stop`` waits after SIGTERM before SIGKILL
STOP_TIMEOUT = 20.0


@dataclass(frozen=True)
class ServerState:
    """What ``server.json`` records: the server's process (its own session: ``pid`` is the group),
    port, API URL, ``PREFECT_HOME``, log file and start time."""

    pid: int
    port: int
    api_url: str
    prefect_home: str
    log: str
    since: float  # epoch seconds of the start
    facts_pid: int | None = None  # the warm facts worker beside it (modelyard.checks.facts_worker)
    facts_socket: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"pid": self.pid, "port": self.port, "api_url": self.api_url, "prefect_home": self.prefect_home,
                "log": self.log, "since": self.since, "facts_pid": self.facts_pid, "facts_socket": self.facts_socket}


def _ours(pid: int | None, marker: str) -> bool:
    """True when process ``pid`` lives and its command line holds ``marker`` (``prefect`` for the server,
    ``modelyard.runtime.facts_server`` for the worker): a pid recorded before a crash or reboot may belong to another program
    now, which ``stop`` must not signal. Where ``/proc`` cannot be read, a living pid counts."""
    if pid is None or not pid_alive(pid):
        return False
    try:
        return marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True


def facts_running(st: ServerState) -> bool:
    """True when the kept server's facts worker lives and its socket is there."""
    return bool(st.facts_socket) and _ours(st.facts_pid, facts_server.MARKER) and Path(st.facts_socket or "").exists()


def _spawn_facts_worker(d: Path) -> tuple[int, str]:
    """Start the kept facts worker (its output appended to ``d/facts-worker.log``); returns once its socket
    is bound (it binds before its imports), or after :data:`~modelyard.checks.facts_worker.START_GRACE` s."""
    sock = facts_server.private_socket()
    with open(d / FACTS_LOG, "ab") as fh:
        worker = facts_server.spawn(sock, with_parent=False, log=fh)
    deadline = time.monotonic() + facts_worker.START_GRACE
    while not Path(sock).exists() and worker.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return worker.pid, sock


def _stop_facts_worker(st: ServerState) -> None:
    if _ours(st.facts_pid, facts_server.MARKER):
        _stop_pid(st.facts_pid)  # type: ignore[arg-type]
    if st.facts_socket:
        facts_server.remove_socket_dir(st.facts_socket)


def server_dir(store: Path) -> Path:
    return Path(store).expanduser().absolute() / SERVER_DIR


def healthy(api_url: str, timeout: float = 1.0) -> bool:
    """True when ``GET <api_url>/health`` answers 200 within ``timeout`` seconds (no proxy: 127.0.0.1)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"{api_url}/health", timeout=timeout) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def read_state(store: Path) -> ServerState | None:
    """The recorded server of ``store``, or None (no ``server.json``, or one that is not ours)."""
    try:
        d = json.loads((server_dir(store) / STATE).read_text())
        return ServerState(int(d["pid"]), int(d["port"]), str(d["api_url"]), str(d["prefect_home"]), str(d["log"]),
                           float(d["since"]), int(d["facts_pid"]) if d.get("facts_pid") is not None else None,
                           str(d["facts_socket"]) if d.get("facts_socket") else None)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def running(store: Path, timeout: float = 1.0) -> ServerState | None:
    """The kept server of ``store`` when its process is alive and its API answers, else None."""
    st = read_state(store)
    if st is None or not _ours(st.pid, "prefect") or not healthy(st.api_url, timeout):
        return None
    return st


def start(store: Path, *, port: int | None = None, ui: bool = False, timeout: float = START_TIMEOUT) -> tuple[ServerState, bool]:
    """Start the kept server of ``store`` (see the module doc) unless it runs; returns ``(state, started)``.

    ``port``: a fixed port (default: a free one; commands find it through ``server.json``). ``ui``: also
    serve Prefect's web UI. Raises :class:`ServerError` (exit 2) when the port is taken, or the server
    exits or does not answer ``/api/health`` within ``timeout`` seconds (its log's last lines in the message;
    it is stopped)."""
    st = running(store)
    d = server_dir(store)
    if st is not None:
        if not facts_running(st):  # the worker died (or was killed): start another beside the running server
            _stop_facts_worker(st)
            pid, sock = _spawn_facts_worker(d)
            st = dataclasses.replace(st, facts_pid=pid, facts_socket=sock)
            _write_state(d, st)
        return st, False
    old = read_state(store)
    if old is not None:  # a server that died leaves its worker: stop it before starting a new pair
        _stop_facts_worker(old)
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ServerError(f"cannot create {d}: {exc.strerror or exc}",
                          fix="Pass --store a folder you can write (the server keeps its database and log there).") from exc
    if port is None:
        port = free_port()
    else:
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", port))
        except OSError as exc:
            raise ServerError(f"port {port} on 127.0.0.1 is taken ({exc.strerror or exc})",
                              fix="Pass another --port, or leave --port out to take a free one.") from exc
    home = d / "home"
    log = d / LOG
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "PREFECT_HOME")}
    env.update(PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false",
               PREFECT_SERVER_UI_ENABLED=str(ui).lower(), NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
    cmd = [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port),
           "--analytics-off", "--ui" if ui else "--no-ui"]
    with open(log, "ab") as fh:
        proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True, cwd=d)
    worker_pid, sock = _spawn_facts_worker(d)
    st = ServerState(proc.pid, port, f"http://127.0.0.1:{port}/api", str(home), str(log), time.time(), worker_pid, sock)
    _write_state(d, st)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            _stop_facts_worker(st)
            (d / STATE).unlink(missing_ok=True)
            raise ServerError(f"prefect server exited with code {proc.returncode} while starting: {_tail(log)}",
                              fix=f"Read {log}; a port taken by another program is a common cause (pass --port).")
        if healthy(st.api_url):
            return st, True
        time.sleep(0.25)
    _stop_pid(proc.pid)
    _stop_facts_worker(st)
    (d / STATE).unlink(missing_ok=True)
    raise ServerError(f"prefect server did not answer {st.api_url}/health within {timeout:g} s: {_tail(log)}",
                      fix=f"Read {log}; on a busy machine the first start (database migrations) can take minutes.")


def stop(store: Path) -> ServerState | None:
    """Stop the kept server of ``store`` (SIGTERM to its process group, SIGKILL after
    :data:`STOP_TIMEOUT` s) and remove ``server.json``; returns what was stopped, None if none ran."""
    st = read_state(store)
    if st is None:
        return None
    was = st if _ours(st.pid, "prefect") else None
    if was is not None:
        _stop_pid(st.pid)
    _stop_facts_worker(st)
    (server_dir(store) / STATE).unlink(missing_ok=True)
    return was


def use_facts_worker(store: Path) -> bool:
    """Point this process's verify (``MODELYARD_FACTS_WORKER``) at the warm facts worker of ``store``'s kept
    server (:mod:`modelyard.checks.facts_worker`) when it runs; True when it did. A value the user set (``off``
    included) is left alone.

    A command without a kept server starts no worker of its own: one was measured in ingest and dropped, as
    on 2 cores it competes with Prefect's import and its API's boot and did not beat the warm-up thread
    (benchmarks/README.md, "Everyday commands")."""
    if os.environ.get(facts_worker.ENV):
        return False
    st = read_state(store)
    if st is None or not st.facts_socket or not facts_running(st):
        return False
    os.environ[facts_worker.ENV] = st.facts_socket
    return True


def _stop_pid(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return
    deadline = time.monotonic() + STOP_TIMEOUT
    while time.monotonic() < deadline:
        try:
            os.waitpid(pid, os.WNOHANG)  # reap it when it is our child (start's timeout)
        except ChildProcessError:
            pass
        if not pid_alive(pid):
            return
        time.sleep(0.1)
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _write_state(d: Path, st: ServerState) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".server-", suffix=".json", dir=d)
    with os.fdopen(fd, "w") as fh:
        json.dump(st.to_dict(), fh, indent=2)
    os.replace(tmp, d / STATE)


def _tail(log: Path, lines: int = 5) -> str:
    try:
        text = log.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return " | ".join(text[-lines:]) or "(empty log)"


#: ``python -c`` program that runs ``uvicorn ARGS`` and dies with its parent: Linux ``prctl(PR_SET_PDEATHSIG,
#: SIGTERM)`` (prctl(2)), so that a SIGKILLed command leaves no API server behind (Prefect's own leaves one);
#: it exits at once when the parent is already gone. Elsewhere it only runs uvicorn.
_WITH_PARENT = """\
import ctypes, os, runpy, signal, sys
try:
    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)
except (AttributeError, OSError):
    pass
if os.getppid() != int(os.environ.pop("MODELYARD_PARENT_PID", os.getppid())):
    sys.exit(0)
sys.argv = ["uvicorn", *sys.argv[1:]]
runpy.run_module("uvicorn", run_name="__main__", alter_sys=True)
"""


class PrivateAPI:
    """Prefect's ephemeral API server (``prefect.server.api.server.SubprocessASGIServer``'s command:
    uvicorn with ``create_app``, ``PREFECT__SERVER_EPHEMERAL=1``, on this process's ``PREFECT_HOME``),
    started before Prefect is imported. :meth:`wait` blocks until it answers; it is stopped at exit
    (SIGTERM, then SIGKILL after 5 s, as Prefect stops its own), after Prefect's own exit handlers."""

    def __init__(self, timeout: float) -> None:
        spec = importlib.util.find_spec("prefect")  # its location only: importing prefect takes seconds
        if spec is None or spec.origin is None:
            raise ServerError("prefect is not installed", fix="Run `make setup`.")
        self.port = free_port()
        self.api_url = f"http://127.0.0.1:{self.port}/api"
        self.timeout = timeout
        self._log = tempfile.TemporaryFile(prefix="modelyard-prefect-api-")  # noqa: SIM115 - closed in stop()
        env = {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1",
               "MODELYARD_PARENT_PID": str(os.getpid())}
        env.pop("PREFECT_API_URL", None)
        self._proc: subprocess.Popen[bytes] | None = subprocess.Popen(
            [sys.executable, "-c", _WITH_PARENT, "--app-dir", str(Path(spec.origin).parent.parent), "--factory",
             "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port", str(self.port),
             "--log-level", "error", "--lifespan", "on"],
            env=env, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT)
        atexit.register(self.stop)

    def wait(self) -> None:
        """Block until the API answers ``/api/health``; raises :class:`ServerError` when the server exits
        or does not answer within the timeout (``PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS``)."""
        deadline = time.monotonic() + self.timeout
        while self._proc is not None and time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise ServerError(f"Prefect's API server exited with code {self._proc.returncode} while starting: "
                                  f"{self._output()}",
                                  fix="Run `modelyard server start` once and retry, or set PREFECT_API_URL to a server.")
            if healthy(self.api_url, timeout=1.0):
                return
            time.sleep(0.05)
        self.stop()
        raise ServerError(f"Prefect's API server did not answer within {self.timeout:g} s",
                          fix="Retry on a less busy machine, raise PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS, or "
                              "run `modelyard server start` once.")

    def _output(self) -> str:
        try:
            self._log.seek(0)
            text = self._log.read().decode(errors="replace").strip().splitlines()
        except (OSError, ValueError):
            return "(no output)"
        return " | ".join(text[-5:]) or "(no output)"

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if not self._log.closed:
            self._log.close()


@dataclass
class Api:
    """The Prefect API a command's flow runs use (:func:`connect`). ``kind``: ``configured``
    (``PREFECT_API_URL``, or a Prefect profile or settings file names one), ``prefect`` (Prefect's own
    ephemeral server, ``MODELYARD_PREFECT_API=ephemeral``), ``server`` (the kept server) or
    ``private`` (:class:`PrivateAPI`)."""

    kind: str
    url: str | None = None
    private: PrivateAPI | None = None

    @contextmanager
    def use(self) -> Iterator[None]:
        """Run the block's flow calls against this API (Prefect is imported by now). Prefect's own
        setting wins: when a profile, ``prefect.toml`` or ``.env`` names an API URL, the private server
        is stopped unused. Otherwise the URL is set with Prefect's ``temporary_settings`` (and, for the private
        server, flow-run heartbeats are off)."""
        if self.kind in ("configured", "prefect"):
            yield
            return
        from prefect.settings import (  # noqa: PLC0415 - heavy: prefect, imported on first use
            PREFECT_API_URL,
            PREFECT_FLOWS_HEARTBEAT_FREQUENCY,
            get_current_settings,
            temporary_settings,
        )

        if get_current_settings().api.url:
            self.kind = "configured"
            if self.private is not None:
                self.private.stop()
            yield
            return
        updates: dict[Any, Any] = {PREFECT_API_URL: self.url}
        if self.private is not None:
            self.private.wait()
            # Heartbeats let a server mark a crashed run; a private server dies with this process, so nobody
            # reads them, and joining the heartbeat thread after the flow costs up to 1 s (it sleeps in 1 s steps).
            updates[PREFECT_FLOWS_HEARTBEAT_FREQUENCY] = None
        with temporary_settings(updates=updates):
            yield


def connect(store: Path) -> Api:
    """Choose the Prefect API for this process's flow runs, before Prefect is imported (module doc);
    enter :meth:`Api.use` around the flow calls. Starts a :class:`PrivateAPI` unless ``PREFECT_API_URL``
    is set, ``MODELYARD_PREFECT_API`` is ``ephemeral`` or the kept server of ``store`` answers."""
    if os.environ.get("PREFECT_API_URL"):
        return Api("configured")
    if (env_value("prefect_api") or "auto").lower() == "ephemeral":
        return Api("prefect")
    st = running(store, timeout=0.5)
    if st is not None:
        return Api("server", st.api_url)
    timeout = float(os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS") or 180)
    api = PrivateAPI(timeout)
    return Api("private", api.api_url, api)
