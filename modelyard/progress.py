"""Progress reporting for long stages, decoupled from rendering.

Stages call :func:`task` (a context manager yielding an ``advance(n)`` callable); the CLI installs
a rich-backed reporter with :func:`set_reporter`. The default reporter does nothing, so library
use and tests stay quiet. A module-level reporter (not a contextvar) because Prefect runs tasks in
worker threads.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Protocol


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


@contextlib.contextmanager
def task(description: str, total: float | None = None, unit: str = "B") -> Iterator[Callable[[float], None]]:
    """Report one unit of work. ``total`` in ``unit`` (bytes by default); None = indeterminate."""
    rep = _reporter
    handle = rep.start(description, total, unit)
    try:
        yield lambda amount: rep.advance(handle, amount)
    finally:
        rep.finish(handle)
