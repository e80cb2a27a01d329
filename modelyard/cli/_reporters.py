"""The two progress displays of a command's stages (:class:`modelyard.progress.Reporter`): rich bars on a
terminal (:class:`RichReporter`), plain lines for logs and pipes (:class:`LineReporter`)."""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

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
from rich.table import Column
from rich.text import Text


class _AmountColumn(ProgressColumn):
    """Bytes as sizes, files as counts, indeterminate work as 'done' when finished."""

    def render(self, task):  # noqa: ANN001, ANN201

        unit = task.fields.get("unit")
        if task.fields.get("spin") or task.total is None:
            return Text("done" if task.finished else "")
        if unit == "B":
            return Text(f"{decimal(int(task.completed))}/{decimal(int(task.total))}")
        return Text(f"{int(task.completed)}/{int(task.total)} {unit}")


class RichReporter:
    """progress.Reporter drawing rich bars on stderr (a terminal); one live display for the whole command."""

    def __init__(self, console: Console) -> None:
        # no column wraps: on a narrow terminal the description is cut with an ellipsis, one line per stage
        amount, elapsed, bar = len("999.9 MB/999.9 MB"), len("0:00:00"), 16
        desc = max(12, console.width - (1 + bar + amount + elapsed + 4))  # 4: the spaces between the 5 columns
        self.p = Progress(SpinnerColumn(),
                          TextColumn("{task.description}", table_column=Column(no_wrap=True, overflow="ellipsis",
                                                                               max_width=desc)),
                          BarColumn(bar_width=bar), _AmountColumn(table_column=Column(no_wrap=True, min_width=amount)),
                          TimeElapsedColumn(table_column=Column(no_wrap=True, min_width=elapsed)),
                          console=console, transient=False)
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


def stage_line(description: str, done: float, total: float | None, unit: str, seconds: float) -> str:
    """The one line a finished stage prints when stderr is not a terminal:
    ``"{description}: {amount} in {seconds:.1f} s"``; the amount is a decimal size for bytes
    (``272.6 MB``), ``N {unit}`` for counts and ``done`` for work of unknown size."""
    if total is None:
        amount = "done"
    elif unit == "B":
        amount = decimal(int(done))
    else:
        amount = f"{int(done)} {unit}"
    return f"{description}: {amount} in {seconds:.1f} s"


#: a stage running this long without a line prints a heartbeat line when stderr is not a terminal (seconds)
HEARTBEAT_SECONDS = 30.0


def heartbeat_line(description: str, done: float, total: float | None, unit: str, seconds: float) -> str:
    """The line a stage still running prints every :data:`HEARTBEAT_SECONDS` when stderr is not a terminal:
    ``"{description}: still running, {amount} after {seconds:.0f} s"``, the amount as ``272.6 MB/1.2 GB``
    for bytes, ``3/10 {unit}`` for counts, and left out for work of unknown size."""
    if total is None:
        amount = ""
    elif unit == "B":
        amount = f", {decimal(int(done))}/{decimal(int(total))}"
    else:
        amount = f", {int(done)}/{int(total)} {unit}"
    return f"{description}: still running{amount} after {seconds:.0f} s"


class LineReporter:
    """progress.Reporter for a stderr that is not a terminal (CI logs, pipes): no bars, one plain line per
    finished stage (:func:`stage_line`), never wrapped, and a :func:`heartbeat_line` for a stage that has
    run ``heartbeat`` seconds (default :data:`HEARTBEAT_SECONDS`) since its start or its last line, so that a
    log shows a long quantize or download is alive. A stage that fails prints nothing: the error follows."""

    def __init__(self, console: Console, heartbeat: float = HEARTBEAT_SECONDS) -> None:
        self.console = console
        self.lock = threading.Lock()  # Prefect runs stages in worker threads
        self.tasks: dict[int, list[Any]] = {}
        self.next = 0
        self.heartbeat = heartbeat
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, description: str, total: float | None, unit: str) -> object:
        with self.lock:
            self.next += 1
            now = time.monotonic()
            self.tasks[self.next] = [description, total, unit, 0.0, now, now]
            if self._thread is None:
                self._thread = threading.Thread(target=self._beat, name="modelyard-heartbeat", daemon=True)
                self._thread.start()
            return self.next

    def _beat(self) -> None:
        while not self._stop.wait(min(self.heartbeat, 1.0)):
            now = time.monotonic()
            with self.lock:
                due = [t for t in self.tasks.values() if now - t[5] >= self.heartbeat]
                for t in due:
                    t[5] = now
                    self.console.print(escape(heartbeat_line(t[0], t[3], t[1], t[2], now - t[4])), highlight=False,
                                       soft_wrap=True)

    def advance(self, handle: object, amount: float) -> None:
        with self.lock:
            self.tasks[handle][3] += amount  # type: ignore[index]

    def finish(self, handle: object) -> None:
        failed = sys.exc_info()[0] is not None  # finish runs in progress.task's finally, also on failure
        with self.lock:
            description, total, unit, done, t0, _ = self.tasks.pop(handle)  # type: ignore[call-overload]
            if not failed:
                line = stage_line(description, total if total is not None else done, total, unit,
                                  time.monotonic() - t0)
                self.console.print(escape(line), highlight=False, soft_wrap=True)

    def close(self) -> None:
        self._stop.set()
