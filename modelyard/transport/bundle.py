"""bundle: an artifact as one deterministic ``.tar.zst``, for sites without a network.

The format (version 1), which :mod:`modelyard.transport.unbundle` reads back:

- **tar, PAX format** (``tarfile.PAX_FORMAT``: plain ustar headers, plus a PAX record only for a
  path longer than 100 bytes or a file over 8 GiB). Every member has ``mtime`` 0, uid/gid 0, empty
  uname/gname, mode 0644 (files) or 0755 (directories). No links, devices or FIFOs, ever.
- **members in this order**: ``manifest.json`` (the artifact's manifest, byte for byte), then
  ``bundle.json`` (below), then every directory and file of the artifact sorted by path.
- **``bundle.json``**, compact JSON with sorted keys: ``format`` ("modelyard-bundle"), ``version``
  (1), ``manifest_sha256``, ``files`` (path, size, sha256 of every file that ``manifest.json`` does
  not list: report.json, report.md, serve/..., patches.json, ...), and ``total_bytes`` (the bytes of
  every file member after ``bundle.json``). With the manifest's per-file entries for ``model/``,
  every extracted byte has a SHA256 to match.
- **zstd**: one frame, multithreaded (the output of zstd's multithreaded mode does not depend on
  the number of threads), with a content checksum, so a flipped byte anywhere in the stream
  (tar headers and padding included) fails.

The bundle is written to ``.<name>.<random>.partial`` beside the output (locked while it is written) and renamed at
the end; the next bundle of the same output removes the unlocked ones a killed run left; each
file is read once, streamed through tarfile headers into the zstd writer, and its SHA256 computed on
the way and compared with the manifest (a changed file fails the bundle instead of shipping it).
"""

from __future__ import annotations

import hashlib
import os
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Final

import zstandard

from modelyard import progress
from modelyard.artifact.index import dump_index, index_folder
from modelyard.artifact.layout import MANIFEST
from modelyard.artifact.manifest import Manifest
from modelyard.errors import BundleError, StoreError
from modelyard.paths import open_partial, require_space, sweep_partials

TAR_FORMAT: Final = tarfile.PAX_FORMAT
BLOCK = tarfile.BLOCKSIZE  # 512
RECORD = tarfile.RECORDSIZE  # 20 blocks: the archive is padded to a multiple of this
CHUNK = 4 * 1024 * 1024  # bytes per read
DEFAULT_LEVEL = 3


@dataclass(frozen=True)
class BundleResult:
    path: Path
    bytes_in: int  # bytes of every file member (manifest.json and bundle.json included)
    bytes_out: int  # size of the .tar.zst
    files: int
    content_digest: str


def header(name: str, size: int = 0, *, is_dir: bool = False) -> bytes:
    """The tar header block(s) of one member, with the fixed metadata of the format."""
    ti = tarfile.TarInfo(name)
    ti.type = tarfile.DIRTYPE if is_dir else tarfile.REGTYPE
    ti.size = 0 if is_dir else size
    ti.mode = 0o755 if is_dir else 0o644
    ti.mtime = 0
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    return ti.tobuf(TAR_FORMAT, "utf-8", "strict")


def _pad(n: int) -> bytes:
    return b"\0" * (-n % BLOCK)


def write_bundle(root: Path, out: Path, *, level: int = DEFAULT_LEVEL, threads: int = -1,
                 force: bool = False) -> BundleResult:
    """Write the artifact folder ``root`` as the bundle ``out``
    (:func:`modelyard.transport.refs.bundle_artifact` takes a store reference too).

    ``threads``: zstd workers (-1: one per CPU; always multithreaded mode, so that the output does
    not depend on the machine). ``out`` must not exist unless ``force`` (then it is replaced, by
    rename, only once the new bundle is complete). Raises :class:`BundleError` when ``out`` exists
    (without ``force``) or the folder does not match its manifest (a file changed, added or missing),
    :class:`StoreError` when writing fails."""
    out = Path(out).expanduser().absolute()
    if not force and (out.exists() or out.is_symlink()):
        raise BundleError(f"{out} already exists", fix="Pass --force to replace it, or write to another -o/--output.")
    manifest_bytes = (root / MANIFEST).read_bytes()
    meta, dirs, expect = index_folder(root, manifest_bytes)
    meta_bytes = dump_index(meta)
    members = sorted([(d, True) for d in dirs] + [(f, False) for f in expect])

    sweep_partials(out.parent, out.name)  # what a killed bundle of the same output left, before space is counted
    # zstd may not shrink weights at all: the bundle can be as large as the files (plus tar headers)
    require_space([(out.parent, meta["total_bytes"] + 1024 * (len(members) + 3), "the bundle")],
                  elsewhere="pass another -o/--output")
    tmp = None
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp, fh = open_partial(out.parent, out.name)
        with fh:
            cctx = zstandard.ZstdCompressor(level=level, threads=max(threads, 1) if threads != -1 else -1,
                                            write_checksum=True)
            with cctx.stream_writer(fh, closefd=False) as zw, \
                    progress.task(f"bundling {root.name}", total=meta["total_bytes"]) as adv:
                n = _write_member(zw, MANIFEST, manifest_bytes)
                n += _write_member(zw, "bundle.json", meta_bytes)
                buf = bytearray(CHUNK)
                for rel, is_dir in members:
                    if is_dir:
                        n += _write_member(zw, rel, b"", is_dir=True)
                    else:
                        size, sha = expect[rel]
                        n += _stream_file(zw, root, rel, size, sha, buf, adv)
                zw.write(b"\0" * (2 * BLOCK))  # end of archive
                n += 2 * BLOCK
                zw.write(b"\0" * (-n % RECORD))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, out)
    except OSError as exc:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        raise StoreError(f"cannot write the bundle {out}: {exc.strerror or exc}",
                         fix="Check the output folder's permissions and free space.") from exc
    except BaseException:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        raise
    return BundleResult(out, len(manifest_bytes) + len(meta_bytes) + meta["total_bytes"], out.stat().st_size,
                        len(expect) + 2, Manifest.from_bytes(manifest_bytes).content_digest)


def _write_member(zw: BinaryIO, name: str, data: bytes, *, is_dir: bool = False) -> int:
    hdr = header(name, len(data), is_dir=is_dir)
    pad = _pad(len(data))
    zw.write(hdr + data + pad)
    return len(hdr) + len(data) + len(pad)


def _stream_file(zw: BinaryIO, root: Path, rel: str, size: int, sha: str, buf: bytearray, adv) -> int:  # noqa: ANN001
    """Header, then the file in 4 MiB reads, each hashed and compressed once; then padding."""
    hdr = header(rel, size)
    zw.write(hdr)
    h = hashlib.sha256()
    mv = memoryview(buf)
    left = size
    with open(root / rel, "rb", buffering=0) as fh:
        while left:
            k = fh.readinto(mv[:min(CHUNK, left)])
            if not k:
                break
            zw.write(mv[:k])
            h.update(mv[:k])
            left -= k
            adv(k)
        grew = bool(fh.read(1))
    if left or grew:
        raise BundleError(f"{root / rel} changed size while bundling (expected {size} bytes)",
                          fix="Do not modify the artifact while bundling it; bundle again.")
    if h.hexdigest() != sha:
        raise BundleError(f"{root / rel}: sha256 {h.hexdigest()} differs from {sha}, the digest the artifact records",
                          fix=f"The artifact is corrupt: run `modelyard verify {root}` and re-ingest the model.")
    pad = _pad(size)
    zw.write(pad)
    return len(hdr) + size + len(pad)
