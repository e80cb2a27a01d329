"""The artifact store: ``<home>/<name>/<revision>/``, written atomically.

An artifact is assembled in ``<home>/.staging/<random>/`` (same filesystem) and moved into place
with one ``rename``: a reader never sees a half-written artifact, and a crash leaves only a
staging folder, which the next run removes. Publishing identical content (same
``content_digest``) again is a no-op; different content under the same name and revision is
refused with :class:`ArtifactConflictError`.
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
from typing import Any, Iterator

from modelyard.artifact.layout import MANIFEST
from modelyard.artifact.manifest import Manifest
from modelyard.errors import ArtifactConflictError, StoreError

_STALE_STAGING_S = 24 * 3600


@dataclass(frozen=True)
class Artifact:
    name: str
    revision: str
    path: Path
    content_digest: str
    reused: bool = False


class Store:
    def __init__(self, home: Path) -> None:
        self.home = Path(home).absolute()
        self.staging = self.home / ".staging"

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

    def promote(self, artifact: Path, name: str, revision: str, promotion: dict[str, Any]) -> Path:
        """Place the artifact folder ``artifact`` (from another store) at ``<home>/<name>/<revision>``
        with ``promotion`` recorded in its manifest (an earlier one moves to ``promotions``), under
        this store's lock. Files are hard-linked where the filesystem allows, else copied; the
        manifest is written last. Promoted before: only the manifest is replaced (atomically).
        Returns the artifact's path. Raises ``OSError`` on a filesystem error."""
        final = self.path_for(name, revision)
        manifest = Manifest.load(artifact).with_promotion(promotion)
        with self.lock(name, revision):
            staged = self.new_staging()
            try:
                shutil.copytree(artifact, staged, copy_function=_link_or_copy, dirs_exist_ok=True,
                                ignore=lambda d, names: [MANIFEST] if Path(d) == artifact else [])
                manifest.save(staged)
                if final.exists():  # promoted before: replace its manifest atomically, keep the files
                    manifest.save(final)
                else:
                    final.parent.mkdir(parents=True, exist_ok=True)
                    os.rename(staged, final)
            finally:
                shutil.rmtree(staged, ignore_errors=True)
        return final

    def get(self, name: str, revision: str) -> Artifact | None:
        p = self.path_for(name, revision)
        try:
            m = Manifest.load(p)
        except (OSError, ValueError):
            return None
        return Artifact(name, revision, p, m.content_digest, reused=True)

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
        if existing.content_digest != content_digest:
            raise ArtifactConflictError(
                f"the store already holds {name}@{revision} with different content "
                f"({existing.content_digest} != {content_digest})",
                fix="Publish under another --name, or remove the old artifact if it is wrong.")
        return existing


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


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
