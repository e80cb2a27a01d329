"""The artifact store: ``<home>/<name>/<revision>/``, written atomically.

An artifact is assembled in ``<home>/.staging/<random>/`` (same filesystem) and moved into place
with one ``rename``: a reader never sees a half-written artifact, and a crash leaves only a
staging folder, which the next run removes. Publishing identical content (same
``content_digest``) again is a no-op; different content under the same name and revision is
refused with :class:`ArtifactConflictError`.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

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
        """A fresh private staging folder (removes staging leftovers older than a day)."""
        try:
            self.staging.mkdir(parents=True, exist_ok=True)
            now = time.time()
            for old in self.staging.iterdir():
                try:
                    if now - old.stat().st_mtime > _STALE_STAGING_S:
                        shutil.rmtree(old, ignore_errors=True)
                except OSError:
                    pass
            staged = Path(tempfile.mkdtemp(prefix="stage-", dir=self.staging))
            os.chmod(staged, 0o755)  # mkdtemp makes it 0700; the artifact is meant to be readable
            return staged
        except OSError as exc:
            raise StoreError(f"cannot create a staging folder under {self.staging}: {exc.strerror}",
                             fix="Check MODELYARD_HOME's permissions and free space.") from None

    def get(self, name: str, revision: str) -> Artifact | None:
        p = self.path_for(name, revision)
        try:
            m = json.loads((p / "manifest.json").read_text())
        except (OSError, ValueError):
            return None
        return Artifact(name, revision, p, m.get("content_digest", ""), reused=True)

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
                                     fix="Check MODELYARD_HOME's permissions and free space.") from None
                existing = self.get(name, revision)  # lost a race with a concurrent publisher
                if existing is None:
                    raise StoreError(f"{final} appeared while publishing but has no manifest") from None
        shutil.rmtree(staged, ignore_errors=True)
        if existing.content_digest != content_digest:
            raise ArtifactConflictError(
                f"the store already holds {name}@{revision} with different content "
                f"({existing.content_digest} != {content_digest})",
                fix="Publish under another --name, or remove the old artifact if it is wrong.")
        return existing


def _fsync_dir(d: Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass
