"""S3 plumbing shared by ``s3://`` publishing (:mod:`.s3`) and the object-store store (:mod:`.objectstore`):
the URI, the client (s3fs), error messages, and the checked uploads and downloads.

Every upload carries its sha256: as ``ChecksumSHA256`` (S3 refuses bytes that do not match) and as
metadata (``x-amz-meta-sha256``); a multipart upload sends one ``ChecksumSHA256`` per part and hashes
the whole file on the way, completing it only when that matches. The bytes sent are hashed here too,
since not every S3-compatible server verifies.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any

from modelyard.errors import HashMismatchError, PublishError
from modelyard.settings import Settings
from modelyard.transport._transfer import CHUNK, LocalFile

DEFAULT_MULTIPART = 64 * 1024 * 1024  # bytes: bigger files go up in parts of this size
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


def s3_filesystem(settings: Any):  # noqa: ANN202
    import s3fs  # noqa: PLC0415 - heavy: s3fs, imported on first use

    endpoint = settings.s3_endpoint() if settings is not None else None
    kw: dict[str, Any] = {"client_kwargs": {"endpoint_url": endpoint}} if endpoint else {}
    return s3fs.S3FileSystem(skip_instance_cache=True, default_block_size=CHUNK, **kw)


def s3_settings(settings: Any) -> Any:
    if settings is None:

        settings = Settings()
    return settings


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


def put_multipart(fs, bucket: str, key: str, f: LocalFile, part: int, uri: str) -> None:  # noqa: ANN001
    """Parts of ``part`` bytes, each byte hashed once into the whole-file sha256; completed only if it
    matches ``f.sha256`` (aborted otherwise, leaving nothing behind)."""
    try:
        mpu = fs.call_s3("create_multipart_upload", Bucket=bucket, Key=key, Metadata={"sha256": f.sha256},
                         ChecksumAlgorithm="SHA256")
    except Exception as exc:  # noqa: BLE001
        raise s3_error(exc, f"starting the upload of {f.rel}", uri) from exc
    upload_id = mpu["UploadId"]
    h = hashlib.sha256()
    parts = []
    try:
        with open(f.path, "rb") as fh:
            n = 1
            while chunk := fh.read(part):
                h.update(chunk)
                part_sha = checksum(hashlib.sha256(chunk).hexdigest())  # S3 refuses a part whose bytes differ
                try:
                    out = fs.call_s3("upload_part", Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=n, Body=chunk,
                                     ChecksumSHA256=part_sha)
                except Exception as exc:  # noqa: BLE001
                    raise s3_error(exc, f"uploading part {n} of {f.rel}", uri) from exc
                parts.append({"PartNumber": n, "ETag": out["ETag"], "ChecksumSHA256": part_sha})
                n += 1
        if h.hexdigest() != f.sha256:
            raise HashMismatchError(f"{f.path}: sha256 {h.hexdigest()} differs from {f.sha256}, the digest the artifact "
                                    "records; the upload was aborted",
                                    fix="The artifact changed after it was made: run `modelyard verify` on it and "
                                        "re-ingest the model.")
        try:
            fs.call_s3("complete_multipart_upload", Bucket=bucket, Key=key, UploadId=upload_id,
                       MultipartUpload={"Parts": parts})
        except Exception as exc:  # noqa: BLE001
            raise s3_error(exc, f"completing the upload of {f.rel}", uri) from exc
    except BaseException:
        try:
            fs.call_s3("abort_multipart_upload", Bucket=bucket, Key=key, UploadId=upload_id)
        except Exception:  # noqa: BLE001, S110 - best effort; the original error matters
            pass
        raise
    finally:
        fs.invalidate_cache()


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
