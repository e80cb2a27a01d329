"""unbundle: read a bundle (:mod:`modelyard.transport.bundle`) back, checking every byte.

The reader trusts nothing in the archive. Before decompressing, it walks the zstd frame headers:
a truncated file, trailing bytes or a frame without a content checksum are refused. While
streaming, it refuses:

- a first member that is not ``manifest.json``, a second that is not ``bundle.json`` (canonical
  bytes, the manifest's sha256), or either over 16 MiB;
- names that are empty, absolute, contain ``..``/``.``/empty components, backslashes or NUL;
- links (symbolic or hard), devices, FIFOs, sparse files: any member not a regular file or a directory;
- duplicate names, files that neither ``manifest.json`` nor ``bundle.json`` lists, directories
  that hold no listed file, sizes that differ from the listing (before reading the data), and at the
  end, listed files missing from the bundle;
- a SHA256 that differs (computed while writing: each byte is read and hashed once);
- a **decompression bomb**: the bundle's declared bytes (manifest.json + bundle.json + their
  files) may be at most ``max_ratio`` times the compressed file (checked before any file is
  written; bundles under 64 MiB of content are exempt), and the decompressed stream may not exceed
  the declared bytes plus the tar headers' allowance (checked while reading).

Each refusal is a :class:`~modelyard.errors.BundleError` naming the member, the problem and a fix.
Output goes through a *sink* (a folder for :func:`unbundle`, a Hugging Face cache for
:mod:`modelyard.transport.hfcache`) that writes into a temp folder the caller removes on failure.
Memory is bounded: four 4 MiB buffers, a 128 MiB zstd window at most, extended tar headers ≤ 1 MiB.

Speed: tarfile parses the headers only; each member's bytes are decompressed straight into one of
four reused buffers, and two threads hash (sha256, and the git blob id when the sink asks) and write
them while the next buffer is decompressed. zstd's decompression, hashlib on buffers over 2 KiB and
file writes release the GIL, so the three steps overlap on separate cores (benchmarks/bundle.py).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import queue
import re
import shutil
import tarfile
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from modelyard import progress
from modelyard.artifact.index import FORMAT, VERSION, dump_index
from modelyard.artifact.layout import MANIFEST
from modelyard.artifact.manifest import Manifest
from modelyard.errors import BundleError, BundleHashMismatchError, ManifestError, ModelyardError, StoreError
from modelyard.model.digest import tree_digest
from modelyard.model.snapshot import FileEntry
from modelyard.paths import require_space, write_sliced
from modelyard.transport.bundle import BLOCK, CHUNK, RECORD
from modelyard.transport.signing import verify_after_unbundle
from modelyard.transport.zstream import FIX_CORRUPT as _FIX_CORRUPT
from modelyard.transport.zstream import ZstdTarStream, check_frames

DEFAULT_MAX_RATIO = 100.0  # declared bytes / compressed bytes; real checkpoints compress < 2x
RATIO_FLOOR = 64 * 1024 * 1024  # bundles declaring less than this are not ratio-checked
META_LIMIT = 16 * 1024 * 1024  # manifest.json and bundle.json, each
EXT_HEADER_LIMIT = 1024 * 1024  # a PAX or GNU long-name header
_SHA_RE = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class Expected:
    size: int
    sha256: str
    origin: str | None = None  # the manifest's origin for model/ files (hub-lfs, hub-git, ...)


@dataclass(frozen=True)
class BundleContents:
    """What a bundle declares: its manifest (bytes and parsed), ``bundle.json`` and the expected files."""

    manifest_bytes: bytes
    manifest: Manifest
    meta: dict[str, Any]
    files: dict[str, Expected]

    @property
    def declared_bytes(self) -> int:
        return len(self.manifest_bytes) + len(dump_index(self.meta)) + sum(e.size for e in self.files.values())


class MemberFile(Protocol):
    """What :meth:`Sink.open` returns: a binary file that the member's bytes are written to, then closed."""

    def write(self, data: bytes | memoryview, /) -> int: ...

    def close(self) -> None: ...


class Sink:
    """Where verified members go. ``open`` returns a writable file; ``commit`` is called after the
    member's size and SHA256 matched. The default writes nothing (hash-only)."""

    def start(self, contents: BundleContents) -> None:
        pass

    def put(self, rel: str, data: bytes) -> None:
        """A verified member read whole (``manifest.json``)."""

    def wants_git(self, rel: str) -> bool:
        return False

    def mkdir(self, rel: str) -> None:
        pass

    def open(self, rel: str) -> MemberFile:
        return Discard()

    def commit(self, rel: str, fh: MemberFile, sha256: str, git_sha1: str | None) -> None:
        fh.close()


class Discard(io.RawIOBase):
    def writable(self) -> bool:
        return True

    def write(self, b) -> int:  # noqa: ANN001
        return len(b)


class FolderSink(Sink):
    """Writes the artifact's files under ``root`` (model/ files read-only, as in the store); ``dest``: the
    folder the user asked for, which ``root`` (a temp folder beside it, on its filesystem) becomes."""

    def __init__(self, root: Path, dest: Path | None = None) -> None:
        self.root = root
        self.dest = dest or root

    def start(self, contents: BundleContents) -> None:
        """Refuse (exit 2, :class:`InsufficientResourcesError`, naming ``dest``) before the first member byte a
        bundle whose files the filesystem of ``dest`` (new, so its parent's: ``root``'s) cannot hold."""
        require_space([(self.dest, contents.declared_bytes, "the unbundled artifact")],
                      elsewhere="pass another -o/--output")

    def mkdir(self, rel: str) -> None:
        (self.root / rel).mkdir(parents=True, exist_ok=True)

    def put(self, rel: str, data: bytes) -> None:
        with open(self.root / rel, "xb") as fh:
            fh.write(data)

    def open(self, rel: str) -> MemberFile:
        dst = self.root / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        return open(dst, "xb")  # noqa: SIM115 - closed in commit() or by the caller's cleanup

    def commit(self, rel: str, fh: MemberFile, sha256: str, git_sha1: str | None) -> None:
        fh.close()
        os.chmod(self.root / rel, 0o444 if rel.startswith("model/") else 0o644)


def name_problem(name: str) -> str | None:
    """Why ``name`` is not a safe relative member path, or None."""
    if not name:
        return "an empty name"
    if "\0" in name or "\\" in name:
        return "a NUL or backslash in the name"
    if name.startswith("/"):
        return "an absolute path"
    parts = name.split("/")
    if ".." in parts:
        return "a path that climbs out of the target ('..')"
    if any(p in ("", ".") for p in parts):
        return "an empty or '.' path component"
    if len(name.encode()) > 4096:
        return "a name over 4096 bytes"
    return None


class _SafeTarInfo(tarfile.TarInfo):
    """Refuses sparse members and oversized extended headers before tarfile reads them into memory."""

    def _proc_member(self, tf):  # noqa: ANN001, ANN202
        if self.type == tarfile.GNUTYPE_SPARSE:
            raise BundleError(f"bundle member {self.name!r} is a sparse file", fix="Bundles hold regular files only.")
        ext = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE, tarfile.XGLTYPE,
               tarfile.SOLARIS_XHDTYPE)
        if self.type in ext and self.size > EXT_HEADER_LIMIT:
            raise BundleError(f"bundle member {self.name!r}: an extended tar header of {self.size} bytes (limit "
                              f"{EXT_HEADER_LIMIT})", fix="Do not use this file; it is not a modelyard bundle.")
        return super()._proc_member(tf)


_TYPES = {tarfile.SYMTYPE: "a symbolic link", tarfile.LNKTYPE: "a hard link", tarfile.CHRTYPE: "a character device",
          tarfile.BLKTYPE: "a block device", tarfile.FIFOTYPE: "a FIFO", tarfile.CONTTYPE: "a contiguous file"}


def _kind(ti: tarfile.TarInfo) -> str | None:
    if ti.type in (tarfile.REGTYPE, tarfile.AREGTYPE) and ti.sparse is None:
        return "file"
    if ti.type == tarfile.DIRTYPE:
        return "dir"
    return None


def _open_tar(stream: ZstdTarStream) -> tarfile.TarFile:
    """tarfile over ``stream`` for the headers only (it reads the first one now); every member's bytes
    are read from ``stream`` itself, then :func:`_align` skips the padding to the next header."""
    return tarfile.TarFile(fileobj=stream, mode="r", tarinfo=_SafeTarInfo)


def _align(stream: ZstdTarStream, tf: tarfile.TarFile) -> None:
    """Skip from the end of the member just read to the next header (tarfile's ``offset``)."""
    if tf.offset > stream.pos:
        stream.skip(tf.offset - stream.pos)


def _read_small(stream: ZstdTarStream, tf: tarfile.TarFile, ti: tarfile.TarInfo, want: str, bundle: str) -> bytes:
    if ti.name != want or _kind(ti) != "file":
        raise BundleError(f"{bundle}: member {ti.name!r} comes where {want} must be",
                          fix="Pass a bundle made by `modelyard bundle` (manifest.json first, then bundle.json).")
    if ti.size > META_LIMIT:
        raise BundleError(f"{bundle}: {want} is {ti.size} bytes (limit {META_LIMIT})", fix="Do not use this file.")
    data = stream.read(ti.size)
    if len(data) != ti.size:
        raise BundleError(f"{bundle} is truncated inside {want}", fix=_FIX_CORRUPT)
    _align(stream, tf)
    return data


def parse_contents(bundle: str, manifest_bytes: bytes, meta_bytes: bytes) -> BundleContents:
    bad = BundleError(f"{bundle}: manifest.json is not a modelyard manifest (files[] of path, size, sha256)",
                      fix="Pass a bundle made by `modelyard bundle`. " + _FIX_CORRUPT)
    try:
        parsed = Manifest.from_bytes(manifest_bytes, f"{bundle}: manifest.json")
    except ManifestError as exc:
        raise BundleError(exc.message, fix="Pass a bundle made by `modelyard bundle`. " + _FIX_CORRUPT) from exc
    if "files" not in parsed.present:
        raise bad
    try:
        meta = json.loads(meta_bytes)
    except ValueError as exc:
        raise BundleError(f"{bundle}: bundle.json is not valid JSON", fix=_FIX_CORRUPT) from exc
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise BundleError(f"{bundle}: bundle.json is not a {FORMAT} version {VERSION} index",
                          fix="Use the modelyard version that made the bundle, or re-bundle with this one.")
    if dump_index(meta) != meta_bytes:
        raise BundleError(f"{bundle}: bundle.json is not in canonical form (it was edited or is damaged)",
                          fix=_FIX_CORRUPT)
    if meta.get("manifest_sha256") != hashlib.sha256(manifest_bytes).hexdigest():
        raise BundleError(f"{bundle}: manifest.json's sha256 differs from the one bundle.json records",
                          fix=_FIX_CORRUPT)
    files: dict[str, Expected] = {}
    try:
        listed = [(f.path, f.size, f.sha256, f.origin) for f in parsed.files]
        listed += [(f["path"], f["size"], f["sha256"], None) for f in meta["files"]]
        for path, size, sha, origin in listed:
            if not isinstance(path, str) or not isinstance(size, int) or size < 0 or not _SHA_RE.match(str(sha)):
                raise bad
            problem = name_problem(path)
            if problem or path in (MANIFEST, "bundle.json"):
                raise BundleError(f"{bundle}: the listing names {path!r}: {problem or 'a reserved name'}",
                                  fix="Do not use this file; it is not a safe bundle.")
            if path in files:
                raise BundleError(f"{bundle}: {path!r} is listed twice", fix=_FIX_CORRUPT)
            files[path] = Expected(size, sha, origin)
        model = tuple(FileEntry(path=p, size=s, sha256=h) for p, s, h, _ in listed if p.startswith("model/"))
        model = tuple(FileEntry(path=f.path[len("model/"):], size=f.size, sha256=f.sha256) for f in model)
        digest = parsed.content_digest
        total = meta["total_bytes"]
    except (KeyError, TypeError, AttributeError) as exc:
        raise bad from exc
    if digest != "sha256:" + tree_digest(model):
        raise BundleError(f"{bundle}: manifest.json's content_digest does not match its own file list",
                          fix="The manifest was edited; ask the sender for a fresh bundle.")
    if total != sum(e.size for e in files.values()):
        raise BundleError(f"{bundle}: bundle.json's total_bytes ({total}) is not the sum of the listed sizes",
                          fix=_FIX_CORRUPT)
    return BundleContents(manifest_bytes, parsed, meta, files)


def read_bundle(bundle: Path, sink: Sink, *, max_ratio: float = DEFAULT_MAX_RATIO) -> BundleContents:
    """Stream ``bundle`` into ``sink``, verifying everything (see the module doc). Returns what it declares."""
    bundle = Path(bundle)
    if not bundle.is_file():
        raise BundleError(f"bundle {bundle} does not exist (or is not a file)", fix="Check the path.")
    name = bundle.name
    compressed = check_frames(bundle)
    with open(bundle, "rb") as raw:
        stream = ZstdTarStream(raw, name, compressed, limit=2 * META_LIMIT + 8 * BLOCK)
        try:
            return _read(stream, name, compressed, sink, max_ratio)
        except (tarfile.TarError, EOFError) as exc:
            raise BundleError(f"{name}: not a valid tar near byte {stream.pos} (in {stream.member}): {exc}",
                              fix=_FIX_CORRUPT) from exc


def _read(stream: ZstdTarStream, name: str, compressed: int, sink: Sink, max_ratio: float) -> BundleContents:
    tf = _open_tar(stream)
    first = tf.next()
    if first is None:
        raise BundleError(f"{name} holds no members", fix=_FIX_CORRUPT)
    stream.member = MANIFEST
    manifest_bytes = _read_small(stream, tf, first, MANIFEST, name)
    stream.member = "the header after manifest.json"
    second = tf.next()
    if second is None:
        raise BundleError(f"{name} ends after manifest.json (no bundle.json)", fix=_FIX_CORRUPT)
    stream.member = "bundle.json"
    contents = parse_contents(name, manifest_bytes, _read_small(stream, tf, second, "bundle.json", name))
    declared = contents.declared_bytes
    if declared > RATIO_FLOOR and declared > max_ratio * compressed:
        raise BundleError(f"{name} declares {declared} bytes in {compressed} compressed bytes (ratio "
                          f"{declared / compressed:.0f}, limit {max_ratio:g}); refused as a decompression bomb",
                          fix="Do not use this file; if it is genuine (e.g. mostly zeros), pass a larger --max-ratio.")
    expected = contents.files
    dirs = {"/".join(p.split("/")[:i]) for p in expected for i in range(1, p.count("/") + 1)}
    stream.limit = declared + (len(expected) + len(dirs) + 4) * 4 * BLOCK + 2 * sum(map(len, expected)) + 2 * RECORD
    stream.declared = declared
    sink.start(contents)
    sink.put(MANIFEST, manifest_bytes)
    seen: set[str] = set()
    last = "bundle.json"
    with progress.task(f"unbundling {name}", total=declared) as adv, _Pipeline() as pipe:
        while True:
            stream.member = f"the tar header after {last!r}"
            ti = tf.next()
            if ti is None:
                break
            stream.member = repr(ti.name)
            kind = _kind(ti)
            problem = name_problem(ti.name) or (None if kind else _TYPES.get(ti.type, f"a member of tar type {ti.type!r}"))
            problem = problem or ("a duplicate name" if ti.name in seen | {MANIFEST, "bundle.json"} else None)
            if problem is None and kind == "dir" and ti.name not in dirs:
                problem = "a directory that holds no listed file"
            if problem is None and kind == "file" and ti.name not in expected:
                problem = "a file that neither manifest.json nor bundle.json lists"
            if problem is None and kind == "file" and ti.size != expected[ti.name].size:
                raise BundleHashMismatchError(f"{name}: member {ti.name!r} is {ti.size} bytes in the tar header, "
                                              f"{expected[ti.name].size} in the listing; nothing was extracted", fix=_FIX_CORRUPT)
            if problem:
                raise BundleError(f"{name}: member {ti.name!r} is {problem}; nothing was extracted",
                                  fix="Do not use this bundle; make it again with `modelyard bundle` from the artifact.")
            seen.add(ti.name)
            last = ti.name
            if kind == "dir":
                sink.mkdir(ti.name)
                continue
            _copy_member(stream, ti, expected[ti.name], sink, pipe, name, adv)
            _align(stream, tf)
        missing = sorted(set(expected) - seen)
        if missing:
            raise BundleError(f"{name}: {len(missing)} listed file(s) missing from the bundle: {', '.join(missing[:5])}",
                              fix="The bundle is incomplete: make it again with `modelyard bundle`.")
        stream.member = "the padding after the last member"
        buf = bytearray(1 << 16)
        while n := stream.readinto(buf):  # the rest of the tar, to the zstd checksum
            if any(memoryview(buf)[:n]):
                raise BundleError(f"{name}: non-zero bytes after the end of the tar near byte {stream.pos}",
                                  fix=_FIX_CORRUPT)
    return contents


#: buffers in flight between decompression, hashing and writing (each :data:`CHUNK` bytes)
BUFFERS = 4


class _Pipeline:
    """Hash and write a member's bytes on two threads while the caller decompresses the next buffer.

    ``buffer()`` hands out one of :data:`BUFFERS` reused buffers, waiting while all are in flight;
    ``submit`` queues the first ``n`` bytes of one: the hasher thread updates the member's hashes and
    passes it to the writer thread, which writes it and hands the buffer back. ``finish()`` waits until everything
    submitted is hashed and written and raises the first error of either thread (an ``OSError`` of a full disk,
    say); ``drain()`` waits without raising. A context manager: leaving it stops both threads."""

    def __init__(self) -> None:
        self._free: queue.SimpleQueue[bytearray] = queue.SimpleQueue()
        for _ in range(BUFFERS):
            self._free.put(bytearray(CHUNK))
        self._hashq: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._writeq: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._error: BaseException | None = None
        self._threads = [threading.Thread(target=self._hasher, name="modelyard-unbundle-hash", daemon=True),
                         threading.Thread(target=self._writer, name="modelyard-unbundle-write", daemon=True)]
        for t in self._threads:
            t.start()

    def __enter__(self) -> _Pipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self._hashq.put(None)
        for t in self._threads:
            t.join()

    def buffer(self) -> bytearray:
        return self._free.get()

    def give_back(self, buf: bytearray) -> None:
        self._free.put(buf)

    def submit(self, buf: bytearray, n: int, hashes: tuple[Any, ...], dst: MemberFile) -> None:
        if self._error is not None:
            self.give_back(buf)
            self.finish()
        self._hashq.put((buf, n, hashes, dst))

    def drain(self) -> None:
        done = threading.Event()
        self._hashq.put(done)
        done.wait()

    def finish(self) -> None:
        self.drain()
        err, self._error = self._error, None
        if err is not None:
            raise err

    def _hasher(self) -> None:
        while (item := self._hashq.get()) is not None:
            if isinstance(item, tuple) and self._error is None:
                buf, n, hashes, _ = item
                try:
                    with memoryview(buf) as mv:
                        for h in hashes:
                            h.update(mv[:n])
                except BaseException as exc:  # noqa: BLE001 - handed to the caller by finish()
                    self._error = exc
            self._writeq.put(item)
        self._writeq.put(None)

    def _writer(self) -> None:
        while (item := self._writeq.get()) is not None:
            if isinstance(item, threading.Event):
                item.set()
                continue
            buf, n, _, dst = item
            if self._error is None:
                try:
                    with memoryview(buf) as mv:
                        write_sliced(dst, mv[:n])
                except BaseException as exc:  # noqa: BLE001 - handed to the caller by finish()
                    self._error = exc
            self._free.put(buf)


def _copy_member(stream: ZstdTarStream, ti: tarfile.TarInfo, exp: Expected, sink: Sink, pipe: _Pipeline, name: str,
                 adv) -> None:  # noqa: ANN001
    h = hashlib.sha256()
    g = hashlib.sha1(f"blob {exp.size}\0".encode()) if sink.wants_git(ti.name) else None
    hashes = (h,) if g is None else (h, g)
    dst = sink.open(ti.name)
    try:
        left = exp.size
        while left:
            buf = pipe.buffer()
            want = min(CHUNK, left)
            with memoryview(buf) as mv:
                k = stream.fill(mv[:want])
            if k < want:
                pipe.give_back(buf)
                raise BundleHashMismatchError(f"{name} is truncated inside {ti.name!r} ({left - k} of {exp.size} "
                                              "bytes missing)", fix=_FIX_CORRUPT)
            pipe.submit(buf, k, hashes, dst)
            left -= k
            adv(k)
        pipe.finish()
        if h.hexdigest() != exp.sha256:
            raise BundleHashMismatchError(f"{name}: {ti.name} has sha256 {h.hexdigest()}, the listing says {exp.sha256}",
                                          fix=_FIX_CORRUPT)
    except BaseException:
        pipe.drain()  # the writer thread no longer touches dst
        dst.close()
        raise
    sink.commit(ti.name, dst, h.hexdigest(), g.hexdigest() if g else None)


def read_manifest(bundle: Path) -> tuple[bytes, Manifest]:
    """The first member (``manifest.json``) of ``bundle``, bytes and parsed, without reading further.
    Its files are not checked: use it to decide where to extract, then extract with :func:`read_bundle`.
    Raises :class:`BundleError` when the bundle cannot be read or its first member is not a manifest."""
    bundle = Path(bundle)
    if not bundle.is_file():
        raise BundleError(f"bundle {bundle} does not exist (or is not a file)", fix="Check the path.")
    with open(bundle, "rb") as raw:
        stream = ZstdTarStream(raw, bundle.name, bundle.stat().st_size, limit=META_LIMIT + 8 * BLOCK)
        try:
            tf = _open_tar(stream)
            first = tf.next()
            if first is None:
                raise BundleError(f"{bundle.name} holds no members", fix=_FIX_CORRUPT)
            data = _read_small(stream, tf, first, MANIFEST, bundle.name)
            try:
                return data, Manifest.from_bytes(data, f"{bundle.name}: manifest.json")
            except ManifestError as exc:
                raise BundleError(exc.message, fix="Pass a bundle made by `modelyard bundle`. " + _FIX_CORRUPT) from exc
        except (tarfile.TarError, EOFError, ValueError) as exc:
            if isinstance(exc, BundleError):
                raise
            raise BundleError(f"{bundle.name}: cannot read manifest.json: {exc}", fix=_FIX_CORRUPT) from exc


def unbundle(bundle: Path, into: Path, *, max_ratio: float = DEFAULT_MAX_RATIO, public_key: Path | None = None,
             trust_root: Path | None = None, allow_partial: bool = False,
             check: Callable[[Path], None] | None = None) -> BundleContents:
    """Extract ``bundle`` as the artifact folder ``into`` (which must not exist), all or nothing: into a temp folder
    beside it, renamed at the end; removed on any failure. With ``public_key`` or ``trust_root``, ``model.sig`` must
    be present and verify (over the whole artifact, or over ``model/`` alone only with ``allow_partial``) before the
    rename (``signing.verify_after_unbundle``: SigningKeyError / SignatureError otherwise); then ``check(folder)``,
    when given, whose error refuses the bundle likewise."""
    into = Path(into).expanduser().absolute()
    if into.exists():
        raise BundleError(f"{into} already exists", fix="Pass -o/--output a folder that does not exist yet.")
    into.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{into.name}.unbundle-", dir=into.parent))
    try:
        contents = read_bundle(bundle, FolderSink(tmp, into), max_ratio=max_ratio)
        verify_after_unbundle(tmp, public_key=public_key, trust_root=trust_root, allow_partial=allow_partial)
        if check is not None:  # e.g. the carried verdict against the files (stages.verify.carried_verdict_holds)
            check(tmp)
        os.chmod(tmp, 0o755)
        os.rename(tmp, into)
    except OSError as exc:  # disk full, permissions, ...: a typed error, nothing left behind
        remove_tree(tmp)
        if isinstance(exc, ModelyardError):
            raise
        raise StoreError(f"cannot extract {Path(bundle).name} into {into}: {exc.strerror or exc}",
                         fix="Free disk space there (the bundle's total size is in its manifest) or pass another -o.") from exc
    except BaseException:
        remove_tree(tmp)
        raise
    return contents


def remove_tree(p: Path) -> None:
    def onerror(func, path, exc):  # noqa: ANN001, ANN202 - read-only files in a writable folder
        try:
            os.chmod(os.path.dirname(path), 0o755)
            func(path)
        except OSError:
            pass

    shutil.rmtree(p, onerror=onerror)
