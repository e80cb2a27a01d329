"""s3: publish an artifact under ``s3://bucket/prefix/`` and pull it back, through fsspec/s3fs.

Layout: the artifact's files under the prefix as they are in the folder, plus ``bundle.json`` (the
bundle's index: every file ``manifest.json`` does not list, with size and sha256, and the manifest's
sha256). Order: every file, then ``bundle.json``, then **``manifest.json`` last**, so a prefix without
``manifest.json`` is an incomplete publish, which :func:`pull_s3` refuses.

Checksums: every object carries its sha256 as metadata (``x-amz-meta-sha256``). Objects up to
``multipart_threshold`` are sent with ``ChecksumSHA256`` (the manifest's digest, base64), so S3 itself
refuses bytes that do not match it (and modelyard checks the bytes it sends too: not every
S3-compatible server verifies); bigger ones go up in parts, each with its own ``ChecksumSHA256``,
while being hashed once, and the upload is completed only when the whole-file sha256 matches the
manifest (aborted otherwise).
:func:`pull_s3` streams each object into a temp folder, checks its size and sha256 against
``manifest.json`` (model/) or ``bundle.json`` (the rest), and renames the folder into place at the end.

Endpoint: ``MODELYARD_S3_ENDPOINT_URL`` (or ``AWS_ENDPOINT_URL``); credentials and region: the usual
AWS variables and files (botocore's chain). Nothing secret appears in messages.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

from modelyard import progress
from modelyard.artifact.index import dump_index
from modelyard.artifact.layout import MANIFEST, SIGNATURE
from modelyard.errors import PublishError, SignatureError
from modelyard.settings import Settings
from modelyard.transport._s3io import (  # parse_s3_uri and the defaults are this module's API too
    DEFAULT_MULTIPART,
    MIN_PART,
    parse_s3_uri,
    put_bytes,
    put_multipart,
    read_ranges,
    s3_error,
    s3_filesystem,
)
from modelyard.transport._transfer import (
    INDEX_NAME,
    LocalFile,
    PublishResult,
    PullResult,
    Staging,
    check_index,
)
from modelyard.transport.refs import load_artifact
from modelyard.transport.signing import verify_signature


def publish_s3(artifact_dir: str | Path, uri: str, *, settings: Settings, home: Path | None = None,
               multipart_threshold: int = DEFAULT_MULTIPART) -> PublishResult:
    """Upload the artifact (folder or store reference) under ``uri`` (``s3://bucket/prefix``),
    ``manifest.json`` last. Refuses a prefix that already holds a different artifact (same content: sends only
    what is missing). A killed publish continues: the files it sent (same size and sha256 metadata) are
    not sent again, and the multipart upload it left is continued part by part (``put_multipart``'s journal under
    ``<home>/.cache/s3-uploads``). Raises :class:`PublishError` (exit 2), :class:`HashMismatchError` (exit 1)
    when a file's bytes differ from the sha256 the artifact records. ``settings``: the run's (the S3 endpoint, the
    store and its cache)."""
    bucket, prefix = parse_s3_uri(uri)
    art = load_artifact(artifact_dir, home, settings=settings)
    fs = s3_filesystem(settings)
    base = f"{bucket}/{prefix}"
    try:
        existing = fs.cat_file(f"{base}/manifest.json") if fs.exists(f"{base}/manifest.json") else None
    except Exception as exc:  # noqa: BLE001 - botocore/aiohttp raise many kinds
        raise s3_error(exc, "reading the prefix", uri) from exc
    if existing is not None and existing != art.manifest_bytes:

        other = json.loads(existing).get("content_digest") if existing.strip().startswith(b"{") else None
        raise PublishError(f"{uri} already holds another artifact ({other}); refusing to overwrite it",
                           fix="Publish under a new prefix (e.g. with the revision in it), or delete the old one first.")
    index_bytes = dump_index(art.index)
    journal = settings.cache_dir() / "s3-uploads"
    skipped = sent = 0
    with progress.task(f"uploading to {uri}", total=art.total_bytes + len(index_bytes)) as adv:
        for f in art.files:
            if _already_there(fs, bucket, f"{prefix}/{f.rel}", f, uri):
                skipped += 1  # a killed publish of this artifact sent it, or this is a second publish
            else:
                sent += _put_one(fs, bucket, f"{prefix}/{f.rel}", f, multipart_threshold, uri, journal)
            adv(f.size)
        for name, data in ((INDEX_NAME, index_bytes), (MANIFEST, art.manifest_bytes)):
            sha = hashlib.sha256(data).hexdigest()
            put_bytes(fs, bucket, f"{prefix}/{name}", data, sha, uri, name)
            sent += len(data)
            adv(len(data))
    return PublishResult(uri=f"s3://{base}", files=len(art.files) + 2, bytes=art.total_bytes + len(index_bytes),
                         content_digest=art.manifest.content_digest, skipped=skipped, sent=sent)


def _already_there(fs, bucket: str, key: str, f: LocalFile, uri: str) -> bool:  # noqa: ANN001
    """Whether ``key`` holds ``f`` already: its size, and the sha256 metadata modelyard sends with every upload
    (each part's ``ChecksumSHA256`` checked by S3, the whole file hashed before the upload completed)."""
    try:
        head = fs.call_s3("head_object", Bucket=bucket, Key=key)
    except FileNotFoundError:
        return False
    except Exception as exc:  # noqa: BLE001
        raise s3_error(exc, f"reading {f.rel}", uri) from exc
    return bool(head.get("ContentLength") == f.size and head.get("Metadata", {}).get("sha256") == f.sha256)


def _put_one(fs, bucket: str, key: str, f: LocalFile, threshold: int, uri: str,  # noqa: ANN001
             journal: Path | None = None) -> int:
    """Upload ``f`` to ``key``; returns the bytes sent (a resumed multipart upload sends only its missing parts)."""
    try:
        if f.size <= threshold:
            with open(f.path, "rb") as fh:
                data = fh.read(f.size + 1)
            put_bytes(fs, bucket, key, data, f.sha256, uri, f.rel)
            return len(data)
        return put_multipart(fs, bucket, key, f, max(threshold, MIN_PART), uri, journal=journal)
    except OSError as exc:
        if isinstance(exc, PublishError):
            raise
        raise PublishError(f"cannot read {f.path}: {exc.strerror or exc}", fix="Check that the artifact is readable.") from exc


def pull_s3(uri: str, into: Path, *, public_key: Path | str | None = None, settings: Settings,
            allow_partial: bool = False, check: Callable[[Path], None] | None = None) -> PullResult:
    """Download ``uri`` (``s3://bucket/prefix``) into the new folder ``into``, checking every object's
    size and sha256 against ``manifest.json``/``bundle.json``; all or nothing (a killed pull of the same artifact
    into the same ``into`` continues: :class:`~._transfer.Staging` with ``resume``). Refuses a prefix without
    ``manifest.json`` (an incomplete publish). With ``public_key``, verifies ``model.sig`` (required).

    Raises :class:`PublishError` (exit 2), :class:`HashMismatchError` (exit 1, names the file),
    :class:`~modelyard.errors.SignatureError` (exit 1). ``settings``: the run's (the S3 endpoint)."""
    bucket, prefix = parse_s3_uri(uri)
    fs = s3_filesystem(settings)
    base = f"{bucket}/{prefix}"
    try:
        has_manifest = fs.exists(f"{base}/manifest.json")
    except Exception as exc:  # noqa: BLE001
        raise s3_error(exc, "reading the prefix", uri) from exc
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
        raise s3_error(exc, "reading manifest.json", uri) from exc
    contents = check_index(uri, manifest_bytes, index_bytes)
    if public_key is not None and SIGNATURE not in contents.files:  # refused before any weight byte
        raise SignatureError(f"{uri} is unsigned (no {SIGNATURE}); --key asks for a signed artifact, nothing was written",
                             fix="Sign the artifact (`modelyard sign`) and publish it again, or pull without --key.")
    total = sum(e.size for e in contents.files.values())
    pulled = hashlib.sha256(manifest_bytes + b"\0" + index_bytes).hexdigest()  # a killed pull of it continues
    with Staging(into, resume=pulled, total=total + len(manifest_bytes)) as st, progress.task(f"downloading {uri}", total=total) as adv:
        st.advance = adv
        st.expect(contents.files)  # what a resumed folder holds beyond the artifact's files is removed, links too
        st.put(MANIFEST, manifest_bytes)
        for rel in sorted(contents.files):
            exp = contents.files[rel]

            def ranges(start: int, rel: str = rel, size: int = exp.size):  # noqa: ANN202 - Iterator[bytes]
                return read_ranges(fs, f"{base}/{rel}", size, rel, uri, adv, start=start)

            st.write(rel, ranges, exp.size, exp.sha256, uri)
        verified = None
        if public_key is not None:

            verify_signature(st.tmp, public_key=public_key, allow_partial=allow_partial)
            verified = True
        path = st.commit(check)
    return PullResult(path, len(contents.files) + 1, total + len(manifest_bytes),
                      contents.manifest.content_digest, verified)


