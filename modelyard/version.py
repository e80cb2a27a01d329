"""The package version, in its own module so that every layer can read it without the facade; and the
identity of the code and libraries a cached result was computed with (:func:`code_digest`,
:func:`library_versions`), which every cache key holds."""

from __future__ import annotations

import hashlib
from functools import lru_cache
from importlib import metadata
from pathlib import Path

__version__ = "0.1.0"

#: the installed ``modelyard`` package folder
_PACKAGE = Path(__file__).resolve().parent


@lru_cache(maxsize=1)
def code_digest() -> str:
    """SHA256 (hex) over the relative path and bytes of every file of the ``modelyard`` package
    (caches excluded); computed once per process (about 150 files, milliseconds)."""
    h = hashlib.sha256()
    for p in sorted(_PACKAGE.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".pyo"):
            h.update(p.relative_to(_PACKAGE).as_posix().encode() + b"\0")
            h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


@lru_cache(maxsize=8)
def library_versions(names: tuple[str, ...]) -> dict[str, str | None]:
    """Installed versions of the distributions ``names`` (None when one is not installed)."""
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out
