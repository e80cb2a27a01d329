"""Where the package's own files are: the package folder, its data and recipes, and the checkout
(the folder holding ``.venv-vllm`` and the legacy venvs when modelyard runs from a source tree); and whether a
folder's filesystem can hold what a command is about to write there (:func:`require_space`)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from pathlib import Path

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
