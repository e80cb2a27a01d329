"""objectstore: the artifact store on S3 (``MODELYARD_STORE=s3://bucket/prefix``), one store for many workers.

Layout under the prefix::

    blobs/sha256/<hex>                          every file of every artifact, keyed by its sha256
    artifacts/<name>/<revision>/manifest.json   the artifact's manifest.json, byte for byte

A blob's key is its content: S3 checks it on the way in (``ChecksumSHA256`` on a single put, one per
part on a multipart one, the whole file hashed while it is sent and the upload completed only when it
matches), so the sha256 in ``manifest.json`` is also S3's checksum of the object. Files outside
``manifest.json`` (report.json, report.md, serve/, patches.json, model.sig, ...) are listed, with size
and sha256, in the artifact's *index*: ``bundle.json``'s format (:mod:`modelyard.transport.bundle`),
itself a blob, which binds the manifest by its sha256. The manifest object names its index in its
metadata (``x-amz-meta-index-sha256``), so one object says everything the artifact holds.

Publish, all or nothing, one winner: the blobs go up first (a blob already there is not sent again:
identical content, e.g. the weights a patched variant shares with its source, or what a killed run
had already sent), then the index, and **the manifest last, with a conditional put**
(``If-None-Match: *``). S3 accepts exactly one of several concurrent writers of a ``name/revision``;
the others get ``412 PreconditionFailed`` and reuse the winner's artifact when its ``content_digest``
is theirs, or refuse with :class:`ArtifactConflictError` as the folder store does. Until the manifest
exists nothing is visible: a killed run leaves only blobs that no manifest names (the retried run
reuses them). Blobs are immutable, so there is nothing to tear.

Promotion into an S3 store writes the manifest with a conditional put too: ``If-None-Match: *`` when
the artifact is new there, ``If-Match: <ETag>`` of the manifest it read when it was promoted before,
re-reading and re-applying on ``412`` (compare-and-swap): two promoters at once both end up in the
manifest, one as ``promotion``, the other in ``promotions``.

Each worker keeps a local cache: a folder :class:`~modelyard.artifact.store.Store` at
``MODELYARD_HOME``, where its drafts are staged and its published artifacts are kept, and where
:meth:`S3Store.local` downloads an artifact (every file checked against its sha256) when a command
needs the files (``verify``, ``bundle``, ``promote``). A cached copy is used only while its
``manifest.json`` is byte for byte the one in the bucket.

Endpoint and credentials as for ``s3://`` publishing (:mod:`modelyard.transport.s3`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Any

from modelyard import progress
from modelyard.artifact.index import dump_index
from modelyard.artifact.layout import MANIFEST
from modelyard.artifact.manifest import Manifest
from modelyard.artifact.store import Artifact, Store, StoreProtocol, same_content
from modelyard.errors import HashMismatchError, ManifestError, PublishError, StoreError
from modelyard.settings import Settings
from modelyard.transport._s3io import (
    DEFAULT_MULTIPART,
    MIN_PART,
    parse_s3_uri,
    put_bytes,
    put_multipart,
    read_ranges,
    s3_error,
    s3_filesystem,
)
from modelyard.transport._transfer import LocalArtifact, LocalFile, Staging, check_index, read_artifact
from modelyard.transport.unbundle import BundleContents

BLOBS = "blobs/sha256"
ARTIFACTS = "artifacts"
INDEX_META = "index-sha256"  # the manifest object's metadata key naming its index blob
_CAS_ATTEMPTS = 8  # compare-and-swap rounds of a promotion before giving up


def is_remote(spec: str | Path | None) -> bool:
    """Whether the store ``spec`` (``--store`` / ``MODELYARD_STORE``) is an object store (``s3://``)."""
    return str(spec or "").startswith("s3://")


def open_store(spec: str | Path | None = None, *, settings: Settings) -> StoreProtocol:
    """The store named by ``spec``: ``s3://bucket/prefix`` → :class:`S3Store` (cached under
    ``settings.store_dir()``, i.e. ``MODELYARD_HOME``), a folder → :class:`Store`; None → the store of
    ``settings`` (``MODELYARD_STORE``, else ``MODELYARD_HOME``). ``settings``: the run's. Raises
    :class:`PublishError` for an ``s3://`` URI without a bucket and a prefix."""
    spec = settings.store_spec() if spec is None else str(spec)
    if is_remote(spec):
        return S3Store(spec, settings.store_dir(), settings)
    return Store(Path(spec).expanduser())


class _Lost(Exception):
    """A conditional put found the condition false (another writer got there first)."""


def _precondition_failed(exc: BaseException) -> bool:
    """Whether ``exc`` (as s3fs raises it, the botocore error as its cause) is S3's ``412 PreconditionFailed``."""
    e: BaseException | None = exc
    while e is not None:
        code = ((getattr(e, "response", None) or {}).get("Error") or {}).get("Code")
        if code in ("PreconditionFailed", "412"):
            return True
        e = e.__cause__
    return False


class S3Store(Store):
    """The store at ``uri`` (``s3://bucket/prefix``), with the local folder store ``cache_home`` as this
    worker's cache (staging, locks and cached artifacts), reached with the run's ``settings`` (the S3 endpoint). See
    the module doc for the layout and rules."""

    def __init__(self, uri: str, cache_home: Path, settings: Settings,
                 multipart_threshold: int = DEFAULT_MULTIPART) -> None:
        super().__init__(cache_home)
        self.bucket, self.prefix = parse_s3_uri(uri)
        self.uri = f"s3://{self.bucket}/{self.prefix}"
        self.settings = settings
        self.multipart_threshold = max(multipart_threshold, MIN_PART)
        self._fs = None

    # --- plumbing -------------------------------------------------------------------------------
    @property
    def fs(self):  # noqa: ANN201 - s3fs.S3FileSystem, imported on first use
        if self._fs is None:
            self._fs = s3_filesystem(self.settings)
        return self._fs

    @property
    def where(self) -> str:
        return self.uri

    def _key(self, *parts: str) -> str:
        return "/".join((self.prefix, *parts))

    def artifact_uri(self, name: str, revision: str) -> str:
        return f"{self.uri}/{ARTIFACTS}/{name}/{revision}"

    def _manifest_key(self, name: str, revision: str) -> str:
        return self._key(ARTIFACTS, name, revision, MANIFEST)

    def _blob_key(self, sha: str) -> str:
        return self._key(BLOBS, sha)

    def _get(self, key: str) -> tuple[bytes, dict[str, Any]] | None:
        """One ``GetObject``: (body, response with ``ETag`` and ``Metadata``), None when the key is absent."""
        from fsspec.asyn import sync  # noqa: PLC0415 - heavy: fsspec (via s3fs), imported on first use

        fs = self.fs

        async def get() -> tuple[bytes, dict[str, Any]]:
            resp = await fs._call_s3("get_object", Bucket=self.bucket, Key=key)
            try:
                return await resp["Body"].read(), resp
            finally:
                resp["Body"].close()

        try:
            return sync(fs.loop, get)
        except FileNotFoundError:
            return None
        except Exception as exc:  # noqa: BLE001 - botocore/aiohttp raise many kinds
            raise s3_error(exc, f"reading {key}", self.uri) from exc

    def _read_manifest(self, name: str, revision: str) -> tuple[bytes, str, str] | None:
        """(manifest bytes, ETag, index sha256) of ``name@revision``, None when it is not published."""
        got = self._get(self._manifest_key(name, revision))
        if got is None:
            return None
        data, resp = got
        index = (resp.get("Metadata") or {}).get(INDEX_META, "")
        return data, resp.get("ETag", ""), index

    def _contents(self, name: str, revision: str, manifest_bytes: bytes, index_sha: str) -> BundleContents:
        """Every file of the artifact (manifest.json's and the index's), checked: safe names, the index
        bound to this manifest, the content digest matching the file list. Raises :class:`PublishError`."""
        where = self.artifact_uri(name, revision)
        got = self._get(self._blob_key(index_sha)) if len(index_sha) == 64 else None
        if got is None:
            raise PublishError(f"{where}: its manifest names no readable index (x-amz-meta-{INDEX_META} "
                               f"{index_sha or 'missing'})",
                               fix="The manifest was written by something other than modelyard: publish it again.")
        if hashlib.sha256(got[0]).hexdigest() != index_sha:
            raise HashMismatchError(f"{where}: the index blob {index_sha} does not have that sha256",
                                    fix="The bucket was tampered with: publish the artifact again from a trusted copy.")
        return check_index(where, manifest_bytes, got[0])

    def _exists(self, key: str, size: int) -> bool:
        try:
            head = self.fs.call_s3("head_object", Bucket=self.bucket, Key=key)
        except FileNotFoundError:
            return False
        except Exception as exc:  # noqa: BLE001
            raise s3_error(exc, f"reading {key}", self.uri) from exc
        return int(head.get("ContentLength", -1)) == size

    def _put_blob(self, f: LocalFile) -> bool:
        """Upload ``f`` as ``blobs/sha256/<sha>`` unless that blob is there; True when bytes were sent."""
        key = self._blob_key(f.sha256)
        if self._exists(key, f.size):
            return False
        try:
            if f.size <= self.multipart_threshold:
                with open(f.path, "rb") as fh:
                    data = fh.read(f.size + 1)
                put_bytes(self.fs, self.bucket, key, data, f.sha256, self.uri, f.rel)
            else:
                put_multipart(self.fs, self.bucket, key, f, self.multipart_threshold, self.uri)
        except OSError as exc:
            if isinstance(exc, PublishError):
                raise
            raise PublishError(f"cannot read {f.path}: {exc.strerror or exc}", fix="Check the artifact folder.") from exc
        return True

    def _put_index(self, meta: dict[str, Any]) -> str:
        data = dump_index(meta)
        sha = hashlib.sha256(data).hexdigest()
        key = self._blob_key(sha)
        if not self._exists(key, len(data)):
            put_bytes(self.fs, self.bucket, key, data, sha, self.uri, "index")
        return sha

    def _put_manifest(self, name: str, revision: str, data: bytes, index_sha: str, *, etag: str | None) -> None:
        """Write the manifest object: ``If-None-Match: *`` (``etag`` None) or ``If-Match: etag``. Raises
        :class:`_Lost` when the condition is false (another writer's manifest is there, or changed)."""
        cond = {"IfNoneMatch": "*"} if etag is None else {"IfMatch": etag}
        try:
            put_bytes(self.fs, self.bucket, self._manifest_key(name, revision), data, hashlib.sha256(data).hexdigest(),
                       self.uri, MANIFEST, Metadata={INDEX_META: index_sha}, **cond)
        except FileNotFoundError as exc:  # If-Match on a manifest that is gone: re-read and decide again
            raise _Lost() from exc
        except Exception as exc:  # noqa: BLE001
            if _precondition_failed(exc):
                raise _Lost() from exc
            raise s3_error(exc, f"writing {name}/{revision}/{MANIFEST}", self.uri) from exc

    def _upload(self, art: LocalArtifact, what: str) -> None:
        with progress.task(f"uploading {what} to {self.uri}", total=sum(f.size for f in art.files)) as adv:
            for f in art.files:
                self._put_blob(f)
                adv(f.size)

    # --- the store's methods ----------------------------------------------------------------------
    def load(self, name: str, revision: str) -> tuple[Artifact, Manifest] | None:
        """The published ``name@revision`` and its manifest (one ``GetObject``), or None. Raises
        :class:`StoreError` when the object there is not a manifest."""
        got = self._read_manifest(name, revision)
        if got is None:
            return None
        where = self.artifact_uri(name, revision)
        try:
            m = Manifest.from_bytes(got[0], f"{where}/{MANIFEST}")
        except ManifestError as exc:
            raise StoreError(exc.message, fix="Delete that object; only modelyard writes under artifacts/.") from exc
        return Artifact(name, revision, self.path_for(name, revision), m.content_digest, True, where), m

    def _cached(self, artifact: Artifact, manifest_bytes: bytes) -> bool:
        try:
            return (artifact.path / MANIFEST).read_bytes() == manifest_bytes
        except OSError:
            return False

    def read(self, artifact: Artifact, rel: str) -> bytes:
        """The bytes of ``rel`` in the published artifact, from the cache when it holds this very
        artifact, else from its blob (checked against its sha256). ``FileNotFoundError`` when the
        artifact does not list ``rel``."""
        got = self._read_manifest(artifact.name, artifact.revision)
        if got is None:
            raise FileNotFoundError(f"{artifact.location} is not published")
        if self._cached(artifact, got[0]):
            return (artifact.path / rel).read_bytes()
        if rel == MANIFEST:
            return got[0]
        exp = self._contents(artifact.name, artifact.revision, got[0], got[2]).files.get(rel)
        if exp is None:
            raise FileNotFoundError(f"{artifact.location} has no {rel}")
        blob = self._get(self._blob_key(exp.sha256))
        if blob is None or len(blob[0]) != exp.size or hashlib.sha256(blob[0]).hexdigest() != exp.sha256:
            raise HashMismatchError(f"{artifact.location}: {rel} (blob {exp.sha256}) is missing or differs from its sha256",
                                    fix="Publish the artifact again from a trusted copy.")
        return blob[0]

    def local(self, artifact: Artifact) -> Path:
        """The artifact in this worker's cache (``<MODELYARD_HOME>/<name>/<revision>``), downloaded first
        when the cache lacks it or holds another manifest: every file streamed into a private staging
        folder and checked against its size and sha256, then renamed into place (all or nothing).
        Raises :class:`StoreError` when it is not published, :class:`HashMismatchError` (exit 1) naming
        the file that differs."""
        name, revision = artifact.name, artifact.revision
        got = self._read_manifest(name, revision)
        if got is None:
            raise StoreError(f"the store {self.uri} holds no artifact {name}@{revision}",
                             fix="Check the name and revision with `modelyard list --store ...`.")
        manifest_bytes, _etag, index_sha = got
        final = self.path_for(name, revision)
        if self._cached(artifact, manifest_bytes):
            return final
        contents = self._contents(name, revision, manifest_bytes, index_sha)
        where = self.artifact_uri(name, revision)
        staged = self.new_staging()
        try:
            total = sum(e.size for e in contents.files.values())
            with Staging(staged / "artifact", total=total) as st, \
                    progress.task(f"downloading {where}", total=total) as adv:
                st.put(MANIFEST, manifest_bytes)
                for rel in sorted(contents.files):
                    exp = contents.files[rel]
                    st.write(rel, read_ranges(self.fs, f"{self.bucket}/{self._blob_key(exp.sha256)}", exp.size, rel, where, adv),
                             exp.size, exp.sha256, where)
                done = st.commit()
            return self._into_cache(done, name, revision, manifest_bytes)
        finally:
            shutil.rmtree(staged, ignore_errors=True)

    def _into_cache(self, folder: Path, name: str, revision: str, manifest_bytes: bytes) -> Path:
        """Rename ``folder`` (an artifact in this cache's staging) to ``<home>/<name>/<revision>``, moving a
        stale copy (another manifest) aside first. A concurrent process that placed the same manifest
        first wins; ``folder`` is then removed."""
        final = self.path_for(name, revision)
        try:
            final.parent.mkdir(parents=True, exist_ok=True)
            if final.exists() and (final / MANIFEST).is_file() and (final / MANIFEST).read_bytes() == manifest_bytes:
                shutil.rmtree(folder, ignore_errors=True)
                return final
            if final.exists():
                old = self.new_staging()
                os.rename(final, old / "stale")
                shutil.rmtree(old, ignore_errors=True)
            os.rename(folder, final)
        except OSError as exc:
            if (final / MANIFEST).is_file() and (final / MANIFEST).read_bytes() == manifest_bytes:
                shutil.rmtree(folder, ignore_errors=True)
                return final
            raise StoreError(f"cannot place {name}@{revision} in the local cache {self.home}: {exc.strerror or exc}",
                             fix="Check MODELYARD_HOME's permissions and free space.") from exc
        return final

    def publish(self, staged: Path, name: str, revision: str, content_digest: str) -> Artifact:
        """Upload the artifact folder ``staged`` (blobs, index, then the manifest with ``If-None-Match: *``)
        and keep it in the local cache. Another writer's manifest already there: its artifact when its
        content is ``content_digest`` (``reused``), else :class:`ArtifactConflictError` (exit 2); either
        way ``staged`` is removed. Raises :class:`PublishError` when S3 refuses,
        :class:`HashMismatchError` when a file differs from its recorded sha256."""
        art = read_artifact(staged)
        self._upload(art, f"{name}@{revision}")
        index_sha = self._put_index(art.index)
        try:
            self._put_manifest(name, revision, art.manifest_bytes, index_sha, etag=None)
        except _Lost:
            shutil.rmtree(staged, ignore_errors=True)
            found = self.load(name, revision)
            if found is None:
                raise StoreError(f"{self.artifact_uri(name, revision)} was there when publishing, then was not",
                                 fix="Someone deletes artifacts from the bucket; publish again.") from None
            same_content(found[0], content_digest)
            return found[0]
        path = self._into_cache(staged, name, revision, art.manifest_bytes)
        return Artifact(name, revision, path, content_digest, False, self.artifact_uri(name, revision))

    def promote(self, artifact: Path, name: str, revision: str, promotion: dict[str, Any]) -> Artifact:
        """Place the artifact folder ``artifact`` here with ``promotion`` in its manifest: blobs first, then
        the manifest by compare-and-swap (module doc), so concurrent promoters lose no promotion.
        Raises :class:`ArtifactConflictError` when other content is published under that name and
        revision, :class:`StoreError` when the manifest kept changing for :data:`_CAS_ATTEMPTS` rounds."""
        art = read_artifact(artifact)
        source = Manifest.from_bytes(art.manifest_bytes)
        uploaded = False
        for _ in range(_CAS_ATTEMPTS):
            got = self._read_manifest(name, revision)
            if got is None:
                if not uploaded:
                    self._upload(art, f"{name}@{revision}")
                    uploaded = True
                base, meta, etag = source, dict(art.index), None
            else:
                current_bytes, etag, index_sha = got
                base = Manifest.from_bytes(current_bytes)
                same_content(Artifact(name, revision, artifact, base.content_digest), source.content_digest,
                              f"the store {self.uri}")
                meta = dict(self._contents(name, revision, current_bytes, index_sha).meta)
            data = base.with_promotion(promotion).to_bytes()
            meta["manifest_sha256"] = hashlib.sha256(data).hexdigest()
            try:
                self._put_manifest(name, revision, data, self._put_index(meta), etag=etag)
            except _Lost:
                continue  # another promoter (or publisher) wrote it meanwhile: apply ours to theirs
            return Artifact(name, revision, self.path_for(name, revision), source.content_digest, False,
                            self.artifact_uri(name, revision))
        raise StoreError(f"{self.artifact_uri(name, revision)}/{MANIFEST} changed {_CAS_ATTEMPTS} times while promoting",
                         fix="Too many promoters at once: run the promotion again.")

    def _list_keys(self, prefix: str, delimiter: str | None = None) -> tuple[list[str], list[str]]:
        """(keys, common prefixes) under ``prefix``, all pages."""
        keys: list[str] = []
        prefixes: list[str] = []
        token = None
        try:
            while True:
                kw: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix}
                if delimiter:
                    kw["Delimiter"] = delimiter
                if token:
                    kw["ContinuationToken"] = token
                page = self.fs.call_s3("list_objects_v2", **kw)
                keys += [o["Key"] for o in page.get("Contents", [])]
                prefixes += [p["Prefix"] for p in page.get("CommonPrefixes", [])]
                token = page.get("NextContinuationToken")
                if not page.get("IsTruncated") or not token:
                    return keys, prefixes
        except Exception as exc:  # noqa: BLE001
            raise s3_error(exc, "listing the store", self.uri) from exc

    def revisions(self, name: str) -> list[str]:
        base = self._key(ARTIFACTS, name) + "/"
        _, prefixes = self._list_keys(base, "/")
        return sorted(p[len(base):].rstrip("/") for p in prefixes)

    def list(self) -> list[tuple[Artifact, Manifest]]:
        """Every published artifact: the manifests under ``artifacts/``, read concurrently."""
        base = self._key(ARTIFACTS) + "/"
        keys, _ = self._list_keys(base)
        keys = [k for k in keys if k.endswith("/" + MANIFEST) and k[len(base):].count("/") == 2]
        try:
            bodies = self.fs.cat([f"{self.bucket}/{k}" for k in keys], on_error="omit") if keys else {}
        except Exception as exc:  # noqa: BLE001
            raise s3_error(exc, "reading the manifests", self.uri) from exc
        out = []
        for k in keys:
            data = bodies.get(f"{self.bucket}/{k}")
            if data is None:
                continue
            name, revision, _ = k[len(base):].split("/")
            try:
                m = Manifest.from_bytes(data)
            except ManifestError:
                continue
            out.append((Artifact(name, revision, self.path_for(name, revision), m.content_digest, True,
                                 self.artifact_uri(name, revision)), m))
        return out
