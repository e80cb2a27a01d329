"""The artifact's index (``bundle.json``): every file of the artifact that ``manifest.json`` does not list
(report.json, report.md, serve/..., patches.json) with its size and sha256, the manifest's own sha256 and the
total bytes. With the manifest's per-file entries for ``model/``, every byte of an artifact has a sha256 to
match. A bundle carries it as its second member and an object store beside the manifest
(:mod:`modelyard.transport.bundle`, :mod:`modelyard.transport.objectstore`).

``bundle.json`` is compact JSON with sorted keys (:func:`dump_index`), so a reader re-serializes and compares:
``format`` ("modelyard-bundle"), ``version`` (1), ``manifest_sha256``, ``files`` (path, size, sha256) and
``total_bytes`` (the bytes of every file but manifest.json and the index)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from modelyard.artifact.layout import INDEX, MANIFEST
from modelyard.artifact.manifest import Manifest
from modelyard.errors import BundleError, ManifestError

FORMAT = "modelyard-bundle"
VERSION = 1
#: bytes per read when hashing
CHUNK = 4 * 1024 * 1024


def _scan(root: Path) -> tuple[list[str], dict[str, int]]:
    """Directories and files (relative POSIX paths, sizes in bytes) of ``root``; refuses links and
    special files, which a bundle never carries."""
    dirs: list[str] = []
    files: dict[str, int] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for n in sorted(dirnames + filenames):
            full = Path(dirpath, n)
            rel = full.relative_to(root).as_posix()
            st = full.lstat()
            if full.is_symlink():
                raise BundleError(f"{root}: {rel} is a symbolic link; a bundle carries regular files only",
                                  fix="Replace the link with the file it points to, or remove it.")
            if n in dirnames:
                dirs.append(rel)
            elif full.is_file():
                files[rel] = st.st_size
            else:
                raise BundleError(f"{root}: {rel} is not a regular file (a FIFO, socket or device)",
                                  fix="Remove it from the artifact folder.")
    return dirs, files


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as fh:
        while chunk := fh.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def index_folder(root: Path, manifest_bytes: bytes) -> tuple[dict[str, Any], list[str], dict[str, tuple[int, str]]]:
    """(bundle.json dict, directories, {file: (size, expected sha256)}) for the artifact ``root``.

    Checks the folder against its manifest: every ``manifest.json`` file present with its size,
    every ``model/`` file listed. Files outside the manifest are hashed here (they are small)."""
    try:
        manifest = Manifest.from_bytes(manifest_bytes)
        if "files" not in manifest.present:
            raise ManifestError("manifest.json has no files[]")
        listed = {f.path: (f.size, f.sha256) for f in manifest.files}
    except ManifestError as exc:
        raise BundleError(f"{root}/manifest.json is not a modelyard manifest (no files[] with path, size, sha256)",
                          fix="Bundle an artifact written by modelyard ingest.") from exc
    dirs, files = _scan(root)
    if INDEX in files:
        raise BundleError(f"{root} holds a {INDEX}; that name is reserved for the artifact's index",
                          fix="Rename or remove that file.")
    problems = [f"{p} is listed in manifest.json but missing" for p in listed if p not in files]
    problems += [f"{p} has {files[p]} bytes, manifest.json says {size}"
                 for p, (size, _) in listed.items() if p in files and files[p] != size]
    problems += [f"{p} is in model/ but not listed in manifest.json" for p in files
                 if p.startswith("model/") and p not in listed]
    if problems:
        raise BundleError(f"{root} does not match its manifest.json: " + "; ".join(problems[:5]),
                          fix=f"Run `modelyard verify {root}`; re-ingest the model if the artifact was changed.")
    expect = {p: listed[p] for p in files if p in listed}
    extras = []
    for p in sorted(files):
        if p in listed or p == MANIFEST:
            continue
        sha = _sha256(root / p)
        extras.append({"path": p, "size": files[p], "sha256": sha})
        expect[p] = (files[p], sha)
    meta = {"format": FORMAT, "version": VERSION, "manifest_sha256": hashlib.sha256(manifest_bytes).hexdigest(),
            "files": extras, "total_bytes": sum(s for s, _ in expect.values())}
    return meta, dirs, expect


def dump_index(meta: dict[str, Any]) -> bytes:
    """The canonical bytes of ``bundle.json`` (a reader re-serializes and compares)."""
    return json.dumps(meta, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()
