"""hashing: SHA256 and size of every file, compared with what the source promised.

The whole-file SHA256 is the custody chain's identity (docs/architecture.md): the hub's LFS sha256, the
manifest entry, the OCI layer digest. Non-LFS files on the hub are identified by their git blob
id, ``sha1(b"blob <size>\\0" + content)`` (git's object format). Files are hashed in a thread
pool (hashlib releases the GIL on large updates), largest first, with 4 MiB ``readinto`` reads into
one reused buffer; each byte is read once and feeds both digests when both are needed.

A download is hashed as it is written (:class:`DigestWriter`): the file is never read back to be
hashed. Such a file's :class:`FileEntry` says ``received`` and the hash stage skips it.

A :class:`DigestCache` (``<MODELYARD_HOME>/.cache/digests``) remembers the digests of a file keyed by
its ``(st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns)``, so hashing an unchanged file again reads
no byte. ``st_ctime_ns`` is in the key because ``mtime`` can be set back (``touch -d``, ``os.utime``)
while ctime cannot. A file changed within :data:`RACY_S` seconds of hashing is not cached (git's
"racily clean" problem: a rewrite within one timestamp tick would keep the key).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from modelyard import progress
from modelyard.errors import HashMismatchError, StoreError
from modelyard.model.snapshot import FileEntry, Snapshot

if TYPE_CHECKING:
    from modelyard.settings import Settings

CHUNK = 4 * 1024 * 1024  # bytes per read
RACY_S = 2.0  # a file modified this recently (seconds) is hashed but not cached
_HEX64 = re.compile(r"[0-9a-f]{64}")
_HEX40 = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class FileDigest:
    """Digests of one file: ``sha256`` (hex), ``git_sha1`` (git blob id, when asked), ``size``
    (bytes hashed), ``bytes_read`` (0 when served from the cache) and ``cached``."""

    sha256: str
    git_sha1: str | None
    size: int
    bytes_read: int = 0
    cached: bool = False


def _key(st: os.stat_result) -> tuple[int, int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def pid_alive(pid: int) -> bool:
    """True while a process ``pid`` exists (``kill(pid, 0)``; one of another user counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class DigestCache:
    """Digests of files already hashed, one small JSON file per key under ``folder``, each written
    atomically (temp file + ``os.replace``); concurrent processes can share it. A missing, corrupt or
    unwritable cache is a miss, never an error."""

    def __init__(self, folder: Path | str) -> None:
        self.folder = Path(folder)

    @classmethod
    def under(cls, settings: Settings) -> DigestCache:
        """The cache of ``settings``' home: ``<MODELYARD_HOME>/.cache/digests``; temp files that a
        killed writer left there are removed."""
        cache = cls(settings.cache_dir() / "digests")
        cache.sweep()
        return cache

    def sweep(self) -> None:
        """Remove ``.tmp-<pid>-*`` files whose writer process no longer exists."""
        try:
            for tmp in self.folder.glob(".tmp-*"):
                pid = tmp.name.split("-")[1]
                if pid.isdigit() and not pid_alive(int(pid)):
                    tmp.unlink(missing_ok=True)
        except OSError:
            pass

    def _path(self, key: tuple[int, ...]) -> Path:
        return self.folder / (hashlib.sha256(":".join(map(str, key)).encode()).hexdigest()[:40] + ".json")

    def get(self, st: os.stat_result, git: bool = False) -> FileDigest | None:
        key = _key(st)
        try:
            d = json.loads(self._path(key).read_bytes())
            sha, g, size = d["sha256"], d.get("git_sha1"), d["size"]
            if d["key"] != list(key) or size != st.st_size or not _HEX64.fullmatch(sha):
                return None
            if g is not None and not _HEX40.fullmatch(g):
                return None
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if git and g is None:
            return None
        return FileDigest(sha, g if git else None, size, 0, True)

    def put(self, st: os.stat_result, digest: FileDigest) -> None:
        key = _key(st)
        data = json.dumps({"key": list(key), "sha256": digest.sha256, "git_sha1": digest.git_sha1,
                           "size": digest.size}).encode()
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=f".tmp-{os.getpid()}-", suffix=".json")
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(data)
                os.replace(tmp, self._path(key))
            except BaseException:
                os.unlink(tmp)
                raise
        except OSError:
            pass  # a cache that cannot be written only costs a re-hash next time


def file_digest(path: Path | str, *, git: bool = False, cache: DigestCache | None = None,
                advance: Callable[[int], None] | None = None, copy_to: Path | None = None) -> FileDigest:
    """SHA256 of ``path`` (and its git blob id when ``git``), reading each byte once.

    With ``cache``, an unchanged file (same dev, inode, size, mtime and ctime) is answered from the
    cache without reading it, and a freshly hashed file is remembered when it did not change while
    being read. ``advance(n)`` is called with the bytes accounted (hashed or served from the cache).
    With ``copy_to`` (a new file's path), the bytes hashed are also written there (made read-only):
    the copy is exactly what was hashed. A cache hit copies nothing. Raises :class:`StoreError` when
    the copy cannot be written (e.g. disk full), OSError when ``path`` cannot be read.
    """
    with open(path, "rb", buffering=0) as fh:
        st = os.fstat(fh.fileno())
        if cache is not None and (hit := cache.get(st, git)) is not None:
            if advance is not None:
                advance(hit.size)
            return hit
        started = time.time()
        h = hashlib.sha256()
        g = hashlib.sha1(f"blob {st.st_size}\0".encode()) if git else None
        buf = bytearray(min(CHUNK, max(st.st_size, 1)))
        view = memoryview(buf)
        n = 0
        out = _open_copy(copy_to) if copy_to is not None else None
        try:
            while k := fh.readinto(buf):
                chunk = view[:k]
                h.update(chunk)
                if g is not None:
                    g.update(chunk)
                if out is not None and copy_to is not None:
                    _write_all(out, chunk, copy_to)
                n += k
                if advance is not None:
                    advance(k)
        finally:
            if out is not None:
                os.close(out)
        if copy_to is not None:
            os.chmod(copy_to, 0o444)
        after = os.fstat(fh.fileno())
    # n != st_size only when the file changed while read: the sizes and git id then fail their checks
    digest = FileDigest(h.hexdigest(), g.hexdigest() if g is not None else None, n, n, False)
    if (cache is not None and _key(after) == _key(st) and n == st.st_size
            and max(st.st_mtime_ns, st.st_ctime_ns) < (started - RACY_S) * 1e9):
        cache.put(st, digest)
    return digest


def _open_copy(dst: Path) -> int:

    try:
        dst.parent.mkdir(parents=True, exist_ok=True)
        return os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    except OSError as exc:
        raise StoreError(f"cannot write {dst}: {exc.strerror}", fix="Free disk space under MODELYARD_HOME.") from exc


def _write_all(fd: int, data: memoryview, dst: Path) -> None:

    try:
        while data:
            data = data[os.write(fd, data):]
    except OSError as exc:
        raise StoreError(f"cannot write {dst}: {exc.strerror}", fix="Free disk space under MODELYARD_HOME.") from exc


def copy_with_digest(src: Path, dst: Path, expected_sha256: str | None = None,
                     advance: Callable[[int], None] | None = None) -> FileDigest:
    """Copy ``src`` to the new file ``dst`` (read-only), hashing the bytes copied: one read per byte.
    Raises :class:`HashMismatchError` (and removes ``dst``) when ``expected_sha256`` is given and the
    bytes differ: the file changed after it was hashed. :class:`StoreError` when ``dst`` cannot be written."""
    d = file_digest(src, copy_to=dst, advance=advance)
    if expected_sha256 and d.sha256 != expected_sha256:
        dst.unlink(missing_ok=True)
        raise HashMismatchError(f"{src} changed after it was hashed: sha256 {expected_sha256} then, {d.sha256} now",
                                fix="Do not modify the source folder during an ingest; run it again.")
    return d


class DigestWriter:
    """A write-only binary file for a download: each chunk written goes to ``fh`` and into the sha256
    (and into the git blob sha1 when ``git_size`` is given: git's object header holds the size, so it
    is the size the source promised) in the same pass, so the file is never read back to be hashed.
    ``advance(n)`` is called per chunk with its size in bytes.

    It offers what ``huggingface_hub.file_download.http_get`` asks of its ``temp_file``: ``write``,
    ``tell``, ``seek`` and ``truncate``. After a broken connection http_get resumes with a ``Range``
    request; a server that ignores it answers the whole file again, and http_get seeks back to the
    start and truncates: the digests restart there. Seeking anywhere else raises ``OSError`` (a digest
    cannot be rewound)."""

    def __init__(self, fh: BinaryIO, *, git_size: int | None = None,
                 advance: Callable[[int], None] | None = None) -> None:
        self._fh = fh
        self._git_size = git_size
        self._advance = advance
        self._restart()

    def _restart(self) -> None:
        self._sha = hashlib.sha256()
        self._git = hashlib.sha1(f"blob {self._git_size}\0".encode()) if self._git_size is not None else None
        self._n = 0

    def write(self, data: bytes) -> int:
        self._fh.write(data)
        return self._take(data)

    def _take(self, data: bytes) -> int:
        self._sha.update(data)
        if self._git is not None:
            self._git.update(data)
        self._n += len(data)
        if self._advance is not None:
            self._advance(len(data))
        return len(data)

    def tell(self) -> int:
        return self._n

    def seek(self, pos: int, whence: int = 0) -> int:
        if (pos, whence) != (0, 0):
            raise OSError(f"a digest stream can only go back to its start, not to byte {pos} (whence {whence})")
        self._fh.seek(0)
        self._restart()
        return 0

    def truncate(self, size: int | None = None) -> int:
        if size not in (None, self._n):
            raise OSError(f"a digest stream cannot be truncated to {size} bytes (it holds {self._n})")
        return self._fh.truncate()

    def absorb(self, chunk_bytes: int = 8 << 20) -> int:
        """Take the bytes ``fh`` already holds (a partial download being resumed, opened ``r+b`` at offset 0)
        into the digests, reading them once, and leave ``fh`` at its end, where the next :meth:`write` appends.
        ``advance`` is called for them too. Returns how many bytes were taken (the ``Range`` to resume from)."""
        while True:
            data = self._fh.read(chunk_bytes)
            if not data:
                return self._n
            self._take(data)

    def digest(self) -> FileDigest:
        """The digests of every byte written since the (last) start; ``bytes_read`` is 0."""
        return FileDigest(self._sha.hexdigest(), self._git.hexdigest() if self._git is not None else None, self._n)


def differences(entry: FileEntry, digest: FileDigest) -> list[str]:
    """How ``digest`` (bytes on disk or received) differs from what the source promised for ``entry``:
    ``"<path>: expected <n> bytes, got <m>"``, ``"<path>: expected sha256 <hex>, got <hex>"``,
    ``"<path>: expected git blob <hex>, got <hex>"``; empty when it matches (or nothing was promised)."""
    out = []
    if entry.expected_size is not None and digest.size != entry.expected_size:
        out.append(f"{entry.path}: expected {entry.expected_size} bytes, got {digest.size}")
    if entry.expected_sha256 and digest.sha256 != entry.expected_sha256:
        out.append(f"{entry.path}: expected sha256 {entry.expected_sha256}, got {digest.sha256}")
    if entry.expected_git_oid and digest.git_sha1 != entry.expected_git_oid:
        out.append(f"{entry.path}: expected git blob {entry.expected_git_oid}, got {digest.git_sha1}")
    return out


def mismatch_error(source: str, problems: list[str], fix: str | None = None) -> HashMismatchError:
    """The :class:`HashMismatchError` (exit 1) for ``problems`` (:func:`differences` lines) of ``source``."""
    return HashMismatchError(
        f"{len(problems)} file(s) differ from what {source} promised: " + "; ".join(problems),
        fix=fix or "The download or cache is corrupt: delete the file from the cache (<home>/.cache/hf) and ingest again.")


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 2


def sha256_file(path: Path, label: str | None = None) -> str:
    """SHA256 (hex) of ``path``, with a progress bar named ``label`` (bytes)."""
    with progress.task(label or f"hashing {path.name}", total=path.stat().st_size) as adv:
        return file_digest(path, advance=adv).sha256


def git_blob_id(data: bytes) -> str:
    """Git's blob object id of ``data`` (what the hub reports as ``blob_id`` for non-LFS files)."""
    return hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest()


def hash_snapshot(snapshot: Snapshot, workers: int | None = None, cache: DigestCache | None = None) -> Snapshot:
    """Return ``snapshot`` with every ``FileEntry.sha256`` filled and checked.

    ``cache`` (e.g. ``DigestCache.under(settings)``) skips files already hashed and unchanged since.
    ``workers`` defaults to two threads per usable CPU (at most 32, at most one per file): hashing a
    warm file is CPU-bound, a cold one waits on the disk.
    A file whose entry says ``received`` (hashed while it was downloaded, see :class:`DigestWriter`)
    is not read again. Raises :class:`HashMismatchError` listing every file whose size, LFS sha256 or
    git blob id differs from the source's promise (file, expected, actual).
    """
    return hash_snapshot_counted(snapshot, workers, cache)[0]


def hash_snapshot_counted(snapshot: Snapshot, workers: int | None = None, cache: DigestCache | None = None,
                          copy_to: Path | None = None, link_from: tuple[Path, ...] = ()) -> tuple[Snapshot, int]:
    """:func:`hash_snapshot`, also returning the bytes read (0 when the digest cache answered for every file).

    With ``copy_to`` (a folder), each file that is read and does not lie under one of ``link_from``
    (the caches that packaging hard-links from) is copied to ``copy_to/<path>`` while it is hashed, so
    that packaging (:func:`modelyard.artifact.draft.stage_model` with ``precopied``) moves the copy
    instead of reading the file a second time (bytes read per byte of model <= 1.05).
    """
    workers = workers or min(32, 2 * usable_cpus(), max(1, len(snapshot.files)))
    entries = snapshot.files
    problems: list[str] = []
    roots = tuple(r.resolve() for r in link_from)

    def copy_path(e: FileEntry) -> Path | None:
        if copy_to is None or any((snapshot.root / e.path).resolve().is_relative_to(r) for r in roots):
            return None
        return copy_to / e.path

    # received files were hashed (and compared) as they were downloaded: no byte of them is read here
    todo = [i for i in range(len(entries)) if not (entries[i].received and entries[i].sha256)]
    order = sorted(todo, key=lambda i: -entries[i].size)  # largest first: shortest makespan
    with progress.task("hashing (sha256)", total=sum(entries[i].size for i in todo)) as adv:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            futs = {i: pool.submit(file_digest, snapshot.root / entries[i].path,
                                   git=entries[i].expected_git_oid is not None, cache=cache, advance=adv,
                                   copy_to=copy_path(entries[i]))
                    for i in order}
            digests = {i: f.result() for i, f in futs.items()}
    out: list[FileEntry] = []
    for i, e in enumerate(entries):
        d = digests.get(i)
        if d is None:  # received: sha256 and size were compared with the promise when the bytes arrived
            out.append(e)
            continue
        problems += differences(e, d)
        out.append(replace(e, sha256=d.sha256, size=d.size))
    if problems:
        raise mismatch_error(snapshot.source, problems)
    return replace(snapshot, files=tuple(out)), sum(d.bytes_read for d in digests.values())


def tree_digest(files: tuple[FileEntry, ...]) -> str:
    """SHA256 over sorted ``path\\0size\\0sha256\\n`` lines: the content identity of a set of files."""
    h = hashlib.sha256()
    for f in sorted(files, key=lambda f: f.path):
        h.update(f"{f.path}\0{f.size}\0{f.sha256}\n".encode())
    return h.hexdigest()
