"""Kill a CLI run at a chosen point, for real: the points come from the run's own progress events
(``MODELYARD_PROGRESS_JSONL``) or its files, never from timings alone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from tests.conftest import ROOT


def events(log: Path) -> list[dict]:
    """The progress events written so far (a half-written last line is skipped)."""
    try:
        return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    except (OSError, ValueError):
        return []


def kill_at(cmd: list[str], env: dict, log: Path, hit, timeout: float = 240) -> str:
    """Run ``cmd``; SIGKILL its process group as soon as ``hit(events, seconds)`` returns a label.
    Returns the label, or "finished" when the run ended first (or "failed rc=..." with stderr's tail)."""
    log.unlink(missing_ok=True)
    errf = log.with_suffix(".stderr")
    with open(errf, "wb") as ef:
        proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=ef, start_new_session=True)
    t0 = time.monotonic()
    try:
        while proc.poll() is None and time.monotonic() - t0 < timeout:
            label = hit(events(log), time.monotonic() - t0)
            if label:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                return label
            time.sleep(0.005)
        proc.wait()
        return "finished" if proc.returncode == 0 else f"failed rc={proc.returncode}: {errf.read_text()[-500:]}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def nth(task_prefix: str, event: str, n: int):
    """A hit: the ``n``-th ``event`` ("start", "advance", "end") of a progress task starting with ``task_prefix``."""
    def hit(evs, _t):
        k = sum(1 for e in evs if e["task"].startswith(task_prefix) and e["event"] == event)
        return f"{task_prefix} {event} #{n}" if k >= n else None
    return hit


def first_of(*hits):
    """A hit: the first of ``hits`` that hits (with its label). A later stage's event as a fallback keeps a kill
    point from being skipped when the run's progress makes it unreachable (a resumed download that ends in fewer
    advances than the point waits for), so the run is still killed, not finished."""
    def hit(evs, t):
        for h in hits:
            label = h(evs, t)
            if label:
                return label
        return None
    return hit


def outlived(pid: int, seconds: float = 30.0) -> bool:
    """True when process ``pid`` is still alive after ``seconds`` (it is then SIGKILLed); False as soon as it is gone."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        time.sleep(0.2)
    os.kill(pid, signal.SIGKILL)
    return True
