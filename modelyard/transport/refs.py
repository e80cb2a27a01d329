"""Artifact references: a folder that holds ``manifest.json``, or ``NAME[@REVISION]`` in a store (a folder
or an object store), and the transport verbs that accept either (:func:`bundle_artifact`,
:func:`load_artifact`). The wire formats below (:mod:`.bundle`, :mod:`.unbundle`, :mod:`._transfer`)
take resolved folders only, so that no format module needs the stores above it."""

from __future__ import annotations

from pathlib import Path

from modelyard.artifact.layout import MANIFEST
from modelyard.artifact.store import Artifact, StoreProtocol
from modelyard.errors import BundleError, PublishError
from modelyard.settings import Settings
from modelyard.transport._transfer import LocalArtifact, read_artifact
from modelyard.transport.bundle import DEFAULT_LEVEL, BundleResult, write_bundle
from modelyard.transport.objectstore import open_store


def resolve_artifact(ref: str | Path, home: str | Path | None = None, *, settings: Settings) -> Path:
    """An artifact folder from a path (a folder holding ``manifest.json``) or a store reference
    ``NAME[@REVISION]`` in the store ``home`` (a folder or ``s3://bucket/prefix``; default: the store of the run's
    ``settings``, ``MODELYARD_STORE``, else ``MODELYARD_HOME``). An object store's artifact is downloaded to the local
    cache (``settings.store_dir()``) first (every file checked). ``REVISION`` is the full revision or any prefix of it that names
    one revision (as ``modelyard list`` shortens them). Raises :class:`BundleError` for no match or an
    ambiguous prefix. With an explicit ``home``, a bare ``NAME[@REVISION]`` is looked up in that store first,
    so that a folder of the same name in the working directory does not shadow it (``./NAME`` names the
    folder); the folder is used only when the store has no such artifact."""
    p = Path(ref).expanduser()
    if home is not None and "/" not in str(ref) and p.exists():
        try:
            store, artifact = find_artifact(str(ref), home, settings=settings)
        except BundleError:
            pass
        else:
            return store.local(artifact)
    if (p / MANIFEST).is_file():
        return p.absolute()
    if p.exists():
        raise BundleError(f"{p} is not an artifact folder (no manifest.json)",
                          fix="Point at <store>/<name>/<revision>, the folder that holds manifest.json and model/.")
    store, artifact = find_artifact(str(ref), home, settings=settings)
    return store.local(artifact)


def find_artifact(ref: str, home: str | Path | None = None, *, settings: Settings) -> tuple[StoreProtocol, Artifact]:
    """The store ``home`` (as :func:`resolve_artifact` reads it, with ``settings``) and its artifact ``NAME[@REVISION]``,
    without downloading anything. Raises :class:`BundleError` for a bad reference, no match or an
    ambiguous revision prefix."""
    name, _, rev = str(ref).partition("@")
    if not name or "/" in name or "/" in rev:
        raise BundleError(f"{ref!r} is neither an artifact folder nor a store reference NAME[@REVISION]",
                          fix="Pass the artifact folder's path, or NAME@REVISION of an artifact in the store "
                              "(--store, MODELYARD_STORE or MODELYARD_HOME).")
    store = open_store(home, settings=settings)
    found = store.get(name, rev) if rev else None
    if found is not None:
        return store, found
    revs = store.revisions(name)
    matches = [r for r in revs if r.startswith(rev)]
    if len(matches) == 1:
        found = store.get(name, matches[0])
        if found is not None:
            return store, found
    where = store.where
    if rev and matches:
        raise BundleError(f"{name}@{rev} is ambiguous in the store {where}: {', '.join(matches)}",
                          fix=f"Give more of the revision, e.g. {name}@{matches[0]}.")
    if rev:
        raise BundleError(f"the store {where} holds no artifact {name}@{rev}",
                          fix="List its revisions with `modelyard list --store ...`, or set MODELYARD_STORE / MODELYARD_HOME.")
    if not revs:
        raise BundleError(f"the store {where} holds no artifact named {name!r}",
                          fix="Check the name (`modelyard list`) or pass the artifact folder's path.")
    raise BundleError(f"the store {where} holds {len(revs)} revisions of {name}: {', '.join(revs)}",
                      fix=f"Pick one: {name}@{revs[0]}.")


def bundle_artifact(artifact: str | Path, out: Path, *, settings: Settings, level: int = DEFAULT_LEVEL,
                    threads: int = -1, home: str | Path | None = None, force: bool = False) -> BundleResult:
    """Write the artifact (folder or store reference ``NAME[@REV]`` in ``home``) as the bundle ``out``:
    :func:`resolve_artifact` (with the run's ``settings``), then :func:`modelyard.transport.bundle.write_bundle` (its arguments, units
    and errors)."""
    return write_bundle(resolve_artifact(artifact, home, settings=settings), out, level=level, threads=threads, force=force)


def load_artifact(artifact: str | Path, home: Path | None = None, *, settings: Settings) -> LocalArtifact:
    """The artifact (folder or store reference ``NAME[@REV]`` in ``home``, :func:`resolve_artifact` with the run's
    ``settings``), checked against its manifest
    (:func:`modelyard.transport._transfer.read_artifact`). Raises :class:`PublishError` for a reference
    that names nothing and for a folder that does not match its manifest."""
    try:
        root = resolve_artifact(artifact, home, settings=settings)
    except BundleError as exc:
        raise PublishError(exc.message, fix=exc.fix) from exc
    return read_artifact(root)
