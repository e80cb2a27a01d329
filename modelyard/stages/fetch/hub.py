"""``hf://`` from an HF-compatible endpoint: each byte hashed as it arrives, and the model judged from
its small files and safetensors headers before a weight byte is downloaded.

1. **List.** The revision is resolved to a commit once (``HfApi.model_info``); ``list_repo_tree`` at
   that commit gives each file's size and the digest the hub vouches for: the LFS sha256, or the git
   blob id of a file kept in git. A digest that is not one (asterisks, empty or missing: what a gated
   repo may answer) makes the file *unverifiable*: it is hashed, never compared, and its manifest
   origin is ``unverified``, never ``hub-*``.
2. **Small files first.** Every selected file that is not a ``*.safetensors`` shard is downloaded (see 4).
3. **Headers by range.** Each shard's header is read with HTTP range requests (bytes 0-7, the header
   length, then the JSON header; a server that ignores ``Range`` and answers the whole file is read
   only that far). ``before_weights(snapshot)`` is then called with a Snapshot of a temporary folder
   that holds the small files and, per shard, a sparse file of the shard's size holding its header. The checks read nothing of
   a shard but its header (:mod:`modelyard.model.checkpoint`), so they judge that folder as they will
   judge the downloaded one; a broken repo fails there, before any weight byte is fetched.
4. **Download, hashing the stream.** A file not yet in the hub cache (``<home>/.cache/hf``,
   huggingface_hub's layout: ``blobs/<etag>``, ``snapshots/<commit>/<path>`` links) is downloaded
   with ``huggingface_hub.file_download.http_get`` (its retries, resume and errors) into a
   :class:`~modelyard.model.digest.DigestWriter`, which hashes every chunk as it is written; the
   digests are compared with the hub's before the file is renamed into ``blobs/``, so a corrupt
   download never enters the cache, and the hash stage does not read the file again. Files already
   in the cache are hashed from disk by the hash stage, as before. The file's URL, metadata (etag,
   size, location), auth headers and HTTP errors are huggingface_hub's (``hf_hub_url``,
   ``get_hf_file_metadata``, ``build_hf_headers``, ``hf_raise_for_status``). Downloads always go over
   HTTP, also for repos stored with Xet (the hub serves them over HTTP too): the bytes must pass
   through modelyard to be hashed once.

5. **Resume.** A download killed or broken off leaves ``blobs/<etag>.incomplete`` (:func:`~modelyard.stages.fetch.ranges.partial_path`). The
   next fetch hashes what it holds and asks only for the rest (``Range: bytes=<n>-``, http_get's
   ``resume_size``); a server that ignores ``Range`` answers 200 and the digests restart at byte 0. The
   sha256 of the whole file is compared with the hub's either way; when it differs after a resume, the
   partial file was not the file's start (a disk error, another file's bytes), and the file is downloaded
   afresh once before the hub is blamed.

Same locks as huggingface_hub (``.locks/<repo folder>/<etag>.lock``), so it shares the cache with
``hf_hub_download``; :func:`~modelyard.stages.fetch.sweep_incomplete` clears the process-unique
``<etag>.<8 hex>.incomplete`` files that huggingface_hub 1.x itself leaves and never resumes.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from modelyard import progress
from modelyard.errors import EndpointUnreachableError, ModelyardError, SourceNotFoundError, StoreError
from modelyard.model.digest import DigestWriter, FileDigest, differences, git_blob_id, mismatch_error
from modelyard.model.snapshot import FileEntry, Snapshot
from modelyard.model.source import Source
from modelyard.settings import Settings
from modelyard.stages.fetch.preflight import CARD_FILE, CARD_MAX_BYTES, BeforeWeights, Need, card_license, require_space
from modelyard.stages.fetch.ranges import header_prefix, partial_path, ranged_get, skeleton, url_to_path

_SHA256 = re.compile(r"[0-9a-f]{64}")
_SHA1 = re.compile(r"[0-9a-f]{40}")
#: parallel HEAD, range and download requests (huggingface_hub's snapshot_download uses 8)
WORKERS = 8
#: a file not in the cache yet: ``(etag, download URL, request headers)``
Located = tuple[str, str, dict[str, str]]


def is_weight(path: str) -> bool:
    """Whether ``path`` is a weight shard, downloaded only after the pre-download verify: ``*.safetensors``."""
    return path.endswith(".safetensors")


@dataclass(frozen=True)
class HubFile:
    """One file as the hub's tree lists it at the commit: ``size`` in bytes (the LFS object's for an LFS
    file); ``sha256`` the LFS sha256 and ``git_oid`` the git blob id of a non-LFS file, each None when
    the hub gave none it vouches for (then ``unverifiable``)."""

    path: str
    size: int
    lfs: bool
    sha256: str | None
    git_oid: str | None

    @property
    def unverifiable(self) -> bool:
        return (self.sha256 if self.lfs else self.git_oid) is None

    def entry(self) -> FileEntry:
        return FileEntry(path=self.path, size=self.size, expected_sha256=self.sha256, expected_git_oid=self.git_oid,
                         expected_size=self.size, unverifiable=self.unverifiable)


def hub_file(e: Any) -> HubFile:
    """A :class:`HubFile` from a ``huggingface_hub.hf_api.RepoFile``: an LFS oid that is not 64 hex
    digits, or a git oid that is not 40, is no digest (redacted with asterisks, empty or null)."""
    lfs = e.lfs
    if lfs is not None:
        sha = lfs.sha256 if isinstance(lfs.sha256, str) and _SHA256.fullmatch(lfs.sha256) else None
        return HubFile(e.path, int(lfs.size), True, sha, None)
    oid = e.blob_id if isinstance(e.blob_id, str) and _SHA1.fullmatch(e.blob_id) else None
    return HubFile(e.path, int(e.size), False, None, oid)


@contextlib.contextmanager
def hub_errors(repo: str, rev: str, where: str, *, token: bool = True) -> Iterator[None]:
    """Turn huggingface_hub and httpx errors into modelyard's (``token``: whether a token was sent): a gated
    repo the token has no access to (or that needs one), a
    missing revision, a missing repo (or one the token cannot see) are :class:`SourceNotFoundError`, each
    with its own message (huggingface_hub's ``GatedRepoError``, ``RevisionNotFoundError``,
    ``RepositoryNotFoundError``, from the Hub's ``X-Error-Code``), never retried; no connection, or an HTTP error status, is
    :class:`EndpointUnreachableError` (both exit 2; the ingest flow retries the latter)."""
    import httpx  # noqa: PLC0415 - heavy: httpx, imported on first use
    from huggingface_hub.errors import (  # noqa: PLC0415 - heavy: huggingface_hub, imported on first use
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        yield
    except GatedRepoError as exc:  # before RepositoryNotFoundError, its base class
        who = "this token has no access to it" if token else "no token was sent (MODELYARD_HF_TOKEN / HF_TOKEN unset)"
        raise SourceNotFoundError(f"repository {repo} on {where} is gated and {who}",
                                  fix=f"Accept its conditions on the repo's page ({where.rstrip('/')}/{repo}) with your "
                                      "account, then set MODELYARD_HF_TOKEN to a token of that account.") from exc
    except RevisionNotFoundError as exc:
        raise SourceNotFoundError(f"repository {repo} on {where} has no revision {rev!r}",
                                  fix="Use a branch, tag or commit the repo has (e.g. @main).") from exc
    except RepositoryNotFoundError as exc:
        raise SourceNotFoundError(f"repository {repo} at revision {rev!r} was not found on {where} (or needs a token)",
                                  fix="Check the repo id and revision, and set MODELYARD_HF_TOKEN for private repos.") from exc
    except (httpx.TransportError, LocalEntryNotFoundError, ConnectionError) as exc:
        raise EndpointUnreachableError(f"cannot reach the hub endpoint {where} ({type(exc).__name__})",
                                       fix="Check HF_ENDPOINT / MODELYARD_HF_ENDPOINT and the network.") from exc
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else "?"
        raise EndpointUnreachableError(f"hub endpoint {where} answered HTTP {status} for {repo}@{rev}",
                                       fix="Retry later, or check the endpoint and token.") from exc


class HubSession:
    """One fetch of ``repo`` at ``commit`` into the hub cache ``cache_dir`` (huggingface_hub's layout)."""

    def __init__(self, settings: Settings, source: Source, where: str) -> None:
        from huggingface_hub.file_download import repo_folder_name  # noqa: PLC0415 - heavy: huggingface_hub, imported on first use

        assert source.repo_id is not None and source.revision is not None
        self.source = source
        self.repo, self.rev = source.repo_id, source.revision
        self.endpoint = settings.endpoint()
        self.token = settings.token() or False
        self.where = where
        self.cache_dir = settings.cache_dir() / "hf"
        folder = repo_folder_name(repo_id=self.repo, repo_type="model")
        self.storage = self.cache_dir / folder
        self.locks = self.cache_dir / ".locks" / folder
        self.commit: str | None = None
        self._blob: dict[str, Path] = {}  # path -> blob in the cache (already there, or downloaded now)
        self._digest: dict[str, FileDigest] = {}  # path -> digests of the bytes received now
        self._resumed: dict[str, int] = {}  # path -> bytes taken from a killed run's partial file (Range start)

    def resolve(self) -> list[HubFile]:
        """Resolve the revision to a commit and list every file of the repo there."""
        from huggingface_hub import HfApi  # noqa: PLC0415 - heavy: huggingface_hub, imported on first use

        api = HfApi(endpoint=self.endpoint, token=self.token)
        self.commit = api.model_info(self.repo, revision=self.rev).sha
        if self.commit is None:
            raise SourceNotFoundError(f"{self.where} did not resolve {self.repo}@{self.rev} to a commit")
        return [hub_file(e) for e in api.list_repo_tree(self.repo, revision=self.commit, recursive=True)
                if hasattr(e, "blob_id") and hasattr(e, "lfs")]

    def _pointer(self, path: str) -> Path:
        assert self.commit is not None
        return self.storage / "snapshots" / self.commit / path

    def _meta(self, path: str) -> tuple[str, str, dict[str, str]]:
        """``(etag, download URL, request headers)`` from a HEAD on the file's resolve URL. Authorization
        is kept only when the file is served from the endpoint's own host (not a signed CDN URL)."""
        from huggingface_hub import get_hf_file_metadata, hf_hub_url  # noqa: PLC0415 - heavy: huggingface_hub, imported on first use
        from huggingface_hub.utils import build_hf_headers  # noqa: PLC0415 - heavy: huggingface_hub, imported on first use

        url = hf_hub_url(self.repo, path, revision=self.commit, endpoint=self.endpoint)
        meta = get_hf_file_metadata(url, token=self.token, endpoint=self.endpoint)
        if not meta.etag:
            raise EndpointUnreachableError(f"hub endpoint {self.where} gave no ETag for {path} of {self.repo}@{self.commit}",
                                           fix="Check that HF_ENDPOINT points at a Hugging Face-compatible hub.")
        headers = build_hf_headers(token=self.token)
        if urlparse(meta.location).netloc != urlparse(url).netloc:
            headers.pop("authorization", None)
        return meta.etag, meta.location, headers

    def _user_copy(self, f: HubFile) -> Located | None:
        """``(etag, file:// URL of the blob, {})`` when the user's own huggingface_hub cache (``HF_HUB_CACHE``,
        else ``HF_HOME/hub``, else ``~/.cache/huggingface/hub``, as huggingface_hub resolves it) holds ``f`` at
        this commit with the hub's size: :meth:`download` then copies it from there, hashing it on the way, and
        nothing is downloaded. The user's cache is only read."""
        from huggingface_hub import constants  # noqa: PLC0415 - heavy: huggingface_hub, imported on first use

        user = Path(constants.HF_HUB_CACHE).expanduser()
        if user.resolve() == self.cache_dir.resolve():
            return None
        pointer = user / self.storage.name / "snapshots" / str(self.commit) / f.path
        try:
            blob = pointer.resolve(strict=True)
            if not blob.is_file() or blob.stat().st_size != f.size:
                return None
        except OSError:
            return None
        return blob.name, blob.as_uri(), {}

    def locate(self, f: HubFile) -> Located | None:
        """None when ``f`` is in the cache already (its blob is remembered, its pointer made); else
        ``(etag, download URL, headers)``: a ``file://`` URL when the user's own hub cache has it
        (:meth:`_user_copy`), else from a HEAD request."""
        pointer = self._pointer(f.path)
        if pointer.exists():
            self._blob[f.path] = pointer.resolve()
            return None
        found = self._user_copy(f)
        if found is not None:
            blob = self.storage / "blobs" / found[0]
            if blob.exists():
                self._blob[f.path] = blob
                self._link(pointer, blob)
                return None
            return found
        etag, url, headers = self._meta(f.path)
        blob = self.storage / "blobs" / etag
        if blob.exists():
            self._blob[f.path] = blob
            self._link(pointer, blob)
            return None
        return etag, url, headers

    def download(self, f: HubFile, located: Located, advance: Callable[[int], None]) -> None:
        """Download ``f`` into ``blobs/<etag>`` (under huggingface_hub's per-blob lock), hashing the bytes
        as they are written, and link it from the snapshot. A partial file a killed run left is resumed with a
        ``Range`` request; when the whole then differs from the hub's digest, the partial file was not the
        file's start and the file is downloaded afresh, once. Raises :class:`HashMismatchError` (exit 1, the
        partial file removed) when what arrived from the hub alone differs from its size or digest,
        :class:`StoreError` when the cache cannot be written."""
        from huggingface_hub.utils import WeakFileLock  # noqa: PLC0415 - heavy: huggingface_hub, imported on first use

        etag, url, headers = located
        blob = self.storage / "blobs" / etag
        tmp = partial_path(blob)
        try:
            blob.parent.mkdir(parents=True, exist_ok=True)
            self.locks.mkdir(parents=True, exist_ok=True)
            with WeakFileLock(str(self.locks / f"{etag}.lock")):
                if not blob.exists():  # else another process downloaded it meanwhile
                    if tmp.exists() and tmp.stat().st_size > f.size:
                        tmp.unlink()  # longer than the file: not a prefix of it
                    resumed, got = self._receive(f, tmp, url, headers, advance)
                    problems = differences(f.entry(), got)
                    if problems and resumed:
                        # the partial file a killed run left was not the file's start (a disk error, another
                        # file's bytes): the hub is not to blame yet. Once, the whole file is downloaded afresh.
                        tmp.unlink(missing_ok=True)
                        with progress.task(f"downloading {f.path} afresh: the partial file {tmp.name} was not "
                                           "its start", total=f.size) as again:
                            resumed, got = self._receive(f, tmp, url, headers, again)
                        problems = differences(f.entry(), got)
                    if problems:
                        tmp.unlink(missing_ok=True)
                        raise mismatch_error(f"hf://{self.repo}@{self.commit}", problems,
                                             fix="The hub (or a proxy in between) served other bytes than it lists; "
                                                 "nothing was cached. Retry; if it persists, report it to the repo's owner.")
                    os.replace(tmp, blob)
                    self._digest[f.path] = got
                    self._resumed[f.path] = resumed
                self._link(self._pointer(f.path), blob)
        except ModelyardError:
            raise
        except OSError as exc:
            if exc.errno is None:  # http_get's "Consistency check failed": the connection broke off
                raise EndpointUnreachableError(f"the download of {f.path} from {self.where} broke off ({exc})",
                                               fix="Retry; check the network and the endpoint.") from exc
            raise StoreError(f"cannot write {blob}: {exc.strerror}", fix="Free disk space under MODELYARD_HOME.") from exc
        self._blob[f.path] = blob

    @staticmethod
    def _receive(f: HubFile, tmp: Path, url: str, headers: dict[str, str],
                 advance: Callable[[int], None]) -> tuple[int, FileDigest]:
        """Receive ``f`` into ``tmp``, resuming after the bytes it already holds (hashed first): ``(bytes
        resumed, the whole file's digests)``. ``url`` is the hub's (HTTP, a ``Range`` request past the resumed
        bytes) or the user's own hub cache (``file://``, copied)."""
        from huggingface_hub.file_download import http_get  # noqa: PLC0415 - heavy: huggingface_hub, imported on first use
        from huggingface_hub.utils import silent_tqdm  # noqa: PLC0415 - heavy: huggingface_hub, imported on first use

        with open(tmp, "r+b" if tmp.exists() else "x+b") as fh:
            w = DigestWriter(fh, git_size=None if f.lfs else f.size, advance=advance)
            resumed = w.absorb()  # the digests of what a killed run received, from the partial file
            if url.startswith("file://"):  # the user's own hub cache: copied, hashed on the way
                with open(url_to_path(url), "rb") as src:
                    src.seek(resumed)
                    shutil.copyfileobj(src, w, 8 << 20)
            else:  # http_get annotates temp_file as BinaryIO; it calls write, tell, seek and truncate
                http_get(url, w, resume_size=resumed, expected_size=f.size, headers=headers,  # type: ignore[arg-type]
                         displayed_filename=f.path, tqdm_class=silent_tqdm)
        return resumed, w.digest()

    def _link(self, pointer: Path, blob: Path) -> None:
        """``snapshots/<commit>/<path>`` -> ``../../blobs/<etag>`` (relative, as huggingface_hub makes it)."""
        if pointer.is_symlink() or pointer.exists():
            return
        pointer.parent.mkdir(parents=True, exist_ok=True)
        tmp = pointer.with_name(f".{pointer.name}.{uuid.uuid4().hex[:8]}.tmp")
        os.symlink(os.path.relpath(blob, pointer.parent), tmp)
        os.replace(tmp, pointer)

    def header(self, f: HubFile, located: Located | None) -> bytes:
        """The first ``8 + header length`` bytes of shard ``f``: from its cached blob, else by HTTP range."""
        if located is None:
            with open(self._blob[f.path], "rb") as fh:
                return header_prefix(lambda a, b: os.pread(fh.fileno(), b - a, a), f.size)
        _, url, headers = located
        if url.startswith("file://"):
            with open(url_to_path(url), "rb") as fh:
                return header_prefix(lambda a, b: os.pread(fh.fileno(), b - a, a), f.size)
        return header_prefix(lambda a, b: ranged_get(url, headers, a, b), f.size)

    def card(self, tree: Sequence[HubFile]) -> dict[str, str]:
        """The license fields of the repo's model card at the commit (:func:`~.preflight.card_license`): its
        first :data:`~.preflight.CARD_MAX_BYTES` read from the cache (or the user's own hub cache), else with one ranged GET, and not stored
        (no runtime reads it). A card read whole must be the git blob the tree lists; one that is not gives
        no license. Empty without a card."""
        f = next((f for f in tree if f.path == CARD_FILE), None)
        if f is None:
            return {}
        pointer = self._pointer(f.path)
        mine = self._user_copy(f)  # the user's own hub cache holds it: read there, nothing asked of the hub
        local = pointer if pointer.exists() else url_to_path(mine[1]) if mine is not None else None
        if local is not None:
            with open(local, "rb") as fh:
                data = fh.read(CARD_MAX_BYTES)
        else:
            _, url, headers = self._meta(f.path)
            data = ranged_get(url, headers, 0, min(f.size, CARD_MAX_BYTES)) if f.size else b""
        if len(data) == f.size and not f.lfs and f.git_oid and git_blob_id(data) != f.git_oid:
            return {}
        return card_license(data.decode("utf-8", "replace"))

    def entries(self, selected: Sequence[HubFile]) -> tuple[FileEntry, ...]:
        """The snapshot entries: sizes on disk; a file downloaded now carries the sha256 of the bytes received."""
        out = []
        for f in selected:
            d = self._digest.get(f.path)
            size = d.size if d is not None else self._pointer(f.path).stat().st_size
            out.append(replace(f.entry(), size=size, sha256=d.sha256 if d else None, received=d is not None))
        return tuple(out)


def fetch_hub(source: Source, settings: Settings, where: str, select: Callable[[list[str]], list[str]],
              require: Callable[[str, list[str], list[str]], None],
              before_weights: BeforeWeights | None = None, *, weights: bool = True) -> Snapshot:
    """Fetch ``source`` (``hf://``) into the hub cache, as the module doc says; returns its Snapshot.

    ``select(paths)`` picks the files to fetch (the allow/ignore patterns), ``require(where, selected,
    everything)`` raises when they cannot be a model. ``before_weights(snapshot)`` is called with a
    Snapshot whose root is a temporary folder holding the small files and each shard's header (a
    sparse file of the shard's size), before any shard byte is downloaded; what it raises stops the
    fetch. With ``weights=False`` the fetch ends there (nothing of a shard but its header is fetched).
    Raises :class:`SourceNotFoundError` / :class:`EndpointUnreachableError` (exit 2),
    :class:`HashMismatchError` (exit 1) when bytes received differ from the hub's listing."""
    hub = HubSession(settings, source, where)
    with hub_errors(hub.repo, hub.rev, where, token=bool(hub.token)):
        tree = hub.resolve()
        everything = [f.path for f in tree]
        chosen = set(select(everything))
        selected = sorted((f for f in tree if f.path in chosen), key=lambda f: f.path)
        require(f"hf://{hub.repo}@{hub.commit}", [f.path for f in selected], everything)
        small = [f for f in selected if not is_weight(f.path)]
        shards = [f for f in selected if is_weight(f.path)]
        provenance: dict[str, Any] = {"endpoint": where, **hub.card(tree)}
        with ThreadPoolExecutor(max_workers=WORKERS) as pool:
            located = dict(zip([f.path for f in selected], pool.map(hub.locate, selected)))
            _download(hub, pool, [f for f in small if located[f.path] is not None], located, "downloading config and tokenizer")
            needs: Sequence[Need] = ()
            if before_weights is not None:
                heads = dict(zip([f.path for f in shards], pool.map(lambda f: hub.header(f, located[f.path]), shards)))
                needs = _before(hub, settings, source, small, shards, heads, before_weights, provenance) or ()
            if weights:
                pending = [f for f in shards if located[f.path] is not None]
                require_space([(hub.storage / "blobs", sum(f.size - _partial_bytes(hub, f, located[f.path]) for f in pending),
                                f"downloading {len(pending)} weight file(s) of {hub.repo}"), *needs])
                _download(hub, pool, pending, located, "downloading weights")
    if not weights:
        selected = small
    return Snapshot(root=hub.storage / "snapshots" / str(hub.commit), source=source.uri, kind="hf",
                    files=hub.entries(selected), repo_id=hub.repo, revision=hub.rev, commit=hub.commit,
                    provenance=provenance, left_out=tuple(sorted(p for p in everything if p not in chosen)))


def _partial_bytes(hub: HubSession, f: HubFile, located: Located | None) -> int:
    """Bytes of ``f`` a killed run already left in ``blobs/<etag>.incomplete`` (resumed, not downloaded again)."""
    if located is None:
        return 0
    try:
        return min(partial_path(hub.storage / "blobs" / located[0]).stat().st_size, f.size)
    except OSError:
        return 0


def _download(hub: HubSession, pool: ThreadPoolExecutor, files: list[HubFile], located: dict[str, Located | None],
              what: str) -> None:
    if not files:
        return
    with progress.task(what, total=sum(f.size for f in files)) as adv:
        for fut in [pool.submit(hub.download, f, loc, adv) for f in files if (loc := located[f.path]) is not None]:
            fut.result()


def _before(hub: HubSession, settings: Settings, source: Source, small: list[HubFile], shards: list[HubFile],
            heads: dict[str, bytes], before_weights: BeforeWeights, provenance: dict[str, Any]) -> Sequence[Need] | None:
    """Build the header-only folder in the cache, call ``before_weights`` on it (its provenance: the fetch's,
    the card's license included, plus ``headers_only``), remove it."""
    base = settings.cache_dir() / "preverify"
    base.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=f"{hub.repo.replace('/', '--')}-", dir=base))
    try:
        skeleton(folder, {f.path: hub._blob[f.path] for f in small}, heads, {f.path: f.size for f in shards})
        files = tuple(f.entry() for f in [*small, *shards])
        return before_weights(Snapshot(root=folder, source=source.uri, kind="hf", files=files, repo_id=hub.repo,
                                revision=hub.rev, commit=hub.commit, provenance={**provenance, "headers_only": True}))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
