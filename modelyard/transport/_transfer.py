"""Helpers shared by the remote targets (:mod:`.oci`, :mod:`.s3`): what an artifact holds, how a
pulled artifact is checked, and the temp-folder-then-rename that makes a pull all or nothing.

Reuses the artifact index (:func:`modelyard.artifact.index.index_folder`: the folder matches its ``manifest.json``;
the files outside it are hashed, they are small) and :func:`unbundle.parse_contents` (a listing
whose names are safe, whose ``content_digest`` matches its own file list, no duplicates).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import stat
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Iterable

from modelyard.artifact.index import FORMAT, VERSION, dump_index, index_folder
from modelyard.artifact.layout import INDEX, MANIFEST, SIGNATURE
from modelyard.artifact.manifest import Manifest
from modelyard.errors import BundleError, HashMismatchError, InsufficientResourcesError, ManifestError, PublishError
from modelyard.paths import require_space, write_sliced
from modelyard.transport._streams import CHUNK, RANGE_PART, Hashing
from modelyard.transport.unbundle import (
    BundleContents,
    FolderSink,
    MemberFile,
    name_problem,
    parse_contents,
    remove_tree,
)

INDEX_NAME = INDEX  # the artifact's index (modelyard.artifact.index), in a bundle and beside the manifest on s3://


@dataclass(frozen=True)
class LocalFile:
    rel: str  # relative POSIX path inside the artifact
    size: int  # bytes
    sha256: str  # hex; for model/ files, manifest.json's entry (the custody chain)
    path: Path


@dataclass(frozen=True)
class LocalArtifact:
    root: Path
    manifest_bytes: bytes
    manifest: Manifest
    files: tuple[LocalFile, ...]  # every file but manifest.json, sorted by path
    index: dict[str, Any]  # the bundle.json dict: files outside manifest.json, manifest sha256, total

    @property
    def total_bytes(self) -> int:
        return len(self.manifest_bytes) + sum(f.size for f in self.files)


@dataclass(frozen=True)
class PublishResult:
    uri: str  # where it went: oci://host/repo@sha256:... or s3://bucket/prefix
    files: int  # files published, manifest.json included
    bytes: int
    content_digest: str
    digest: str | None = None  # OCI: the image manifest's digest
    skipped: int = 0  # blobs the registry already held; S3: files the prefix already held (same size and sha256)
    sent: int | None = None  # bytes sent (a killed publish's files, parts and chunks are not sent again); None: not counted
    referrers: tuple[str, ...] = ()  # OCI: what was pushed as referrers of the manifest (signature, verification, smoke)
    restarted: tuple[str, ...] = ()  # OCI: files whose kept upload session the registry had forgotten (sent again whole)
    base: PublishResult | None = None  # a LoRA adapter's base, published beside it first (transport.publish.base_target)


@dataclass(frozen=True)
class PullResult:
    path: Path
    files: int
    bytes: int
    content_digest: str
    signature_verified: bool | None = None  # None: no key given (or no model.sig and none required)
    signature_from: str | None = None  # where the verified signature came from: "layer" or "referrer"


def read_artifact(root: Path) -> LocalArtifact:
    """The artifact folder ``root``, checked against its manifest (a store reference is resolved by
    :func:`modelyard.transport.refs.load_artifact`). Raises :class:`PublishError` when the folder does not
    match its manifest or holds a file named :data:`INDEX_NAME`."""
    try:
        manifest_bytes = (root / MANIFEST).read_bytes()
        meta, _dirs, expect = index_folder(root, manifest_bytes)
    except BundleError as exc:
        raise PublishError(exc.message, fix=exc.fix) from exc
    if INDEX_NAME in expect:
        raise PublishError(f"{root} holds a {INDEX_NAME}; that name is reserved", fix="Rename or remove that file.")
    files = tuple(LocalFile(rel, size, sha, root / rel) for rel, (size, sha) in sorted(expect.items()))
    return LocalArtifact(root, manifest_bytes, Manifest.from_bytes(manifest_bytes), files, meta)


def parse_listing(where: str, manifest_bytes: bytes, extras: Iterable[tuple[str, int, str]]) -> BundleContents:
    """Check a remote artifact's listing: ``manifest.json`` (model/ files) plus the other files
    (path, size, sha256). Refuses unsafe names, duplicates and a ``content_digest`` that does not
    match the manifest's own file list. Returns every expected file (manifest.json excluded)."""
    extras = sorted(extras)
    meta = {"format": FORMAT, "version": VERSION, "manifest_sha256": hashlib.sha256(manifest_bytes).hexdigest(),
            "files": [{"path": p, "size": s, "sha256": h} for p, s, h in extras], "total_bytes": 0}
    try:
        listed = Manifest.from_bytes(manifest_bytes, f"{where}: manifest.json")
        if "files" not in listed.present:
            raise ManifestError(f"{where}: manifest.json has no files[]")
        meta["total_bytes"] = listed.model_bytes + sum(s for _, s, _ in extras)
    except ManifestError as exc:
        raise PublishError(f"{where}: manifest.json is not a modelyard manifest (files[] of path, size, sha256)",
                           fix="Pull an artifact published by `modelyard publish`.") from exc
    return check_index(where, manifest_bytes, dump_index(meta))


def check_index(where: str, manifest_bytes: bytes, index_bytes: bytes) -> BundleContents:
    try:
        return parse_contents(where, manifest_bytes, index_bytes)
    except BundleError as exc:
        raise PublishError(exc.message, fix="Do not use this copy: publish the artifact again with "
                                            "`modelyard publish`, then pull again.") from exc


def check_rel(where: str, rel: str) -> str:
    problem = name_problem(rel)
    if problem or rel in (MANIFEST, INDEX_NAME):
        raise PublishError(f"{where}: refused the path {rel!r}: {problem or 'a reserved name'}",
                           fix="Do not use this copy; it is not a safe modelyard artifact.")
    return rel


class Staging:
    """A temp folder beside ``into`` (which must not exist), renamed to ``into`` by :meth:`commit`;
    removed on any failure (use as a context manager).

    With ``resume`` (an id of exactly what is pulled: the manifest's sha256, or the OCI manifest digest), the
    folder is ``.<into's name>.pull-<resume[:16]>``, the same for the same pull: a pull that was killed, or
    failed while downloading a file (the network, Ctrl-C), leaves it behind, and the next pull of the same
    content into the same ``into`` continues from it. Files it already holds are hashed again and kept when they
    match; a partial file is hashed and continued from its end (:meth:`write` with a ``chunks(start)``
    callable: a ranged request), and its whole sha256 is still checked. A folder whose bytes do not match is
    removed, so the next pull starts that content afresh. An exclusive lock (``.<name>.pull-<id>.lock``, flock)
    keeps two pulls out of one folder. As ``huggingface_hub`` continues a ``.incomplete`` blob."""

    def __init__(self, into: Path, resume: str | None = None, total: int = 0) -> None:
        self.into = Path(into).expanduser().absolute()
        if self.into.exists():
            raise PublishError(f"{self.into} already exists", fix="Pass -o/--output a folder that does not exist yet.")
        self.resumable = resume is not None
        self.keep = False  # a resumable pull failed while downloading: keep what it holds for the next one
        self.reused = 0  # bytes found complete and matching in a resumed folder (not downloaded again)
        self.continued = 0  # bytes of partial files continued (not downloaded again)
        self.advance: Callable[[int], None] | None = None  # progress: told of the bytes a resumed folder holds
        self._lock: BinaryIO | None = None
        try:
            self.into.parent.mkdir(parents=True, exist_ok=True)
            if resume is None:
                self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.into.name}.pull-", dir=self.into.parent))
            else:
                self.tmp = self.into.parent / f".{self.into.name}.pull-{resume.removeprefix('sha256:')[:16]}"
                self._lock = _exclusive(self.tmp.with_name(self.tmp.name + ".lock"), self.into)
                _own_folder(self.tmp)
        except PublishError:
            self._unlock()
            raise
        except OSError as exc:
            self._unlock()
            raise PublishError(f"cannot create a folder beside {self.into}: {exc.strerror or exc}",
                               fix="Check the permissions and free space of -o/--output's parent.") from exc
        self._expected: set[str] | None = None  # what the artifact holds, once the caller says (expect())
        self.sink = FolderSink(self.tmp, self.into)
        self.total = total  # bytes the pull will write (0: not checked): see reserve()

    def __enter__(self) -> Staging:
        if self.total:
            try:
                self.reserve(self.total)
            except BaseException as exc:
                self.keep = any(self.tmp.iterdir())  # what a killed pull left is kept for a pull with room enough
                self.__exit__(type(exc), exc, exc.__traceback__)
                raise
        return self

    def reserve(self, total: int) -> None:
        """Refuse (exit 2, :class:`InsufficientResourcesError`) a pull of ``total`` bytes the filesystem of
        ``into`` cannot hold, counting what a resumed folder already holds, before the first byte is fetched."""
        held = sum(p.stat().st_size for p in self.tmp.rglob("*") if p.is_file()) if self.resumable else 0
        require_space([(self.into, total - held, "the pulled artifact")], elsewhere="pull into another -o/--output")

    def __exit__(self, et, ev, tb) -> None:  # noqa: ANN001
        try:
            keep = self.resumable and (self.keep or (et is not None and issubclass(et, KeyboardInterrupt)))
            if et is not None and self.tmp.exists() and not keep:
                remove_tree(self.tmp)
        finally:
            self._unlock()

    def _unlock(self) -> None:
        if self._lock is not None:
            self.tmp.with_name(self.tmp.name + ".lock").unlink(missing_ok=True)
            self._lock.close()
            self._lock = None

    def expect(self, rels: Iterable[str]) -> None:
        """Say which files the artifact holds (``rels``, relative paths; ``manifest.json`` and ``model.sig`` are
        always allowed): everything else in the folder is removed now and again at :meth:`commit`, whatever
        planted it (a file the manifest does not list never reaches the pulled artifact, with or without a
        signature check), and so is every symbolic link or special file at any depth (never followed)."""
        self._expected = {*rels, MANIFEST, SIGNATURE}
        self._prune()

    def _prune(self) -> None:
        if self._expected is None:
            return
        folders = {"/".join(parts[:i]) for e in self._expected if (parts := e.split("/")) for i in range(1, len(parts))}
        for top, dirs, files in os.walk(self.tmp, topdown=True, followlinks=False):
            here = Path(top)
            for name in list(dirs):
                path = here / name
                if path.is_symlink():  # os.walk lists a link to a folder among the folders
                    dirs.remove(name)
                    path.unlink()
                elif path.relative_to(self.tmp).as_posix() not in folders:
                    dirs.remove(name)
                    remove_tree(path)
            for name in files:
                path = here / name
                if path.relative_to(self.tmp).as_posix() not in self._expected or not path.is_file() \
                        or path.is_symlink():
                    path.unlink()

    def _inside(self, rel: str) -> Path:
        """``tmp/rel`` once every folder on the way is a real folder inside ``tmp`` (made when missing, never a
        symbolic link followed); raises :class:`PublishError` otherwise."""
        dst = self.tmp / rel
        here = self.tmp
        for part in Path(rel).parent.parts:
            here = here / part
            try:
                os.mkdir(here, 0o755)
            except FileExistsError:
                if here.is_symlink() or not here.is_dir():
                    raise PublishError(f"{self.tmp}: {here.relative_to(self.tmp)} is not a folder this pull made "
                                       "(a symbolic link or a file); nothing is written through it",
                                       fix=f"Remove {self.tmp}, then pull again.") from None
        if dst.is_symlink():
            dst.unlink()
        return dst

    def put(self, rel: str, data: bytes) -> None:
        dst = self._inside(rel)
        if self.resumable:
            dst.unlink(missing_ok=True)  # a resumed folder's copy: the small files are written again
        try:
            self.sink.put(rel, data)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                dst.unlink(missing_ok=True)
                self.keep = self.resumable
                raise self._full(rel, len(data)) from exc
            raise

    def _resume_from(self, rel: str, size: int, sha256: str, ranged: bool) -> tuple[int, Any]:
        """``(bytes to keep, their sha256 state)`` of a resumed folder's ``rel``: ``size`` when the whole file is
        there and matches, the partial file's length when it can be continued (``ranged``), else 0 (removed)."""
        dst = self._inside(rel)
        h = hashlib.sha256()
        if not self.resumable or dst.is_symlink() or not dst.is_file():
            return 0, h
        n = dst.stat().st_size
        if n <= size and (ranged or n == size):
            with open(dst, "rb") as fh:
                while block := fh.read(CHUNK):
                    h.update(block)
            if n < size or h.hexdigest() == sha256:
                return n, h
        dst.unlink()
        return 0, hashlib.sha256()

    def write(self, rel: str, chunks: Iterable[bytes] | Callable[[int], Iterable[bytes]], size: int, sha256: str,
              where: str) -> None:
        """Stream ``chunks`` into ``rel``, hashing as it goes; the file is kept only when its size
        and sha256 match (:class:`HashMismatchError` names the file otherwise). ``chunks`` is the bytes in
        order, or a callable giving them from a byte offset on (a resumed partial file continues there)."""
        have, h = self._resume_from(rel, size, sha256, callable(chunks))
        if have and self.advance is not None:
            self.advance(have)
        if have == size and have:
            self.reused += size
            self.sink.commit(rel, open(self.tmp / rel, "rb"), sha256, None)  # noqa: SIM115 - closed by commit
            return
        self.continued += have
        n = have
        if have:
            os.chmod(self.tmp / rel, 0o644, follow_symlinks=False)
            fh: MemberFile = os.fdopen(os.open(self.tmp / rel, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW), "ab")
        else:
            fh = self.sink.open(rel)
        hasher = Hashing(h) if size - have > RANGE_PART else None  # a big file: hashed beside the writes
        try:
            for chunk in (chunks(have) if callable(chunks) else chunks):
                if hasher is None:
                    h.update(chunk)
                else:
                    hasher.feed(chunk)
                write_sliced(fh, chunk)
                n += len(chunk)
                if n > size:
                    break
        except OSError as exc:
            with contextlib.suppress(OSError):
                fh.close()
            self.keep = True
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise self._full(rel, size - n) from exc
            raise
        except BaseException as exc:
            fh.close()
            self.keep = not isinstance(exc, HashMismatchError)
            raise
        finally:
            if hasher is not None:
                hasher.close()
        if n != size or h.hexdigest() != sha256:
            fh.close()
            got = f"{n} bytes" if n != size else f"sha256 {h.hexdigest()}"
            resumed = f" (continued from {have} bytes a killed pull left; they are removed)" if have else ""
            raise HashMismatchError(f"{where}: {rel} differs from what the artifact records: got {got}, expected "
                                    f"{size} bytes with sha256 {sha256}{resumed}; nothing was written to {self.into}",
                                    fix="The remote copy is corrupt or was tampered with: publish the artifact again "
                                        "from a trusted store, then pull again.")
        self.sink.commit(rel, fh, sha256, None)

    def _full(self, rel: str, missing: int) -> InsufficientResourcesError:
        """The error of a disk that filled up while ``rel`` was written, ``missing`` bytes of it still to come."""
        free = shutil.disk_usage(self.tmp).free
        return InsufficientResourcesError(
            f"{self.into.parent} filled up while {rel} was written: {free:,} bytes free, {missing:,} bytes of it and "
            f"the files after it still to come; nothing was written to {self.into}",
            fix=f"Free space there (what was pulled is kept in {self.tmp} and the next pull continues it), or pull "
                "into another -o/--output.")

    def commit(self, check: Callable[[Path], None] | None = None) -> Path:
        """Rename the staged folder into place, after ``check(staged_folder)`` (which raises to refuse it; the staged
        folder is then removed, not kept for a resume)."""
        self._prune()
        if check is not None:
            try:
                check(self.tmp)
            except BaseException:
                self.keep = False
                raise
        os.chmod(self.tmp, 0o755)
        os.rename(self.tmp, self.into)
        return self.into


def _own_folder(path: Path) -> None:
    """Make ``path`` (mode 0700), or accept the one there only when it is what an earlier pull of this user made: a
    real folder (not a symbolic link, never followed), owned by this user, closed to others (no group or other
    bits). Its name is predictable (``.<into>.pull-<digest16>``), so anyone who can write beside ``into`` could
    plant one pointing elsewhere: a planted link made a pull write the model files into an outside folder.
    Raises :class:`PublishError` (exit 2) naming what is wrong."""
    try:
        os.mkdir(path, 0o700)
        return
    except FileExistsError:
        pass
    st = os.lstat(path)
    why = ("a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a folder" if not stat.S_ISDIR(st.st_mode)
           else f"owned by uid {st.st_uid}, not {os.geteuid()}" if st.st_uid != os.geteuid()
           else f"open to other users (mode {stat.S_IMODE(st.st_mode):o})" if st.st_mode & 0o077 else None)
    if why is not None:
        raise PublishError(f"{path} exists and is not a pull folder this user's modelyard made ({why}); nothing was "
                           "written through it",
                           fix=f"Remove {path} (check who made it), then pull again.")


def _exclusive(path: Path, into: Path) -> BinaryIO:
    """``path`` opened (never through a symbolic link, mode 0600) and locked (flock, exclusive, not waiting). Raises
    :class:`PublishError` when another process holds it or it is a link."""
    import fcntl  # noqa: PLC0415 - POSIX only, used by resumable pulls

    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise PublishError(f"cannot open the pull lock {path}: {exc.strerror or exc} (a symbolic link is never "
                           "followed)", fix=f"Remove {path}, then pull again.") from exc
    fh = os.fdopen(fd, "ab")  # kept open while the lock is held; closed by Staging._unlock
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        fh.close()
        raise PublishError(f"another pull into {into} is running (it holds {path})",
                           fix="Wait for it to finish, or pull into another -o/--output.") from exc
    return fh
