"""Run a script in another interpreter, with a timeout, a process-group kill and a log tail.

Every runtime subprocess starts in its own session (``start_new_session``), so that a timeout or a crash
of ours kills what it spawned too (vLLM's engine core, its resource tracker, a quantizer's workers):
``os.killpg`` on the group, never only the child."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from modelyard.runtime import engine_host

#: bytes of a runner's log that an error message quotes
TAIL_BYTES = 3000


@dataclass(frozen=True)
class ScriptRun:
    """What :func:`run_script` saw: the exit code (None when it was killed on the timeout), whether the
    timeout (seconds) expired, the wall time (seconds) and the log's last :data:`TAIL_BYTES` bytes."""

    returncode: int | None
    timed_out: bool
    seconds: float
    tail: str


def kill_group(proc: subprocess.Popen | engine_host.HostedProcess, grace: float = 10.0) -> None:
    """SIGTERM ``proc``'s process group, SIGKILL it after ``grace`` seconds, and reap ``proc``.
    A group already gone is not an error."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(grace)
    except (ProcessLookupError, PermissionError, subprocess.TimeoutExpired):
        reap_group(proc.pid)
        proc.wait()


def reap_group(pgid: int) -> None:
    """SIGKILL the process group ``pgid`` (what a runner that left through ``os._exit`` left behind, such
    as a resource tracker); a group already gone is not an error."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def log_tail(log: Path, nbytes: int = TAIL_BYTES) -> str:
    """The last ``nbytes`` bytes of ``log`` as text (undecodable bytes replaced); ``""`` when unreadable."""
    try:
        with open(log, "rb") as fh:
            fh.seek(max(0, fh.seek(0, os.SEEK_END) - nbytes))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


def run_script(python: Path | str, script: Path | str, args: Sequence[str], *, env: Mapping[str, str],
               timeout: float, log: Path, cwd: Path | str | None = None, grace: float = 10.0) -> ScriptRun:
    """Run ``python script *args`` in its own session, its output (stdout and stderr) appended to ``log``,
    and wait at most ``timeout`` seconds. On the timeout, or when this process is interrupted, the whole
    process group gets SIGTERM and, ``grace`` seconds later, SIGKILL; after a normal exit what is left in
    the group is killed too. Never raises for the child's failure: the caller reads :class:`ScriptRun`
    (and the result file its script was asked to write). Raises :class:`OSError` when ``python`` cannot
    be started."""
    t0 = time.perf_counter()
    timed_out = False
    proc = start_script(python, script, args, env=env, log=log, cwd=cwd)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        if proc.poll() is None:
            kill_group(proc, grace)
        reap_group(proc.pid)
    return ScriptRun(returncode=None if timed_out else proc.returncode, timed_out=timed_out,
                     seconds=round(time.perf_counter() - t0, 3), tail=log_tail(log))


def start_script(python: Path | str, script: Path | str, args: Sequence[str], *, env: Mapping[str, str], log: Path,
                 cwd: Path | str | None = None) -> subprocess.Popen[bytes] | engine_host.HostedProcess:
    """Start ``python script *args`` in its own session (its pid is its process group), its output appended to
    ``log``; returns at once. When a warm engine host of ``python`` runs (``MODELYARD_ENGINE_HOST``,
    :mod:`.engine_host`) and takes the run, the process is a fork of it (the same environment, folder, log and
    process group, without the interpreter's imports); otherwise a new interpreter. Raises :class:`OSError` when
    ``python`` cannot be started."""
    hosted = engine_host.submit(python, script, args, env=env, log=log, cwd=cwd)
    if hosted is not None:
        return hosted
    with open(log, "ab") as lf:
        return subprocess.Popen([str(python), str(script), *args], stdout=lf, stderr=subprocess.STDOUT, env=dict(env),
                                cwd=cwd, stdin=subprocess.DEVNULL, start_new_session=True)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now (the kernel's choice for port 0); another process may take it
    before the caller binds it, so a server that fails to bind should be started again on a new one."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
