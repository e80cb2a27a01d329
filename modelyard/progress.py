"""Progress reporting for long stages, decoupled from rendering.

Stages call :func:`task` (a context manager yielding an ``advance(n)`` callable); the CLI installs
a rich-backed reporter with :func:`set_reporter`. The default reporter does nothing, so library
use and tests stay quiet. A module-level reporter (not a contextvar) because Prefect runs tasks in
worker threads.

``MODELYARD_PROGRESS_JSONL=FILE`` also appends every event as one JSON line (``{"t": unix seconds,
"pid", "event": "start" | "advance" | "finish", "task": description, "total", "amount"}``), flushed
at once: machine-readable progress for schedulers and dashboards (and the crash-consistency harness,
which kills a run at chosen events).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Protocol

from modelyard.settings import env_value


class Reporter(Protocol):
    def start(self, description: str, total: float | None, unit: str) -> object: ...
    def advance(self, handle: object, amount: float) -> None: ...
    def finish(self, handle: object) -> None: ...


class _Null:
    def start(self, description: str, total: float | None, unit: str) -> object:
        return None

    def advance(self, handle: object, amount: float) -> None:
        pass

    def finish(self, handle: object) -> None:
        pass


_reporter: Reporter = _Null()


def set_reporter(reporter: Reporter | None) -> None:
    """Install ``reporter`` (None restores the silent default)."""
    global _reporter
    _reporter = reporter if reporter is not None else _Null()


_jsonl_lock = threading.RLock()  # re-entrant: a tqdm garbage-collected inside _event (its __del__ closes a progress task) re-enters


def _event(event: str, description: str, **fields: object) -> None:
    path = env_value("progress_jsonl")
    if not path:
        return
    line = json.dumps({"t": round(time.time(), 4), "pid": os.getpid(), "event": event, "task": description, **fields})
    try:
        with _jsonl_lock, open(path, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")
    except OSError:
        pass  # progress is best effort; it never fails a run


@contextlib.contextmanager
def task(description: str, total: float | None = None, unit: str = "B") -> Iterator[Callable[[float], None]]:
    """Report one unit of work. ``total`` in ``unit`` (bytes by default); None = indeterminate."""
    rep = _reporter
    handle = rep.start(description, total, unit)
    _event("start", description, total=total, unit=unit)

    def advance(amount: float) -> None:
        rep.advance(handle, amount)
        _event("advance", description, amount=amount)

    try:
        yield advance
    finally:
        rep.finish(handle)
        _event("finish", description)
