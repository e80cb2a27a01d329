"""write_sliced: a big buffer goes to the kernel in slices of at most 256 KiB (views of the buffer, in order), because
4 MiB and 16 MiB write() calls wrote a fresh file at a sixth of the disk's speed on these machines
(benchmarks/README.md, "Big transfers")."""

from __future__ import annotations

import io
import os

from modelyard.paths import WRITE_SLICE, write_sliced


class Recorder(io.RawIOBase):
    def __init__(self) -> None:
        self.calls: list[int] = []
        self.data = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:  # noqa: ANN001
        self.calls.append(len(b))
        self.data += b
        return len(b)


def test_a_16_mib_part_is_written_in_256_kib_slices_in_order():
    data = os.urandom(16 * 2**20 + 1000)
    rec = Recorder()
    assert write_sliced(rec, data) == len(data)
    assert WRITE_SLICE == 256 * 1024
    assert rec.calls == [WRITE_SLICE] * 64 + [1000]
    assert bytes(rec.data) == data


def test_small_and_empty_writes_are_one_call_or_none(tmp_path):
    rec = Recorder()
    assert (write_sliced(rec, b"abc"), write_sliced(rec, b""), rec.calls) == (3, 0, [3])
    with open(tmp_path / "f", "wb") as fh:
        write_sliced(fh, memoryview(bytearray(b"x" * (WRITE_SLICE + 1))))
    assert (tmp_path / "f").read_bytes() == b"x" * (WRITE_SLICE + 1)
