"""The warm engine host: a vLLM runtime interpreter that has imported vLLM once and runs each runner script in
a fork of itself (the process: ``runtime/scripts/engine_host.py``; this module starts it and is its client).

A runner started cold spends 7-10 s of CPU importing torch, transformers and vLLM before it reads its first
argument (benchmarks/README.md, "Smoke"). With ``MODELYARD_ENGINE_HOST`` naming a host's socket,
:func:`modelyard.runtime.process.start_script` hands it the run instead: the run still gets a process of its own,
in its own session, with the caller's environment, working folder and log, and a timeout still kills its whole
process group. Any refusal or failure of the host makes the caller start the interpreter itself: the host
changes how fast a run starts, never what it does. The test suite starts one host per session
(``tests/conftest.py``) so that its many loads do not each import vLLM.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from modelyard.settings import env_value
from modelyard.unixsock import read_line

#: seconds a caller waits for the host to accept and answer (the first run waits for the host's imports)
ANSWER_TIMEOUT = 180.0
SCRIPT = Path(__file__).resolve().parent / "scripts" / "engine_host.py"
_dead: set[str] = set()  # hosts that failed in this process: not asked again
#: beside the socket: the venv (``sys.prefix``) of the host's interpreter
PREFIX_FILE = "prefix"


def _prefix(python: Path | str) -> str:
    """The venv folder of the interpreter ``python`` (``<venv>/bin/python``), unresolved: two venvs made from one
    base interpreter have different prefixes though their pythons link to the same file."""
    return os.path.abspath(os.path.dirname(os.path.dirname(str(python))))


class HostedProcess:
    """A run the host forked, with the part of :class:`subprocess.Popen` that :func:`~.process.run_script` and
    :func:`~.process.kill_group` use: ``pid`` (also its process group), :meth:`poll`, :meth:`wait` and
    ``returncode`` (minus the signal that ended it, as Popen's). The exit status comes over the host's
    connection; when the host dies first, the run's group is killed and the code is ``-SIGKILL``."""

    def __init__(self, pid: int, conn: socket.socket) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._conn: socket.socket | None = conn
        self._buf = b""

    def _read(self, timeout: float | None) -> None:
        conn = self._conn
        if conn is None or self.returncode is not None:
            return
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            conn.settimeout(left)
            try:
                chunk = conn.recv(4096)
            except (TimeoutError, socket.timeout, BlockingIOError):
                return
            except OSError:
                chunk = b""
            if not chunk:  # the host is gone without an answer
                _killpg(self.pid, signal.SIGKILL)
                self._finish(-signal.SIGKILL)
                return
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        try:
            code = json.loads(line)["returncode"]
            self._finish(int(code))
        except (ValueError, KeyError, TypeError):
            _killpg(self.pid, signal.SIGKILL)
            self._finish(-signal.SIGKILL)

    def _finish(self, code: int) -> None:
        self.returncode = code
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def poll(self) -> int | None:
        self._read(0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """The exit code; raises :class:`subprocess.TimeoutExpired` after ``timeout`` seconds."""
        self._read(timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(["engine-host", str(self.pid)], timeout or 0.0)
        return self.returncode


def _killpg(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def host_socket() -> str | None:
    """The host this process may hand runs to (``MODELYARD_ENGINE_HOST``), None when unset, ``off`` or failed."""
    p = env_value("engine_host")
    if p is None or p.lower() in ("off", "none", "0") or p in _dead:
        return None
    return p


def submit(python: Path | str, script: Path | str, args: Sequence[str], *, env: Mapping[str, str], log: Path,
           cwd: Path | str | None = None, path: str | None = None) -> HostedProcess | None:
    """Hand the run ``python script *args`` to the host at ``path`` (default :func:`host_socket`); the run's
    output is appended to ``log``. Returns the :class:`HostedProcess`, or None when there is no host or it
    refused (the caller then starts ``python`` itself; a host that failed is not asked again). Never raises."""
    path = path or host_socket()
    if path is None:
        return None
    try:  # the host's venv, written by start(): a run of another interpreter is not even asked about
        if (Path(path).parent / PREFIX_FILE).read_text() != _prefix(python):
            return None
    except OSError:
        pass
    req = {"python": str(python), "script": str(Path(script).resolve()), "args": [str(a) for a in args],
           "env": dict(env), "cwd": None if cwd is None else str(cwd), "log": str(Path(log).absolute())}
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.settimeout(ANSWER_TIMEOUT)
        conn.connect(path)
        conn.sendall(json.dumps(req).encode() + b"\n")
        reply: dict[str, Any] = json.loads(read_line(conn))
    except (OSError, ValueError):
        conn.close()
        _dead.add(path)
        return None
    if not reply.get("ok") or not isinstance(reply.get("pid"), int):
        conn.close()  # refused for this run (e.g. another thread-pool setting): this run goes cold
        return None
    return HostedProcess(reply["pid"], conn)


def start(python: Path | str, env: Mapping[str, str], *, log: Path | None = None) -> tuple[subprocess.Popen[bytes], str]:
    """Start a host on ``python`` (a vLLM runtime interpreter) with ``env`` (what its runs will share of the
    variables read at import: pass the runtime environment, :func:`modelyard.runtime.venv.runtime_env`); it exits
    with this process. Returns ``(process, socket path)`` at once: the socket exists within a second, and the host
    answers once its imports are done (a caller meanwhile waits in the backlog). Raises :class:`OSError` when
    ``python`` cannot be started."""
    folder = tempfile.mkdtemp(prefix="modelyard-engine-")
    sock = str(Path(folder) / "engine.sock")
    (Path(folder) / PREFIX_FILE).write_text(_prefix(python))
    out = open(log, "ab") if log is not None else subprocess.DEVNULL  # noqa: SIM115 - handed to the child
    try:
        proc = subprocess.Popen([str(python), str(SCRIPT), "--socket", sock, "--parent", str(os.getpid())],
                                env=dict(env), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    finally:
        if log is not None:
            out.close()  # type: ignore[union-attr]
    deadline = time.monotonic() + 10.0
    while not Path(sock).exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return proc, sock


def stop(proc: subprocess.Popen[bytes], grace: float = 10.0) -> int:
    """Stop a host that :func:`start` returned: SIGTERM, then SIGKILL after ``grace`` seconds. The host skips the
    interpreter's teardown and is gone in well under a second; its runs lose their connection and their callers
    kill their groups. Returns the host's exit code (0 after SIGTERM, ``-SIGKILL`` after the kill)."""
    proc.terminate()
    try:
        return proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()
