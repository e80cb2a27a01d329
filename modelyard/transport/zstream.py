"""The zstd side of reading a bundle: a frame walk that refuses a truncated or foreign file before any
decompression (:func:`check_frames`), and the decompressed tar as a forward-only stream with a byte limit
(:class:`ZstdTarStream`), so that a decompression bomb is refused by its own size."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import BinaryIO

import zstandard

from modelyard.errors import BundleError

#: the largest zstd window a bundle may ask for (bytes): 128 MiB; zstd's own default limit for a decoder
MAX_WINDOW = 1 << 27
_ZSTD_MAGIC = 0xFD2FB528
#: the fix every "damaged bundle" error gives
FIX_CORRUPT = "The bundle is damaged: copy it again and compare its sha256 with the sender's."
_FIX_CORRUPT = FIX_CORRUPT


def check_frames(path: Path) -> int:
    """Walk the zstd frames of ``path`` (headers and block headers only); returns the file size.
    Refuses a truncated file, trailing bytes, skippable frames and frames without a checksum."""
    size = path.stat().st_size
    pos = 0
    with open(path, "rb") as fh:
        def read(n: int, what: str) -> bytes:
            b = fh.read(n)
            if len(b) != n:
                raise BundleError(f"{path.name} is truncated: it ends inside a zstd {what} at byte {fh.tell()} of {size}",
                                  fix=_FIX_CORRUPT)
            return b

        while pos < size:
            fh.seek(pos)
            magic = int.from_bytes(read(4, "frame header"), "little")
            if magic != _ZSTD_MAGIC:
                raise BundleError(f"{path.name}: no zstd frame at byte {pos} (magic {magic:#010x}); "
                                  + ("the file is not zstd-compressed" if pos == 0 else "trailing bytes after the last frame"),
                                  fix="Pass a .tar.zst made by `modelyard bundle`. " + _FIX_CORRUPT)
            fhd = read(1, "frame header")[0]
            if fhd & 0x08:
                raise BundleError(f"{path.name}: zstd frame at byte {pos} has a reserved bit set", fix=_FIX_CORRUPT)
            if not fhd & 0x04:
                raise BundleError(f"{path.name}: zstd frame at byte {pos} has no content checksum",
                                  fix="Make the bundle with `modelyard bundle` (it writes checksums).")
            single = bool(fhd & 0x20)
            fcs = {0: 1 if single else 0, 1: 2, 2: 4, 3: 8}[fhd >> 6]
            hdr_len = (0 if single else 1) + (0, 1, 2, 4)[fhd & 3] + fcs
            read(hdr_len, "frame header")
            while True:
                bh = int.from_bytes(read(3, "block header"), "little")
                btype, bsize = (bh >> 1) & 3, bh >> 3
                if btype == 3:
                    raise BundleError(f"{path.name}: invalid zstd block at byte {fh.tell() - 3}", fix=_FIX_CORRUPT)
                skip = 1 if btype == 1 else bsize
                if fh.tell() + skip > size:
                    raise BundleError(f"{path.name} is truncated: a zstd block at byte {fh.tell() - 3} runs past "
                                      f"the end ({size} bytes)", fix=_FIX_CORRUPT)
                fh.seek(skip, os.SEEK_CUR)
                if bh & 1:
                    break
            read(4, "checksum")
            pos = fh.tell()
    return size


class ZstdTarStream(io.RawIOBase):
    """The decompressed tar: counts bytes, enforces the limit, turns zstd errors into BundleError.

    Also the file object tarfile reads headers from: ``read(n)`` returns ``n`` bytes unless the stream
    ends, ``tell()`` is the position in the tar and ``seek`` moves forward only (by reading)."""

    def __init__(self, raw: BinaryIO, name: str, compressed: int, limit: int) -> None:

        self._zerr = zstandard.ZstdError
        self._raw = raw
        self._z = zstandard.ZstdDecompressor(max_window_size=MAX_WINDOW).stream_reader(raw, read_size=1 << 20)
        self.name, self.compressed, self.limit = name, compressed, limit
        self.pos = 0
        self.member = "the first tar header"
        self.declared: int | None = None

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def tell(self) -> int:
        return self.pos

    def readinto(self, b) -> int:  # noqa: ANN001
        try:
            n = self._z.readinto(b)
        except self._zerr as exc:
            raise BundleError(f"{self.name}: the compressed stream is corrupt ({exc}); detected at compressed "
                              f"byte {self._raw.tell()} of {self.compressed}, {self.pos} bytes into the tar, reading "
                              f"{self.member}", fix=_FIX_CORRUPT) from exc
        self.pos += n
        if self.pos > self.limit:
            declared = f"declared {self.declared} bytes" if self.declared is not None else "declared sizes not read yet"
            raise BundleError(f"{self.name}: decompresses to more than {self.limit} bytes ({declared}, "
                              f"{self.compressed} compressed bytes, in {self.member}); refused as a decompression bomb",
                              fix="Do not use this file; ask the sender for a bundle made by `modelyard bundle`.")
        return n

    def fill(self, mv: memoryview) -> int:
        """Decompress into all of ``mv`` (fewer bytes only at the end of the stream); returns the count."""
        got = 0
        while got < len(mv):
            n = self.readinto(mv[got:])
            if not n:
                break
            got += n
        return got

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            return self.readall()
        buf = bytearray(size)
        return bytes(buf[:self.fill(memoryview(buf))])

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        target = offset if whence == os.SEEK_SET else self.pos + offset if whence == os.SEEK_CUR else -1
        if target < self.pos:
            raise io.UnsupportedOperation("the decompressed tar can only be read forward")
        self.skip(target - self.pos)
        return self.pos

    def skip(self, n: int) -> None:
        """Read and drop ``n`` bytes (tar padding); raises BundleError when the stream ends first."""
        buf = bytearray(min(n, 1 << 16))
        while n:
            k = self.fill(memoryview(buf)[:min(n, len(buf))])
            if not k:
                raise BundleError(f"{self.name} is truncated in {self.member}", fix=_FIX_CORRUPT)
            n -= k
