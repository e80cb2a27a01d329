"""s3: publish an artifact under ``s3://bucket/prefix/`` and pull it back, through fsspec/s3fs.

Layout: the artifact's files under the prefix as they are in the folder, plus ``bundle.json`` (the
bundle's index: every file ``manifest.json`` does not list, with size and sha256, and the manifest's
sha256). Order: every file, then ``bundle.json``, then **``manifest.json`` last**, so a prefix without
``manifest.json`` is an incomplete publish, which :func:`pull_s3` refuses.

Checksums: every object carries its sha256 as metadata (``x-amz-meta-sha256``). Objects up to
``multipart_threshold`` are sent with ``ChecksumSHA256`` (the manifest's digest, base64), so S3 itself
refuses bytes that do not match it; bigger ones go up in parts while being hashed once, and the
upload is completed only when the whole-file sha256 matches the manifest (aborted otherwise).
:func:`pull_s3` streams each object into a temp folder, checks its size and sha256 against
``manifest.json`` (model/) or ``bundle.json`` (the rest), and renames the folder into place at the end.

Endpoint: ``MODELYARD_S3_ENDPOINT_URL`` (or ``AWS_ENDPOINT_URL``); credentials and region: the usual
AWS variables and files (botocore's chain). Nothing secret appears in messages.
"""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

from modelyard import progress
from modelyard.artifact.layout import MANIFEST
from modelyard.errors import HashMismatchError, PublishError
from modelyard.settings import Settings
from modelyard.transport._transfer import (
    CHUNK,
    INDEX_NAME,
    LocalFile,
    PublishResult,
    PullResult,
    Staging,
    check_index,
    load_artifact,
)
from modelyard.transport.bundle import dump_meta
from modelyard.transport.signing import verify_signature

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


def _fs(settings: Any):  # noqa: ANN202
    import s3fs  # noqa: PLC0415 - heavy: s3fs, imported on first use

    endpoint = settings.s3_endpoint() if settings is not None else None
    kw: dict[str, Any] = {"client_kwargs": {"endpoint_url": endpoint}} if endpoint else {}
    return s3fs.S3FileSystem(skip_instance_cache=True, default_block_size=CHUNK, **kw)


def _settings(settings: Any) -> Any:
    if settings is None:

        settings = Settings()
    return settings


def _s3_error(exc: BaseException, what: str, uri: str) -> PublishError:
    name = type(exc).__name__
    text = str(exc).splitlines()[0][:200] if str(exc) else ""
    if isinstance(exc, PermissionError) or "AccessDenied" in text or "InvalidAccessKeyId" in text:
        fix = "Check the AWS credentials (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or a profile) and the bucket policy."
    elif isinstance(exc, FileNotFoundError) or "NoSuchBucket" in text:
        fix = "Create the bucket first, or check its name."
    else:
        fix = "Check MODELYARD_S3_ENDPOINT_URL (or AWS_ENDPOINT_URL) and that the service is reachable."
    return PublishError(f"{uri}: {what} failed ({name}{': ' + text if text else ''})", fix=fix)


def publish_s3(artifact_dir: str | Path, uri: str, *, settings: Any = None, home: Path | None = None,
               multipart_threshold: int = DEFAULT_MULTIPART) -> PublishResult:
    """Upload the artifact (folder or store reference) under ``uri`` (``s3://bucket/prefix``),
    ``manifest.json`` last. Refuses a prefix that already holds a different artifact (same content:
    uploads again, harmless). Raises :class:`PublishError` (exit 2), :class:`HashMismatchError` (exit 1)
    when a file's bytes differ from the sha256 the artifact records."""
    settings = _settings(settings)
    bucket, prefix = parse_s3_uri(uri)
    art = load_artifact(artifact_dir, home)
    fs = _fs(settings)
    base = f"{bucket}/{prefix}"
    try:
        existing = fs.cat_file(f"{base}/manifest.json") if fs.exists(f"{base}/manifest.json") else None
    except Exception as exc:  # noqa: BLE001 - botocore/aiohttp raise many kinds
        raise _s3_error(exc, "reading the prefix", uri) from exc
    if existing is not None and existing != art.manifest_bytes:

        other = json.loads(existing).get("content_digest") if existing.strip().startswith(b"{") else None
        raise PublishError(f"{uri} already holds another artifact ({other}); refusing to overwrite it",
                           fix="Publish under a new prefix (e.g. with the revision in it), or delete the old one first.")
    index_bytes = dump_meta(art.index)
    with progress.task(f"uploading to {uri}", total=art.total_bytes + len(index_bytes)) as adv:
        for f in art.files:
            _put_one(fs, bucket, f"{prefix}/{f.rel}", f, multipart_threshold, uri)
            adv(f.size)
        for name, data in ((INDEX_NAME, index_bytes), (MANIFEST, art.manifest_bytes)):
            sha = hashlib.sha256(data).hexdigest()
            _put_bytes(fs, bucket, f"{prefix}/{name}", data, sha, uri, name)
            adv(len(data))
    return PublishResult(uri=f"s3://{base}", files=len(art.files) + 2, bytes=art.total_bytes + len(index_bytes),
                         content_digest=art.manifest.content_digest)


def _put_bytes(fs, bucket: str, key: str, data: bytes, sha: str, uri: str, rel: str) -> None:  # noqa: ANN001
    try:
        fs.call_s3("put_object", Bucket=bucket, Key=key, Body=data, Metadata={"sha256": sha},
                   ChecksumSHA256=base64.b64encode(bytes.fromhex(sha)).decode())
    except Exception as exc:  # noqa: BLE001
        if "BadDigest" in str(exc) or "XAmzContentChecksumMismatch" in str(exc) or "InvalidRequest" in str(exc) \
                and "checksum" in str(exc).lower():
            raise HashMismatchError(f"{uri}: S3 refused {rel}: its bytes do not match sha256 {sha} recorded in the "
                                    "artifact", fix="The artifact changed after it was made: run `modelyard verify` "
                                                    "on it and re-ingest the model.") from exc
        raise _s3_error(exc, f"uploading {rel}", uri) from exc
    finally:
        fs.invalidate_cache()


def _put_one(fs, bucket: str, key: str, f: LocalFile, threshold: int, uri: str) -> None:  # noqa: ANN001
    try:
        if f.size <= threshold:
            with open(f.path, "rb") as fh:
                data = fh.read(f.size + 1)
            _put_bytes(fs, bucket, key, data, f.sha256, uri, f.rel)
            return
        _put_multipart(fs, bucket, key, f, max(threshold, MIN_PART), uri)
    except OSError as exc:
        if isinstance(exc, PublishError):
            raise
        raise PublishError(f"cannot read {f.path}: {exc.strerror or exc}", fix="Check that the artifact is readable.") from exc


def _put_multipart(fs, bucket: str, key: str, f: LocalFile, part: int, uri: str) -> None:  # noqa: ANN001
    """Parts of ``part`` bytes, each byte hashed once into the whole-file sha256; completed only if it
    matches ``f.sha256`` (aborted otherwise, leaving nothing behind)."""
    try:
        mpu = fs.call_s3("create_multipart_upload", Bucket=bucket, Key=key, Metadata={"sha256": f.sha256})
    except Exception as exc:  # noqa: BLE001
        raise _s3_error(exc, f"starting the upload of {f.rel}", uri) from exc
    upload_id = mpu["UploadId"]
    h = hashlib.sha256()
    parts = []
    try:
        with open(f.path, "rb") as fh:
            n = 1
            while chunk := fh.read(part):
                h.update(chunk)
                try:
                    out = fs.call_s3("upload_part", Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=n, Body=chunk)
                except Exception as exc:  # noqa: BLE001
                    raise _s3_error(exc, f"uploading part {n} of {f.rel}", uri) from exc
                parts.append({"PartNumber": n, "ETag": out["ETag"]})
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
            raise _s3_error(exc, f"completing the upload of {f.rel}", uri) from exc
    except BaseException:
        try:
            fs.call_s3("abort_multipart_upload", Bucket=bucket, Key=key, UploadId=upload_id)
        except Exception:  # noqa: BLE001, S110 - best effort; the original error matters
            pass
        raise
    finally:
        fs.invalidate_cache()


def pull_s3(uri: str, into: Path, *, public_key: Path | str | None = None, settings: Any = None) -> PullResult:
    """Download ``uri`` (``s3://bucket/prefix``) into the new folder ``into``, checking every object's
    size and sha256 against ``manifest.json``/``bundle.json``; all or nothing. Refuses a prefix without
    ``manifest.json`` (an incomplete publish). With ``public_key``, verifies ``model.sig`` (required).

    Raises :class:`PublishError` (exit 2), :class:`HashMismatchError` (exit 1, names the file),
    :class:`~modelyard.errors.SignatureError` (exit 1)."""
    settings = _settings(settings)
    bucket, prefix = parse_s3_uri(uri)
    fs = _fs(settings)
    base = f"{bucket}/{prefix}"
    try:
        has_manifest = fs.exists(f"{base}/manifest.json")
    except Exception as exc:  # noqa: BLE001
        raise _s3_error(exc, "reading the prefix", uri) from exc
    if not has_manifest:
        raise PublishError(f"{uri} has no manifest.json: nothing was published there, or the publish did not finish "
                           "(manifest.json is written last)",
                           fix="Check the URI, or publish the artifact again with `modelyard publish`.")
    try:
        manifest_bytes = fs.cat_file(f"{base}/manifest.json")
        index_bytes = fs.cat_file(f"{base}/{INDEX_NAME}")
    except FileNotFoundError as exc:
        raise PublishError(f"{uri} has manifest.json but no {INDEX_NAME}",
                           fix="Publish the artifact again with `modelyard publish`.") from exc
    except Exception as exc:  # noqa: BLE001
        raise _s3_error(exc, "reading manifest.json", uri) from exc
    contents = check_index(uri, manifest_bytes, index_bytes)
    total = sum(e.size for e in contents.files.values())
    with Staging(into) as st, progress.task(f"downloading {uri}", total=total) as adv:
        st.put(MANIFEST, manifest_bytes)
        for rel in sorted(contents.files):
            exp = contents.files[rel]
            st.write(rel, _chunks(fs, f"{base}/{rel}", rel, uri, adv), exp.size, exp.sha256, uri)
        verified = None
        if public_key is not None:

            verify_signature(st.tmp, public_key=public_key)
            verified = True
        path = st.commit()
    return PullResult(path, len(contents.files) + 1, total + len(manifest_bytes),
                      str(contents.manifest.get("content_digest", "")), verified)


def _chunks(fs, path: str, rel: str, uri: str, adv):  # noqa: ANN001, ANN202
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
        raise _s3_error(exc, f"downloading {rel}", uri) from exc


