"""S3 plumbing shared by ``s3://`` publishing (:mod:`.s3`) and the object-store store (:mod:`.objectstore`):
the URI, the client (s3fs), error messages, and the checked uploads and downloads.

Every upload carries its sha256: as ``ChecksumSHA256`` (S3 refuses bytes that do not match) and as
metadata (``x-amz-meta-sha256``); a multipart upload sends one ``ChecksumSHA256`` per part and hashes
the whole file on the way, completing it only when that matches. Big files go up and come down in parts,
several at once (:data:`DEFAULT_CONCURRENCY`), and an unfinished multipart upload is resumed. The bytes sent are hashed here too,
since not every S3-compatible server verifies.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

from modelyard.errors import HashMismatchError, PublishError
from modelyard.settings import Settings
from modelyard.transport._streams import CHUNK, RANGE_CONCURRENCY, RANGE_PART, ordered_parts
from modelyard.transport._transfer import LocalFile

DEFAULT_MULTIPART = 16 * 1024 * 1024  # bytes: bigger files go up (and come down) in parts of this size
#: parts in flight at once, each way: boto3's TransferConfig default ``max_concurrency``
DEFAULT_CONCURRENCY = 10
MAX_PARTS = 10_000  # S3's most parts of one upload
MIN_PART = 5 * 1024 * 1024  # S3's smallest part (all but the last)
_FIX_URI = "Write it as s3://BUCKET/PREFIX, e.g. s3://models/tiny/v1."


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/prefix`` → (bucket, prefix without trailing slash); raises :class:`PublishError`."""
    if not uri.startswith("s3://"):
        raise PublishError(f"{uri!r} is not an s3:// URI", fix=_FIX_URI)
    bucket, _, prefix = uri[5:].partition("/")
    prefix = prefix.strip("/")
    if not bucket or not prefix or "@" in bucket or any(p in ("", ".", "..") for p in prefix.split("/")):
        raise PublishError(f"{uri!r} needs a bucket and a prefix (no '.', '..' or empty parts)", fix=_FIX_URI)
    return bucket, prefix


def s3_filesystem(settings: Settings):  # noqa: ANN202
    import s3fs  # noqa: PLC0415 - heavy: s3fs, imported on first use

    endpoint = settings.s3_endpoint()
    kw: dict[str, Any] = {"client_kwargs": {"endpoint_url": endpoint}} if endpoint else {}
    # every body modelyard sends carries its sha256 as ChecksumSHA256, a signed header that S3 checks the body
    # against: signing the body as well (botocore does over plain http) would hash every byte a second time,
    # in s3fs's one event-loop thread
    return s3fs.S3FileSystem(skip_instance_cache=True, default_block_size=CHUNK,
                             config_kwargs={"s3": {"payload_signing_enabled": False}}, **kw)


def s3_error(exc: BaseException, what: str, uri: str) -> PublishError:
    name = type(exc).__name__
    text = str(exc).splitlines()[0][:200] if str(exc) else ""
    if isinstance(exc, PermissionError) or "AccessDenied" in text or "InvalidAccessKeyId" in text:
        fix = "Check the AWS credentials (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or a profile) and the bucket policy."
    elif isinstance(exc, FileNotFoundError) or "NoSuchBucket" in text:
        fix = "Create the bucket first, or check its name."
    else:
        fix = "Check MODELYARD_S3_ENDPOINT_URL (or AWS_ENDPOINT_URL) and that the service is reachable."
    return PublishError(f"{uri}: {what} failed ({name}{': ' + text if text else ''})", fix=fix)


def checksum(sha: str) -> str:
    """S3's ``ChecksumSHA256`` form (base64 of the 32 bytes) of a hex sha256."""
    return base64.b64encode(bytes.fromhex(sha)).decode()


def put_bytes(fs, bucket: str, key: str, data: bytes, sha: str, uri: str, rel: str, **extra: Any) -> None:  # noqa: ANN001
    """One ``PutObject`` of ``data`` with its sha256 as ``ChecksumSHA256`` (S3 refuses other bytes) and as
    metadata; ``extra``: more ``PutObject`` arguments (``IfNoneMatch``, ``IfMatch``, ``Metadata``)."""
    got = hashlib.sha256(data).hexdigest()
    if got != sha:  # S3 would refuse it; an S3-compatible server that does not check must not store it either
        raise HashMismatchError(f"{uri}: {rel} has sha256 {got}, not {sha} as the artifact records; nothing was uploaded",
                                fix="The artifact changed after it was made: run `modelyard verify` on it and "
                                    "re-ingest the model.")
    metadata = {"sha256": sha, **extra.pop("Metadata", {})}
    try:
        fs.call_s3("put_object", Bucket=bucket, Key=key, Body=data, Metadata=metadata, ChecksumSHA256=checksum(sha),
                   **extra)
    except Exception as exc:  # noqa: BLE001
        if "IfNoneMatch" in extra or "IfMatch" in extra:
            raise  # the caller tells a lost condition from a failure
        if "BadDigest" in str(exc) or "XAmzContentChecksumMismatch" in str(exc) or "InvalidRequest" in str(exc) \
                and "checksum" in str(exc).lower():
            raise HashMismatchError(f"{uri}: S3 refused {rel}: its bytes do not match sha256 {sha} recorded in the "
                                    "artifact", fix="The artifact changed after it was made: run `modelyard verify` "
                                                    "on it and re-ingest the model.") from exc
        raise s3_error(exc, f"uploading {rel}", uri) from exc
    finally:
        fs.invalidate_cache()


def put_multipart(fs, bucket: str, key: str, f: LocalFile, part: int, uri: str,  # noqa: ANN001
                  concurrency: int = DEFAULT_CONCURRENCY, journal: Path | None = None) -> int:
    """Upload ``f`` to ``key`` in parts of ``part`` bytes (more when the file would need over
    :data:`MAX_PARTS`), up to ``concurrency`` parts in flight, the next one sent as soon as any is done (the file
    is read once, in order, so that every byte goes into the whole-file sha256; memory: ``concurrency`` + 1 parts,
    and up to as much again in asyncio's send buffer, which copies what the socket did not take at once). Each
    part carries its ``ChecksumSHA256`` (S3 refuses a part whose bytes differ), so the body itself is not signed.
    Completed only when the whole file's sha256 is ``f.sha256``; else aborted (:class:`HashMismatchError`), leaving nothing behind.

    Resumable across a crash when ``key`` is content-addressed (it ends with ``f.sha256``: the object store's
    ``blobs/sha256/<sha>``, so an unfinished upload of it, and the sha256 metadata it was started with, can only
    be of these bytes): an unfinished upload of ``key`` (``ListMultipartUploads``) is continued, and a part it
    already holds is not sent again when its ``ChecksumSHA256`` (S3), else its ``ETag`` (the part's MD5, as S3
    and moto give it for unencrypted objects) matches the local part. A failure then keeps the upload for the
    next run; a bucket lifecycle rule (``AbortIncompleteMultipartUpload``) removes one never resumed. Any other
    key's upload is resumable only through ``journal`` (a local folder): the upload id and the file's sha256 are
    recorded there when the upload starts, so a run killed on this machine is continued by the next one for the
    same bytes (the sha256 metadata it was started with is then this file's); every other unfinished upload of
    that key (another version of the file, another machine's) is aborted before it starts, and a failure without
    a journal aborts the upload. Returns the bytes sent. Raises :class:`PublishError` naming the part on a
    failure."""
    part = max(part, -(-f.size // MAX_PARTS))
    content_addressed = key.endswith(f.sha256)
    record = None if content_addressed or journal is None else \
        journal / (hashlib.sha256(f"{bucket}/{key}".encode()).hexdigest()[:32] + ".json")
    resumable = content_addressed or record is not None
    upload_id, held = _unfinished(fs, bucket, key, uri) if content_addressed else _recorded(fs, bucket, key, f.sha256,
                                                                                             record, uri)
    if upload_id is None:
        try:
            upload_id = fs.call_s3("create_multipart_upload", Bucket=bucket, Key=key, Metadata={"sha256": f.sha256},
                                   ChecksumAlgorithm="SHA256")["UploadId"]
        except Exception as exc:  # noqa: BLE001
            raise s3_error(exc, f"starting the upload of {f.rel}", uri) from exc
        if record is not None:
            _write_record(record, {"bucket": bucket, "key": key, "upload_id": upload_id, "sha256": f.sha256})

    def send(n: int, chunk: bytes, part_sha: str | None) -> dict[str, Any]:
        part_sha = part_sha or checksum(hashlib.sha256(chunk).hexdigest())  # in the worker: hashlib frees the GIL
        try:
            out = fs.call_s3("upload_part", Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=n, Body=chunk,
                             ChecksumSHA256=part_sha)
        except Exception as exc:  # noqa: BLE001
            raise s3_error(exc, f"uploading part {n} of {f.rel}", uri) from exc
        return {"PartNumber": n, "ETag": out["ETag"], "ChecksumSHA256": part_sha}

    h = hashlib.sha256()
    parts: list[dict[str, Any]] = []
    sent = 0
    try:
        with open(f.path, "rb") as fh, ThreadPoolExecutor(max_workers=concurrency,
                                                          thread_name_prefix="modelyard-s3-part") as pool:
            window: set[Future[dict[str, Any]]] = set()
            n = 1
            while chunk := fh.read(part):
                h.update(chunk)
                old = held.get(n)
                part_sha = checksum(hashlib.sha256(chunk).hexdigest()) if old is not None else None
                if old is not None and old.get("Size") == len(chunk) and _same_part(old, chunk, str(part_sha)):
                    parts.append({"PartNumber": n, "ETag": old["ETag"], "ChecksumSHA256": part_sha})
                else:
                    window.add(pool.submit(send, n, chunk, part_sha))
                    sent += len(chunk)
                    if len(window) >= concurrency:  # the next part goes up as soon as any part is done, as boto3's
                        done, window = wait(window, return_when=FIRST_COMPLETED)  # TransferManager does
                        parts.extend(d.result() for d in done)
                n += 1
                del chunk
            parts.extend(d.result() for d in wait(window).done)
        if h.hexdigest() != f.sha256:
            _abort(fs, bucket, key, upload_id)
            raise HashMismatchError(f"{f.path}: sha256 {h.hexdigest()} differs from {f.sha256}, the digest the artifact "
                                    "records; the upload was aborted",
                                    fix="The artifact changed after it was made: run `modelyard verify` on it and "
                                        "re-ingest the model.")
        try:
            fs.call_s3("complete_multipart_upload", Bucket=bucket, Key=key, UploadId=upload_id,
                       MultipartUpload={"Parts": sorted(parts, key=lambda p: p["PartNumber"])})
        except Exception as exc:  # noqa: BLE001
            raise s3_error(exc, f"completing the upload of {f.rel}", uri) from exc
    except BaseException as exc:
        if not resumable or isinstance(exc, HashMismatchError):
            _abort(fs, bucket, key, upload_id)
            if record is not None:
                record.unlink(missing_ok=True)
        raise
    finally:
        fs.invalidate_cache()
    if record is not None:
        record.unlink(missing_ok=True)
    return sent


def _recorded(fs, bucket: str, key: str, sha: str, record: Path | None,  # noqa: ANN001
              uri: str) -> tuple[str | None, dict[int, dict[str, Any]]]:
    """The unfinished upload of ``key`` that ``record`` (this machine's journal) says was started for the bytes
    ``sha``, and its parts, or ``(None, {})``; every other unfinished upload of ``key`` is aborted."""
    ids = _unfinished_ids(fs, bucket, key, uri)
    mine = None
    if record is not None and ids:
        try:
            rec = json.loads(record.read_text())
        except (OSError, ValueError):
            rec = {}
        if isinstance(rec, dict) and rec.get("sha256") == sha and rec.get("upload_id") in ids:
            mine = str(rec["upload_id"])
    for stale in ids:
        if stale != mine:
            _abort(fs, bucket, key, stale)
    return (mine, _parts(fs, bucket, key, mine, uri)) if mine else (None, {})


def _write_record(record: Path, data: dict[str, str]) -> None:
    """``data`` as ``record``, written to a temp name and renamed (best effort: without it the upload is only
    not resumable)."""
    try:
        record.parent.mkdir(parents=True, exist_ok=True)
        tmp = record.with_suffix(f".tmp-{os.getpid()}")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, record)
    except OSError:
        pass


def _same_part(old: dict[str, Any], chunk: bytes, part_sha: str) -> bool:
    """Whether a part an unfinished upload holds (``ListParts`` entry) has ``chunk``'s bytes."""
    if old.get("ChecksumSHA256"):
        return bool(old["ChecksumSHA256"] == part_sha)
    return str(old.get("ETag", "")).strip('"') == hashlib.md5(chunk, usedforsecurity=False).hexdigest()


def _uploads(fs, bucket: str, key: str) -> list[dict[str, Any]]:  # noqa: ANN001
    return [u for u in fs.call_s3("list_multipart_uploads", Bucket=bucket, Prefix=key).get("Uploads", [])
            if u.get("Key") == key]


def _unfinished_ids(fs, bucket: str, key: str, uri: str) -> list[str]:  # noqa: ANN001
    """The upload ids of every unfinished multipart upload of ``key``."""
    try:
        return [str(u["UploadId"]) for u in _uploads(fs, bucket, key)]
    except Exception as exc:  # noqa: BLE001
        raise s3_error(exc, f"listing unfinished uploads of {key}", uri) from exc


def _unfinished(fs, bucket: str, key: str, uri: str) -> tuple[str | None, dict[int, dict[str, Any]]]:  # noqa: ANN001
    """The newest unfinished multipart upload of ``key`` and its parts by number, or ``(None, {})``."""
    try:
        ups = _uploads(fs, bucket, key)
        if not ups:
            return None, {}
        upload_id = max(ups, key=lambda u: str(u.get("Initiated", "")))["UploadId"]
    except Exception as exc:  # noqa: BLE001
        raise s3_error(exc, f"listing unfinished uploads of {key}", uri) from exc
    return upload_id, _parts(fs, bucket, key, upload_id, uri)


def _parts(fs, bucket: str, key: str, upload_id: str, uri: str) -> dict[int, dict[str, Any]]:  # noqa: ANN001
    """The parts an unfinished upload holds, by number (``ListParts``, every page)."""
    held: dict[int, dict[str, Any]] = {}
    marker = 0
    try:
        while True:
            page = fs.call_s3("list_parts", Bucket=bucket, Key=key, UploadId=upload_id, PartNumberMarker=marker)
            held.update({int(p["PartNumber"]): p for p in page.get("Parts", [])})
            if not page.get("IsTruncated"):
                return held
            marker = int(page["NextPartNumberMarker"])
    except Exception as exc:  # noqa: BLE001
        raise s3_error(exc, f"listing the parts of the unfinished upload of {key}", uri) from exc


def _abort(fs, bucket: str, key: str, upload_id: str) -> None:  # noqa: ANN001
    try:
        fs.call_s3("abort_multipart_upload", Bucket=bucket, Key=key, UploadId=upload_id)
    except Exception:  # noqa: BLE001, S110 - best effort; the original error matters
        pass


def read_ranges(fs, path: str, size: int, rel: str, uri: str, adv,  # noqa: ANN001, ANN202, PLR0913
                part: int = RANGE_PART, concurrency: int = RANGE_CONCURRENCY, start: int = 0):
    """The bytes ``[start, size)`` of the object ``path`` (``size`` bytes, as the artifact records), in order,
    fetched as ranged GETs of ``part`` bytes, up to ``concurrency`` in flight (:func:`~._streams.ordered_parts`),
    so that the caller hashes and writes them in one pass. A whole object up to one part is one GET
    (:func:`read_chunks`); ``start`` > 0 (a killed pull's partial file continued) is always ranged. Raises
    :class:`PublishError` as :func:`read_chunks` does."""
    if size <= part and not start:
        yield from read_chunks(fs, path, rel, uri, adv)
        return

    def get(start: int, end: int) -> bytes:
        try:
            return bytes(fs.cat_file(path, start=start, end=end))
        except FileNotFoundError as exc:
            raise PublishError(f"{uri}: {rel} is listed in the artifact but missing from the bucket",
                               fix="The publish was incomplete or the object was deleted: publish again.") from exc
        except Exception as exc:  # noqa: BLE001
            raise s3_error(exc, f"downloading bytes {start}-{end - 1} of {rel}", uri) from exc

    for chunk in ordered_parts(get, start, size, part, concurrency):
        adv(len(chunk))
        yield chunk


def read_chunks(fs, path: str, rel: str, uri: str, adv):  # noqa: ANN001, ANN202
    try:
        with fs.open(path, "rb", block_size=CHUNK, cache_type="none") as fh:
            while chunk := fh.read(CHUNK):
                adv(len(chunk))
                yield chunk
    except FileNotFoundError as exc:
        raise PublishError(f"{uri}: {rel} is listed in the artifact but missing from the bucket",
                           fix="The publish was incomplete or the object was deleted: publish again.") from exc
    except PublishError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise s3_error(exc, f"downloading {rel}", uri) from exc
