"""The artifact store: ``<home>/<name>/<revision>/``, written atomically.

An artifact is assembled in ``<home>/.staging/<random>/`` (same filesystem) and moved into place
with one ``rename``: a reader never sees a half-written artifact, and a crash leaves only a
staging folder, which the next run removes. Publishing identical content (same
``content_digest``) again is a no-op; different content under the same name and revision is
refused with :class:`ArtifactConflictError`.

:class:`StoreProtocol` is what the flows and stages use of a store. :class:`Store` is the local folder;
the object-store store (:class:`modelyard.transport.objectstore.S3Store`, in the transport layer because it
speaks S3) implements the same protocol with a local :class:`Store` as its cache.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Protocol, runtime_checkable

from modelyard.artifact.layout import MANIFEST
from modelyard.artifact.manifest import Manifest
from modelyard.errors import ArtifactConflictError, StoreError

_STALE_STAGING_S = 24 * 3600


@dataclass(frozen=True)
class Artifact:
    """A stored artifact. ``path`` is a local folder holding it: the artifact itself in a folder store;
    for an object store, this worker's cached copy (present once :meth:`Store.local` fetched it, or
    once this worker published it). ``uri`` is its place in an object store (None for a folder store)."""

    name: str
    revision: str
    path: Path
    content_digest: str
    reused: bool = False
    uri: str | None = None

    @property
    def location(self) -> str:
        """Where the artifact lives, for people: the ``s3://`` URI, else the folder."""
        return self.uri or str(self.path)


@runtime_checkable
class StoreProtocol(Protocol):
    """A store of artifacts ``name@revision``: staging beside it, a per-revision lock, an atomic
    ``publish`` (one commit wins), ``promote`` (copy with a promotion record), reads by relative path and
    a local folder of an artifact. Folder: :class:`Store`; object store: ``transport.objectstore.S3Store``."""

    home: Path  # a local folder: the store itself, or an object store's cache

    @property
    def where(self) -> str: ...
    def new_staging(self) -> Path: ...
    def sweep_staging(self) -> None: ...
    def lock(self, name: str, revision: str, timeout: float = ...) -> contextlib.AbstractContextManager[None]: ...
    def promote(self, artifact: Path, name: str, revision: str, promotion: dict[str, Any]) -> Artifact: ...
    def load(self, name: str, revision: str) -> tuple[Artifact, Manifest] | None: ...
    def get(self, name: str, revision: str) -> Artifact | None: ...
    def read(self, artifact: Artifact, rel: str) -> bytes: ...
    def local(self, artifact: Artifact) -> Path: ...
    def revisions(self, name: str) -> list[str]: ...
    def list(self) -> list[tuple[Artifact, Manifest]]: ...
    def publish(self, staged: Path, name: str, revision: str, content_digest: str) -> Artifact: ...


class Store:
    """The folder store ``<home>/<name>/<revision>/`` (see the module doc); implements :class:`StoreProtocol`."""

    def __init__(self, home: Path) -> None:
        self.home = Path(home).absolute()
        self.staging = self.home / ".staging"

    @property
    def where(self) -> str:
        """The store, for messages: its folder."""
        return str(self.home)

    def path_for(self, name: str, revision: str) -> Path:
        return self.home / name / revision

    def new_staging(self) -> Path:
        """A fresh private staging folder ``stage-<pid>-<random>``. Leftovers of runs that died
        (their pid no longer exists) and any older than a day are removed first, so a killed ingest
        leaves nothing behind once the next one starts."""
        try:
            self.sweep_staging()
            staged = Path(tempfile.mkdtemp(prefix=f"stage-{os.getpid()}-", dir=self.staging))
            os.chmod(staged, 0o755)  # mkdtemp makes it 0700; the artifact is meant to be readable
            return staged
        except OSError as exc:
            raise StoreError(f"cannot create a staging folder under {self.staging}: {exc.strerror}",
                             fix="Check MODELYARD_HOME's permissions and free space.") from exc

    def sweep_staging(self) -> None:
        """Remove staging folders of runs that died (their pid is gone) or are older than a day."""
        self.staging.mkdir(parents=True, exist_ok=True)
        now = time.time()
        for old in self.staging.iterdir():
            try:
                if not _owner_alive(old.name) or now - old.stat().st_mtime > _STALE_STAGING_S:
                    shutil.rmtree(old, ignore_errors=True)
            except OSError:
                pass

    @contextlib.contextmanager
    def lock(self, name: str, revision: str, timeout: float = 6 * 3600) -> Iterator[None]:
        """Hold the exclusive lock of ``name@revision`` (``<home>/.locks/``, ``fcntl.flock``) for
        the duration: concurrent ingests of the same source and options run one at a time, so the
        later ones find the finished artifact and reuse it instead of doing the work again.
        The kernel drops the lock when its holder dies, so a killed run never blocks the next.
        Raises :class:`StoreError` after ``timeout`` seconds of waiting."""

        locks = self.home / ".locks"
        try:
            locks.mkdir(parents=True, exist_ok=True)
            fd = os.open(locks / f"{name}@{revision}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise StoreError(f"cannot create a lock under {locks}: {exc.strerror}",
                             fix="Check MODELYARD_HOME's permissions and free space.") from exc
        try:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError as exc:
                    if time.monotonic() > deadline:
                        raise StoreError(f"{name}@{revision} stayed locked by another ingest for {timeout:.0f} s",
                                         fix="Wait for the other run to finish, or stop it.") from exc
                    time.sleep(0.5)
            yield
        finally:
            os.close(fd)  # releases the lock

    def promote(self, artifact: Path, name: str, revision: str, promotion: dict[str, Any]) -> Artifact:
        """Place the artifact folder ``artifact`` (from another store) at ``<home>/<name>/<revision>``
        with ``promotion`` recorded in its manifest, under this store's lock. Files are hard-linked where
        the filesystem allows, else copied; the manifest is written last. Promoted before: only the
        manifest is replaced (atomically), and it is the manifest already here that gains the new
        promotion, its earlier one moving to ``promotions``, so no promotion is lost.
        Raises :class:`ArtifactConflictError` when this store holds other content under that name and
        revision, ``OSError`` on a filesystem error."""
        final = self.path_for(name, revision)
        source = Manifest.load(artifact)
        with self.lock(name, revision):
            current = self.load(name, revision)
            if current is not None:  # promoted before: replace its manifest atomically, keep the files
                same_content(current[0], source.content_digest, f"the store {self.where}")
                current[1].with_promotion(promotion).save(final)
                return current[0]
            staged = self.new_staging()
            try:
                shutil.copytree(artifact, staged, copy_function=_share_or_copy(artifact), dirs_exist_ok=True,
                                ignore=lambda d, names: [MANIFEST] if Path(d) == artifact else [])
                source.with_promotion(promotion).save(staged)
                final.parent.mkdir(parents=True, exist_ok=True)
                os.rename(staged, final)
            finally:
                shutil.rmtree(staged, ignore_errors=True)
        return Artifact(name, revision, final, source.content_digest)

    def load(self, name: str, revision: str) -> tuple[Artifact, Manifest] | None:
        """The stored ``name@revision`` and its manifest, or None when absent (or unreadable)."""
        p = self.path_for(name, revision)
        try:
            m = Manifest.load(p)
        except (OSError, ValueError):
            return None
        return Artifact(name, revision, p, m.content_digest, reused=True), m

    def get(self, name: str, revision: str) -> Artifact | None:
        found = self.load(name, revision)
        return found[0] if found else None

    def read(self, artifact: Artifact, rel: str) -> bytes:
        """The bytes of ``rel`` (e.g. ``report.json``) inside the stored artifact; ``OSError`` when absent."""
        return (artifact.path / rel).read_bytes()

    def local(self, artifact: Artifact) -> Path:
        """A local folder holding the artifact: here, the artifact's own folder."""
        return artifact.path

    def revisions(self, name: str) -> list[str]:
        """The revisions stored under ``name`` (those with a manifest), sorted."""
        d = self.home / name
        try:
            return sorted(r.name for r in d.iterdir() if (r / MANIFEST).is_file())
        except OSError:
            return []

    def list(self) -> list[tuple[Artifact, Manifest]]:
        """Every artifact with a readable manifest (staging and cache folders, named ``.*``, skipped).
        Raises :class:`StoreError` when the store cannot be read."""
        out = []
        try:
            for mf in self.home.glob(f"*/*/{MANIFEST}"):
                if mf.parent.parent.name.startswith("."):
                    continue
                try:
                    m = Manifest.load(mf.parent)
                except (OSError, ValueError):
                    continue
                out.append((Artifact(mf.parent.parent.name, mf.parent.name, mf.parent, m.content_digest, True), m))
        except OSError as exc:
            raise StoreError(f"cannot read the store {self.home}: {exc.strerror or exc}",
                             fix="Check MODELYARD_HOME (or --store).") from exc
        return out

    def publish(self, staged: Path, name: str, revision: str, content_digest: str) -> Artifact:
        """Move ``staged`` to ``<home>/<name>/<revision>``. Idempotent for equal content.

        Raises :class:`ArtifactConflictError` (exit 2) for different content at that place,
        :class:`StoreError` when the filesystem refuses.
        """
        final = self.path_for(name, revision)
        existing = self.get(name, revision)
        if existing is None and final.exists():
            raise StoreError(f"{final} exists but has no readable manifest.json",
                             fix="Move that folder away; it is not a modelyard artifact.")
        if existing is None:
            try:
                read_only(staged)
                final.parent.mkdir(parents=True, exist_ok=True)
                os.rename(staged, final)
                _fsync_dir(final.parent)
                return Artifact(name, revision, final, content_digest)
            except OSError as exc:
                if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise StoreError(f"cannot publish into {final}: {exc.strerror}",
                                     fix="Check MODELYARD_HOME's permissions and free space.") from exc
                existing = self.get(name, revision)  # lost a race with a concurrent publisher
                if existing is None:
                    raise StoreError(f"{final} appeared while publishing but has no manifest") from exc
        shutil.rmtree(staged, ignore_errors=True)
        same_content(existing, content_digest)
        return existing


def same_content(existing: Artifact, content_digest: str, where: str = "the store") -> None:
    """Raises :class:`ArtifactConflictError` (exit 2) when ``existing`` holds other content than ``content_digest``."""
    if existing.content_digest != content_digest:
        raise ArtifactConflictError(
            f"{where} already holds {existing.name}@{existing.revision} "
            f"with different content ({existing.content_digest} != {content_digest})",
            fix="Publish under another --name, or remove the old artifact if it is wrong.")


def read_only(root: Path) -> None:
    """Make every file under ``root`` read-only (0444): a stored artifact is changed only by replacing a
    file through a rename (the manifest on promotion, ``model.sig`` on signing), never in place."""
    for p in Path(root).rglob("*"):
        if p.is_file() and not p.is_symlink():
            os.chmod(p, 0o444)


def _share_or_copy(artifact: Path) -> Any:
    """The copy function of a promotion from ``artifact``: a read-only file of ``model/`` is hard-linked
    (where the filesystem allows), everything else is copied, so that no writable file is shared between
    two stores (editing staging's ``serve/`` once changed production's, through a shared inode)."""
    model = (Path(artifact) / "model").as_posix() + "/"

    def copy(src: str, dst: str) -> None:
        if src.startswith(model) and not os.stat(src).st_mode & 0o222:
            try:
                os.link(src, dst)
                return
            except OSError:
                pass
        shutil.copy2(src, dst)
        os.chmod(dst, 0o444)

    return copy


def _owner_alive(staging_name: str) -> bool:
    """Whether the process that made ``stage-<pid>-...`` still runs (True when the name has no pid)."""
    parts = staging_name.split("-")
    if len(parts) < 3 or parts[0] != "stage" or not parts[1].isdigit():
        return True
    try:
        os.kill(int(parts[1]), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def _fsync_dir(d: Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass
