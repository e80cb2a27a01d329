"""Where the package's own files are: the package folder, its data and recipes, and the checkout
(the folder holding ``.venv-vllm`` and the legacy venvs when modelyard runs from a source tree); and whether a
folder's filesystem can hold what a command is about to write there (:func:`require_space`); hidden partial files
that a killed writer left, swept by the next one (:func:`open_partial`, :func:`sweep_partials`)."""

from __future__ import annotations

import fcntl
import glob
import os
import secrets
import shutil
import stat
import time
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO, Protocol

from modelyard.errors import InsufficientResourcesError

#: the installed ``modelyard`` package folder
PACKAGE = Path(__file__).resolve().parent
#: prompts, calibration and held-out text shipped in the wheel (``modelyard/data``)
DATA = PACKAGE / "data"
#: llm-compressor recipes shipped in the wheel (``modelyard/recipes``)
RECIPES = PACKAGE / "recipes"
#: the source checkout (one folder above the package); meaningful only for an editable install
CHECKOUT = PACKAGE.parent


def nearest_existing(path: Path) -> Path:
    """``path`` or its nearest existing parent (where a folder still to be made will live)."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def require_space(needs: Iterable[tuple[Path, int, str]], *,
                  elsewhere: str = "point MODELYARD_HOME (or --out) at a larger one") -> None:
    """Refuse, before writing, a run the disks cannot hold. ``needs``: ``(folder, bytes, what)`` triples (a
    folder may not exist yet: its nearest existing parent's filesystem is asked). Needs on one filesystem
    (same ``st_dev``) add up. Raises :class:`InsufficientResourcesError` (exit 2) naming the folder, the
    bytes needed (and for what) and the bytes free (``shutil.disk_usage``); its fix ends with ``elsewhere``
    (how to write to another filesystem)."""
    by_dev: dict[int, tuple[Path, int, list[str]]] = {}
    for folder, n, what in needs:
        if n <= 0:
            continue
        at = nearest_existing(folder)
        dev = os.stat(at).st_dev
        first, total, whats = by_dev.get(dev, (folder, 0, []))
        by_dev[dev] = (first, total + n, [*whats, f"{what} {n:,} bytes"])
    for folder, total, whats in by_dev.values():
        free = shutil.disk_usage(nearest_existing(folder)).free
        if total > free:
            raise InsufficientResourcesError(
                f"{folder} has {free:,} bytes free; this run needs {total:,} there ({', '.join(whats)})",
                fix=f"Free {total - free:,} bytes on that filesystem, or {elsewhere}.")


#: a partial file younger than this (seconds) is never swept: its writer may not hold its lock yet
PARTIAL_GRACE_S = 10.0


def open_partial(folder: Path, name: str) -> tuple[Path, BinaryIO]:
    """A new hidden ``folder/.<name>.<random>.partial``, opened for binary writing (``xb``) and held under an
    exclusive ``flock`` for as long as it is open: the mark of a live writer that :func:`sweep_partials` respects.
    Returns ``(path, file object)``; the caller renames the path over its output when done, or unlinks it."""
    path = folder / f".{name}.{secrets.token_hex(4)}.partial"
    fh = open(path, "xb")  # noqa: SIM115 - the caller closes it
    fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
    return path, fh


def sweep_partials(folder: Path, name: str) -> tuple[int, int]:
    """Remove the ``.<name>.*.partial`` files in ``folder`` that a killed writer left (:func:`open_partial`):
    those no process holds locked, unmodified for :data:`PARTIAL_GRACE_S` seconds. A SIGKILLed ``bundle`` runs
    no clean-up, and its partial bundle, as large as the artifact, was never removed (three kills: 312 MB).
    Returns ``(files removed, bytes freed)``; files it cannot open or remove are left alone."""
    removed = freed = 0
    now = time.time()
    for path in folder.glob(f".{glob.escape(name)}.*.partial"):
        try:
            st = path.lstat()
            if not stat.S_ISREG(st.st_mode) or now - st.st_mtime < PARTIAL_GRACE_S:
                continue
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises while a live writer holds it
            path.unlink()
            removed, freed = removed + 1, freed + st.st_size
        except OSError:
            pass
        finally:
            os.close(fd)
    return removed, freed


#: the most bytes one ``write()`` call hands the kernel (:func:`write_sliced`)
WRITE_SLICE = 256 * 1024


class Writable(Protocol):
    """A binary file's ``write`` (a file object, a sink's member file)."""

    def write(self, data: memoryview, /) -> int | None: ...


def write_sliced(fh: Writable, data: bytes | bytearray | memoryview, step: int = WRITE_SLICE) -> int:
    """Write ``data`` to ``fh`` in slices of at most ``step`` bytes (views, no copies); returns the bytes written.

    Why: on this project's 2-core VMs a 1 GiB file written in 4 MiB or 16 MiB ``write()`` calls took 7 to 8.6 s,
    in 256 KiB calls 0.3 to 0.5 s (fresh page cache after ``sync``, ext4; ``benchmarks/README.md``, "Big
    transfers"): the ranged pulls (16 MiB parts) and the bundle extraction (4 MiB chunks) wrote at a sixth of
    the disk's speed. Raises what ``fh.write`` raises (``OSError``, ENOSPC among them)."""
    with memoryview(data) as mv:
        for off in range(0, len(mv), step):
            fh.write(mv[off:off + step])
        return len(mv)
