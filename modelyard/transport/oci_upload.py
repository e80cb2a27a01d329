"""A blob pushed to an OCI registry in chunks that a killed publish continues: the upload session's location is
kept in a local journal after every chunk, and the next run asks the registry how many bytes that session holds
and sends only the rest.

The protocol is the OCI distribution spec's chunked upload (``POST /v2/<name>/blobs/uploads/``, ``PATCH`` with
``Content-Range`` per chunk, each answer's ``Location`` the session's next URL, ``PUT ...?digest=`` to close) and
its upload status (``GET`` on the session's location: ``204`` with ``Range: 0-<last byte>``, ``404`` once the
registry has forgotten it, e.g. after its upload purge). Nothing here trusts the journal for the bytes: the
registry checks the whole blob's digest when the upload closes, so a session that holds other bytes is refused
there (``DIGEST_INVALID``) and the caller reports it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

#: the journal's file name for one blob of one repository: hex of sha256("<registry>/<repo>/<digest>"), shortened
_NAME_LEN = 32


@dataclass(frozen=True)
class Upload:
    """What one blob upload did: the registry's answer to the closing ``PUT`` (``response``), the bytes
    ``sent`` (bytes), ``resumed_at`` (the byte offset a kept session continued from, 0 when it started anew) and
    ``forgotten`` (a session kept in the journal that the registry no longer had: the blob started over)."""

    response: Any
    sent: int
    resumed_at: int = 0
    forgotten: bool = False


def journal_file(journal: Path, registry: str, repo: str, digest: str) -> Path:
    """Where the session of ``digest``'s upload to ``registry``/``repo`` is kept under ``journal``."""
    key = hashlib.sha256(f"{registry}/{repo}/{digest}".encode()).hexdigest()[:_NAME_LEN]
    return journal / f"{key}.json"


def _keep(record: Path, location: str, digest: str) -> None:
    """Write the session's ``location`` for ``digest`` (a temp file and a rename: whole or absent)."""
    record.parent.mkdir(parents=True, exist_ok=True)
    tmp = record.with_suffix(".tmp")
    tmp.write_text(json.dumps({"location": location, "digest": digest}))
    os.replace(tmp, record)


def _kept(record: Path, digest: str) -> str | None:
    """The session location kept for ``digest`` (None: none, or a record of other bytes or unreadable)."""
    try:
        rec = json.loads(record.read_text())
    except (OSError, ValueError):
        return None
    return rec["location"] if isinstance(rec, dict) and rec.get("digest") == digest and rec.get("location") else None


def _held(client, location: str) -> int | None:  # noqa: ANN001 - an oras Registry
    """The bytes the registry's session at ``location`` holds (its upload status ``Range: 0-<last>``; 0 for an
    empty session), or None when the registry no longer knows the session (any answer but 204)."""
    r = client.do_request(location, "GET", headers=dict(client.headers))
    if r.status_code != 204:
        return None
    m = re.fullmatch(r"(?:bytes=)?0-(\d+)", (r.headers.get("Range") or "").strip())
    return int(m.group(1)) + 1 if m else 0


def upload_blob(client, container, path: Path, layer: dict[str, Any], *, chunk_size: int,  # noqa: ANN001
                journal: Path | None = None) -> Upload:
    """Upload the file ``path`` as the blob ``layer`` (``digest``, ``size`` in bytes) in chunks of ``chunk_size``
    bytes through ``client`` (an oras ``Registry``, its auth and TLS settings) into ``container``.

    With ``journal`` (a local folder), the session's location is kept there after the session starts and after
    every chunk; a later call for the same registry, repository and digest asks the registry what that session
    holds and continues from there. A session the registry forgot (404 on its status) starts over, with
    ``forgotten`` set. The record is removed when the closing ``PUT`` succeeds. Raises what ``requests`` raises
    for a failed connection and :class:`ValueError` when the registry answers a chunk without a ``Location``;
    a refused chunk or ``PUT`` is returned (``response``) for the caller to judge."""
    base = f"{client.prefix}://{container.registry}/"
    record = journal_file(journal, container.registry, container.api_prefix, layer["digest"]) if journal else None
    location, offset, forgotten = (_kept(record, layer["digest"]) if record else None), 0, False
    if location is not None:
        held = _held(client, location)
        if held is None or held > layer["size"]:
            location, forgotten = None, True
        else:
            offset = held
    if location is None:
        r = client.do_request(f"{client.prefix}://{container.upload_blob_url()}", "POST",
                              headers={"Content-Type": "application/octet-stream", "Content-Length": "0", **client.headers})
        if r.status_code != 202:  # refused: the caller reports the answer
            return Upload(r, 0, 0, forgotten)
        if not r.headers.get("Location"):
            raise ValueError(f"the registry opened an upload of {layer['digest']} without a Location")
        location = urljoin(base, r.headers["Location"])
        if record:
            _keep(record, location, layer["digest"])
    resumed_at, sent = offset, 0
    with open(path, "rb") as fh:
        fh.seek(offset)
        while chunk := fh.read(chunk_size):
            headers = {"Content-Range": f"{offset}-{offset + len(chunk) - 1}", "Content-Length": str(len(chunk)),
                       "Content-Type": "application/octet-stream", **client.headers}
            r = client.do_request(location, "PATCH", data=chunk, headers=headers)
            if r.status_code not in (202, 204):
                return Upload(r, sent, resumed_at, forgotten)
            if not r.headers.get("Location"):
                raise ValueError(f"the registry answered a chunk of {layer['digest']} without a Location")
            location = urljoin(base, r.headers["Location"])
            offset += len(chunk)
            sent += len(chunk)
            if record:
                _keep(record, location, layer["digest"])
    sep = "&" if "?" in location else "?"
    r = client.do_request(f"{location}{sep}digest={layer['digest']}", "PUT", headers=dict(client.headers))
    if record and r.status_code in (200, 201):
        record.unlink(missing_ok=True)
    return Upload(r, sent, resumed_at, forgotten)
