"""Byte ranges and partial files of the hub fetch (:mod:`modelyard.stages.fetch.hub`): where a blob is
downloaded to, a safetensors header read by ``Range`` requests, and the folder of small files and sparse
shards that the checks judge before a weight byte is downloaded."""

from __future__ import annotations

import os
import shutil
import struct
from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote, urlparse

from modelyard.model.checkpoint import MAX_HEADER_BYTES


def url_to_path(url: str) -> Path:
    """The local path of a ``file://`` URL (:meth:`Path.as_uri`'s inverse)."""
    return Path(unquote(urlparse(url).path))


def partial_path(blob: Path) -> Path:
    """Where the blob ``blobs/<etag>`` is downloaded to: ``blobs/<etag>.incomplete``, the name huggingface_hub
    0.x used and resumed from. It is written only under the blob's lock, so one name per blob is safe; a killed
    download leaves it behind and the next fetch continues from its last byte with a ``Range`` request, after
    hashing what it holds (the digests are rebuilt from the file, never trusted from a side file), and the
    whole file's sha256 is still compared with the hub's before the blob is renamed into place."""
    return blob.with_name(f"{blob.name}.incomplete")


def header_prefix(read: Callable[[int, int], bytes], size: int) -> bytes:
    """The bytes a safetensors reader reads first: the 8-byte little-endian header length ``n``, then
    the ``n`` header bytes, when ``n`` is within safetensors' cap and the file (``size`` bytes). Else
    only the first 8 bytes (the checks then report the bad length from them). ``read(a, b)`` returns
    bytes ``[a, b)``."""
    head = read(0, min(8, size))
    if len(head) < 8:
        return head
    (n,) = struct.unpack("<Q", head)
    if n <= MAX_HEADER_BYTES and 8 + n <= size and n:
        head += read(8, 8 + n)
    return head


def ranged_get(url: str, headers: dict[str, str], start: int, end: int) -> bytes:
    """Bytes ``[start, end)`` of ``url`` with a ``Range`` request (huggingface_hub's backoff and errors).
    A server that ignores ``Range`` answers 200 with the whole file: it is read only up to ``end`` and
    the connection closed."""
    from huggingface_hub import constants  # noqa: PLC0415 - heavy: huggingface_hub, imported on first use
    from huggingface_hub.utils import hf_raise_for_status, http_stream_backoff  # noqa: PLC0415 - heavy: huggingface_hub, imported on first use

    h = {**headers, "Range": f"bytes={start}-{end - 1}", "Accept-Encoding": "identity"}
    want = end - start
    buf = bytearray()
    with http_stream_backoff("GET", url, headers=h, timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT,
                             retry_on_status_codes=(408, 429)) as r:
        hf_raise_for_status(r)
        skip = start if r.status_code == 200 else 0
        for chunk in r.iter_bytes(chunk_size=min(65536, max(want, 1))):
            if skip:
                drop = min(skip, len(chunk))
                chunk, skip = chunk[drop:], skip - drop
            buf += chunk[:want - len(buf)]
            if len(buf) >= want:
                break
    return bytes(buf)


def skeleton(folder: Path, blobs: dict[str, Path], headers: dict[str, bytes], sizes: dict[str, int]) -> Path:
    """Fill ``folder`` (new, empty) with what the checks read: each of ``blobs`` (path -> cached file)
    hard-linked (copied across filesystems), and each shard of ``headers`` as a sparse file of
    ``sizes[path]`` bytes that starts with its header. Returns ``folder``."""
    for path, blob in blobs.items():
        dst = folder / path
        dst.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(blob, dst)
        except OSError:
            shutil.copyfile(blob, dst)
    for path, head in headers.items():
        dst = folder / path
        dst.parent.mkdir(parents=True, exist_ok=True)
        with open(dst, "wb") as fh:
            fh.write(head)
            fh.truncate(sizes[path])
    return folder
