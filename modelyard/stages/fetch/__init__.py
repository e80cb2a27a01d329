"""fetch: turn a :class:`~modelyard.model.source.Source` into a local :class:`Snapshot`.

- ``hf://``: the revision is resolved to a commit sha once (``HfApi.model_info``), the file list
  with LFS sha256 / git blob ids comes from ``list_repo_tree`` at that sha, and the files are
  downloaded with ``huggingface_hub.snapshot_download`` (resumable, into ``<home>/.cache/hf``).
- ``file://``: the folder itself, read-only; nothing is copied here.
- ``gguf://``: dequantized to a bf16 safetensors checkpoint by :mod:`modelyard.stages.fetch.gguf`.
- ``tar://``: a bundle (``modelyard bundle``), verified and extracted once into
  ``<home>/.cache/bundles/<content digest>/``; the expected sizes and sha256 come from its manifest.

Default allow patterns: safetensors, their index, json, tokenizer files, ``*.jinja``,
``*.txt``, ``*.md``. Pickle formats and ``*.gguf`` are not fetched unless asked.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Sequence
from pathlib import Path

from filelock import FileLock, Timeout

from modelyard import progress
from modelyard.artifact.layout import MANIFEST
from modelyard.artifact.manifest import Manifest
from modelyard.errors import (
    BundleError,
    EndpointUnreachableError,
    InvalidSourceError,
    MissingConfigError,
    SourceNotFoundError,
    UnsupportedWeightsError,
)
from modelyard.model.checkpoint import PICKLE_SUFFIXES
from modelyard.model.snapshot import FileEntry, Snapshot
from modelyard.model.source import Source
from modelyard.settings import Settings
from modelyard.stages.fetch.gguf import fetch_gguf
from modelyard.transport.unbundle import read_manifest, unbundle

DEFAULT_ALLOW_PATTERNS: tuple[str, ...] = (
    "*.safetensors", "*.safetensors.index.json", "*.json", "tokenizer.model", "*.tiktoken",
    "*.jinja", "*.txt", "*.md",
)
DEFAULT_IGNORE_PATTERNS: tuple[str, ...] = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.gguf", ".git/*", "*.incomplete")


def _filter(paths: Sequence[str], allow: Sequence[str] | None, ignore: Sequence[str] | None) -> list[str]:
    from huggingface_hub.utils import filter_repo_objects  # noqa: PLC0415 - heavy: huggingface_hub, imported on first use

    return sorted(filter_repo_objects(list(paths), allow_patterns=list(allow) if allow else None,
                                      ignore_patterns=list(ignore) if ignore else None))


def _require_model_files(where: str, selected: Sequence[str], everything: Sequence[str]) -> None:
    """Raise the input errors (bad repo id, revision or patterns) before any byte is downloaded."""
    if "config.json" not in selected:
        raise MissingConfigError(f"{where} has no config.json", fix="Point SOURCE at a transformers model folder (with config.json).")
    if not any(p.endswith(".safetensors") for p in selected):
        pickles = [p for p in everything if p.endswith(PICKLE_SUFFIXES)]
        if pickles:
            raise UnsupportedWeightsError(
                f"{where} has only pickle weights ({', '.join(pickles[:3])}); modelyard never unpickles",
                fix="Convert them to safetensors in a sandbox (transformers save_pretrained) and ingest that.")
        raise UnsupportedWeightsError(f"{where} has no *.safetensors weights", fix="Publish the weights as safetensors.")


def fetch(source: Source, settings: Settings, *, allow_patterns: Sequence[str] | None = None,
          ignore_patterns: Sequence[str] | None = None) -> Snapshot:
    """Fetch ``source``; returns a Snapshot whose ``files`` carry sizes and expected digests
    (``sha256`` is filled later by :func:`modelyard.model.digest.hash_snapshot`).

    Raises :class:`SourceNotFoundError`, :class:`MissingConfigError`, :class:`UnsupportedWeightsError`,
    :class:`EndpointUnreachableError`, :class:`InvalidSourceError` (all exit code 2).
    """
    allow = DEFAULT_ALLOW_PATTERNS if allow_patterns is None else tuple(allow_patterns)
    ignore = DEFAULT_IGNORE_PATTERNS if ignore_patterns is None else tuple(ignore_patterns)
    if source.kind == "file":
        return _fetch_folder(source, allow, ignore)
    if source.kind == "gguf":

        return fetch_gguf(source, settings)
    if source.kind == "hf":
        return _fetch_hf(source, settings, allow, ignore)
    if source.kind == "tar":
        return _fetch_bundle(source, settings)
    raise InvalidSourceError(f"no fetcher for source kind {source.kind!r}")


def snapshot_present(snapshot: Snapshot) -> bool:
    """True when every file of ``snapshot`` is still on disk under its root with its size in bytes
    (what a cached fetch result promises; the hash stage then checks every digest). False when the
    hub cache was pruned since, e.g. by ``hf cache delete``: the fetch must run again."""
    for f in snapshot.files:
        try:
            if (snapshot.root / f.path).stat().st_size != (f.expected_size if f.expected_size is not None else f.size):
                return False
        except OSError:
            return False
    return True


def check_folder(root: Path) -> None:
    """Raise :class:`SourceNotFoundError` / :class:`InvalidSourceError` (exit 2) when the ``file://``
    source ``root`` is missing or not a folder; the CLI calls it before Prefect starts."""
    if not root.exists():
        raise SourceNotFoundError(f"source folder {root} does not exist", fix="Check the path (file:///absolute/path).")
    if not root.is_dir():
        raise InvalidSourceError(f"source {root} is not a folder", fix="Use gguf:// for a .gguf file, or point at the model folder.")


def _fetch_folder(source: Source, allow: Sequence[str], ignore: Sequence[str]) -> Snapshot:
    root = source.path
    assert root is not None
    check_folder(root)
    everything = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for f in filenames:
            everything.append(Path(dirpath, f).relative_to(root).as_posix())
    selected = _filter(everything, allow, ignore)
    special = [p for p in selected if not (root / p).is_file()]
    if special:
        raise InvalidSourceError(f"{root}: {', '.join(special[:5])} is not a regular file (a FIFO, socket or device)",
                                 fix="Replace it with the real file or remove it; modelyard reads regular files only.")
    _require_model_files(f"folder {root}", selected, everything)
    files = tuple(FileEntry(path=p, size=(root / p).stat().st_size) for p in selected)
    return Snapshot(root=root, source=source.uri, kind="file", files=files)


def sweep_incomplete(cache_dir: Path, repo_id: str) -> int:
    """Remove the partial downloads that killed runs left in the hub cache; returns how many.

    huggingface_hub 1.x downloads each blob into a process-unique ``<etag>.<8 hex>.incomplete``
    (huggingface_hub PR 4228) and never resumes or removes another process's file, so a SIGKILLed
    download leaves one behind for good. A file is removed only while its blob lock
    (``<cache>/.locks/<repo folder>/<etag>.lock``, the lock huggingface_hub holds while downloading)
    can be taken at once: a download in progress elsewhere keeps its file."""
    from huggingface_hub.file_download import repo_folder_name  # noqa: PLC0415 - heavy: huggingface_hub, imported on first use

    folder = repo_folder_name(repo_id=repo_id, repo_type="model")
    removed = 0
    for f in (cache_dir / folder / "blobs").glob("*.incomplete"):
        lock = FileLock(str(cache_dir / ".locks" / folder / f"{f.name.split('.')[0]}.lock"), timeout=0)
        try:
            with lock:
                f.unlink(missing_ok=True)
                removed += 1
        except (Timeout, OSError):
            continue
    return removed


class _HubProgress:
    """A tqdm-compatible class for ``snapshot_download(tqdm_class=...)`` that feeds our reporter."""

    def __new__(cls, *args, **kwargs):  # noqa: ANN002, ANN003, ANN204
        import tqdm  # noqa: PLC0415 - heavy: tqdm, imported on first use


        class _T(tqdm.tqdm):
            def __init__(self, *a, **kw):  # noqa: ANN002, ANN003
                kw.pop("name", None)
                kw["file"] = open(os.devnull, "w")  # noqa: SIM115 - closed in close()
                super().__init__(*a, **kw)
                self._cm = progress.task(kw.get("desc") or "downloading", total=kw.get("total"), unit="files")
                self._adv = self._cm.__enter__()

            def update(self, n=1):  # noqa: ANN001, ANN202
                self._adv(n or 0)
                return super().update(n)

            def close(self):  # noqa: ANN202
                if getattr(self, "_cm", None) is not None:
                    self._cm.__exit__(None, None, None)
                    self._cm = None
                fp = self.fp
                super().close()
                fp.close()

        return _T(*args, **kwargs)


def _fetch_hf(source: Source, settings: Settings, allow: Sequence[str], ignore: Sequence[str]) -> Snapshot:
    import httpx  # noqa: PLC0415 - heavy: httpx, imported on first use
    from huggingface_hub import HfApi, snapshot_download  # noqa: PLC0415 - heavy: huggingface_hub, imported on first use
    from huggingface_hub.errors import (  # noqa: PLC0415 - heavy: huggingface_hub, imported on first use
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    endpoint = settings.endpoint()
    token = settings.token()
    where = endpoint or "https://huggingface.co"
    repo, rev = source.repo_id, source.revision
    assert repo is not None and rev is not None
    if hub_offline():
        return _fetch_hf_cached(source, settings, allow, ignore, where)
    api = HfApi(endpoint=endpoint, token=token or False)
    try:
        info = api.model_info(repo, revision=rev)
        commit = info.sha
        tree = [e for e in api.list_repo_tree(repo, revision=commit, recursive=True) if hasattr(e, "blob_id") and hasattr(e, "lfs")]
        everything = [e.path for e in tree]
        selected = _filter(everything, allow, ignore)
        _require_model_files(f"hf://{repo}@{commit}", selected, everything)
        local = snapshot_download(repo, revision=commit, cache_dir=str(settings.cache_dir() / "hf"),
                                  allow_patterns=selected, endpoint=endpoint, token=token or False,
                                  tqdm_class=_HubProgress)  # type: ignore[arg-type]
        sweep_incomplete(settings.cache_dir() / "hf", repo)
        if commit and rev != commit:
            _record_ref(settings.cache_dir() / "hf", repo, rev, commit)
    except (RevisionNotFoundError, RepositoryNotFoundError, GatedRepoError) as exc:
        raise SourceNotFoundError(f"repository {repo} at revision {rev!r} was not found on {where} (or needs a token)",
                                  fix="Check the repo id and revision, and set MODELYARD_HF_TOKEN for private repos.") from exc
    except (httpx.TransportError, LocalEntryNotFoundError, ConnectionError) as exc:
        raise EndpointUnreachableError(f"cannot reach the hub endpoint {where} ({type(exc).__name__})",
                                       fix="Check HF_ENDPOINT / MODELYARD_HF_ENDPOINT and the network.") from exc
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else "?"
        raise EndpointUnreachableError(f"hub endpoint {where} answered HTTP {status} for {repo}@{rev}",
                                       fix="Retry later, or check the endpoint and token.") from exc
    if commit is None:
        raise SourceNotFoundError(f"{where} did not resolve {repo}@{rev} to a commit")
    by_path = {e.path: e for e in tree}
    files = []
    for p in selected:
        e = by_path[p]
        lfs = e.lfs
        files.append(FileEntry(
            path=p,
            size=Path(local, p).stat().st_size,
            expected_sha256=lfs.sha256 if lfs else None,
            expected_git_oid=None if lfs else e.blob_id,
            expected_size=lfs.size if lfs else e.size,
        ))
    return Snapshot(root=Path(local), source=source.uri, kind="hf", files=tuple(files), repo_id=repo,
                    revision=rev, commit=commit, provenance={"endpoint": where})


def _record_ref(cache_dir: Path, repo_id: str, revision: str, commit: str) -> None:
    """Write ``refs/<revision>`` = ``commit`` in the hub cache, as huggingface_hub does when it
    downloads a branch or tag itself (modelyard downloads by commit), so that an offline run can
    resolve the same revision. Best effort: a failure only costs that offline resolution."""
    from huggingface_hub.file_download import repo_folder_name  # noqa: PLC0415 - heavy: huggingface_hub, imported on first use

    ref = cache_dir / repo_folder_name(repo_id=repo_id, repo_type="model") / "refs" / revision
    try:
        ref.parent.mkdir(parents=True, exist_ok=True)
        tmp = ref.with_name(f".{ref.name}.{os.getpid()}.tmp")
        tmp.write_text(commit)
        os.replace(tmp, ref)
    except OSError:
        pass


def hub_offline() -> bool:
    """True when ``HF_HUB_OFFLINE`` is set (1, true, yes, on), as huggingface_hub reads it: no call
    may reach the hub, the local hub cache is the only source."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


_SHA1 = re.compile(r"[0-9a-f]{40}")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def _fetch_hf_cached(source: Source, settings: Settings, allow: Sequence[str], ignore: Sequence[str],
                     where: str) -> Snapshot:
    """``hf://`` from the local hub cache alone (``HF_HUB_OFFLINE=1``): the revision resolves through
    the cache's ``refs/<revision>`` (or is a commit with a snapshot there); each file's expected digest
    is its blob's name, which huggingface_hub sets to the file's etag: the LFS sha256 for LFS files,
    the git blob id for the rest. Raises :class:`SourceNotFoundError` (exit 2) when the revision or
    a selected file is not cached."""
    from huggingface_hub.file_download import repo_folder_name  # noqa: PLC0415 - heavy: huggingface_hub, imported on first use

    repo, rev = source.repo_id, source.revision
    assert repo is not None and rev is not None
    folder = settings.cache_dir() / "hf" / repo_folder_name(repo_id=repo, repo_type="model")
    ref = folder / "refs" / rev
    commit = rev if _SHA1.fullmatch(rev) and (folder / "snapshots" / rev).is_dir() else \
        (ref.read_text().strip() if ref.is_file() else None)
    snap_dir = folder / "snapshots" / commit if commit else None
    if snap_dir is None or not snap_dir.is_dir():
        raise SourceNotFoundError(f"hf://{repo}@{rev} is not in the local hub cache {folder.parent} (HF_HUB_OFFLINE is set)",
                                  fix="Ingest it once with the hub reachable (or unset HF_HUB_OFFLINE), or pin a cached commit.")
    everything = sorted(p.relative_to(snap_dir).as_posix() for p in snap_dir.rglob("*") if p.is_file())
    selected = _filter(everything, allow, ignore)
    _require_model_files(f"hf://{repo}@{commit} (local hub cache)", selected, everything)
    files = []
    for p in selected:
        path = snap_dir / p
        etag = path.resolve().name if path.is_symlink() else ""
        files.append(FileEntry(path=p, size=path.stat().st_size,
                               expected_sha256=etag if _SHA256.fullmatch(etag) else None,
                               expected_git_oid=etag if _SHA1.fullmatch(etag) else None))
    return Snapshot(root=snap_dir, source=source.uri, kind="hf", files=tuple(files), repo_id=repo, revision=rev,
                    commit=commit, provenance={"endpoint": where, "offline": True})


def _fetch_bundle(source: Source, settings: Settings) -> Snapshot:
    """A ``tar://`` bundle: every byte checked against its manifest while extracting (once per
    content digest, into the cache); the Snapshot's expected digests are the manifest's."""

    assert source.path is not None
    if not source.path.is_file():
        raise SourceNotFoundError(f"bundle {source.path} does not exist", fix="Check the path (tar:///absolute/path.tar.zst).")
    manifest_bytes, raw = read_manifest(source.path)
    digest = str(raw.get("content_digest", "")).removeprefix("sha256:") if isinstance(raw, dict) else ""
    if not re.fullmatch(r"[0-9a-f]{64}", digest):
        raise BundleError(f"{source.path.name}: manifest.json has no content_digest", fix="Re-make the bundle with `modelyard bundle`.")
    root = settings.cache_dir() / "bundles" / digest
    if not (root / MANIFEST).is_file() or (root / MANIFEST).read_bytes() != manifest_bytes:
        if root.exists():
            shutil.rmtree(root, ignore_errors=True)
        try:
            unbundle(source.path, root)
        except (BundleError, OSError):
            mf = root / MANIFEST
            if not (mf.is_file() and mf.read_bytes() == manifest_bytes):
                raise
            # else a concurrent fetch of the same bundle won the rename
    manifest = Manifest.from_dict(raw, f"{source.path.name}: manifest.json")  # checked by unbundle above
    src = manifest.source
    modified = manifest.modified
    files = tuple(FileEntry(path=f.path[len("model/"):], size=f.size, expected_sha256=f.sha256,
                            expected_size=f.size, made_by=f.origin)
                  for f in manifest.files if f.path.startswith("model/"))
    _require_model_files(f"bundle {source.path}", [f.path for f in files], [f.path for f in files])
    return Snapshot(root=root / "model", source=source.uri, kind="tar", files=files, repo_id=src.get("repo_id"),
                    revision=None if modified else src.get("revision"), commit=None if modified else src.get("commit"),
                    provenance={"bundle_of": f"{manifest.name}@{manifest.revision}",
                                "bundle_source": src.get("uri"), "bundle_content_digest": manifest.content_digest})
