"""Byte streams of the remote targets (:mod:`.oci`, :mod:`.s3`): a remote file fetched as ranged parts in
order with several in flight, a stream that skips what a resumed file already holds, and a sha256 fed on a
thread of its own, so that a pull hashes one part while it writes the next."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

CHUNK = 4 * 1024 * 1024
#: the size of one ranged GET of a big file, and how many are in flight at once (boto3's TransferConfig default
#: ``max_concurrency``); memory: at most that many parts
RANGE_PART = 16 * 1024 * 1024
RANGE_CONCURRENCY = 10


def ordered_parts(get: Callable[[int, int], bytes], start: int, size: int, part: int = RANGE_PART,
                  concurrency: int = RANGE_CONCURRENCY) -> Iterator[bytes]:
    """Bytes ``[start, size)`` of a remote file as ``get(a, b)`` returns ``[a, b)`` (a ranged GET), in parts of
    ``part`` bytes with up to ``concurrency`` fetched at once, yielded in order, so that the caller hashes and
    writes the whole file in one pass while the network is kept busy. A part shorter than asked ends the
    stream (the caller's size check names the file)."""
    starts = iter(range(start, size, part))
    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="modelyard-range") as pool:
        window: deque[Future[bytes]] = deque()
        for a in starts:
            window.append(pool.submit(get, a, min(a + part, size)))
            if len(window) >= concurrency:
                break
        while window:
            chunk = window.popleft().result()
            nxt = next(starts, None)
            if nxt is not None:
                window.append(pool.submit(get, nxt, min(nxt + part, size)))
            yield chunk
            if len(chunk) < part and window:
                for fut in window:
                    fut.cancel()
                return


class Hashing:
    """A sha256 fed in order on one thread of its own, so that a pull hashes one part while it writes the next:
    the hash stays the custody chain, off the writing thread (hashlib and file writes both release the GIL).
    At most ``depth`` parts wait to be hashed (memory: ``depth`` parts); :meth:`close` waits for the last one."""

    def __init__(self, h: Any, depth: int = 2) -> None:
        self._h = h
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="modelyard-hash")
        self._pending: deque[Future[None]] = deque()
        self._depth = depth

    def feed(self, chunk: bytes) -> None:
        while len(self._pending) >= self._depth:
            self._pending.popleft().result()
        self._pending.append(self._pool.submit(self._h.update, chunk))

    def close(self) -> None:
        """Wait for every part fed so far to be hashed (then ``h`` holds them all), and stop the thread."""
        self._pool.shutdown(wait=True)
        self._pending.clear()


def skip_bytes(chunks: Iterable[bytes], n: int) -> Iterator[bytes]:
    """``chunks`` without their first ``n`` bytes (a server that ignored ``Range`` sent the whole file)."""
    for c in chunks:
        if n >= len(c):
            n -= len(c)
            continue
        yield c[n:]
        n = 0
