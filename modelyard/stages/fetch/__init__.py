"""fetch: turn a :class:`~modelyard.model.source.Source` into a local :class:`Snapshot`.

- ``hf://``: the revision is resolved to a commit sha once (``HfApi.model_info``), the file list
  with LFS sha256 / git blob ids comes from ``list_repo_tree`` at that sha; the small files, then
  each shard's header (HTTP range), then the shards are downloaded into ``<home>/.cache/hf``
  (huggingface_hub's cache layout), each hashed as it arrives (:mod:`modelyard.stages.fetch.hub`).
- ``file://``: the folder itself, read-only; nothing is copied here.
- ``gguf://``: dequantized to a bf16 safetensors checkpoint by :mod:`modelyard.stages.fetch.gguf`.
- ``tar://``: a bundle (``modelyard bundle``), verified and extracted once into
  ``<home>/.cache/bundles/<content digest>/``; the expected sizes and sha256 come from its manifest.

Default allow patterns (:data:`RUNTIME_FILE_PATTERNS`): the files a runtime reads, and nothing else; that
is what ``model/`` holds. Every other file of the source (a trainer_state.json, eval results, a README, pickle
weights) is left out, named in :attr:`Snapshot.left_out` (the report lists each one). Pickle formats and
``*.gguf`` are not fetched unless asked.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from filelock import FileLock, Timeout

from modelyard.artifact.layout import MANIFEST, SIGNATURE
from modelyard.artifact.manifest import Manifest
from modelyard.errors import (
    BundleError,
    InvalidSourceError,
    MissingConfigError,
    SignatureError,
    SourceNotFoundError,
    UnsupportedWeightsError,
)
from modelyard.model.checkpoint import PICKLE_SUFFIXES
from modelyard.model.snapshot import FileEntry, Snapshot
from modelyard.model.source import Source
from modelyard.settings import Settings
from modelyard.stages.fetch.gguf import check_gguf, fetch_gguf
from modelyard.stages.fetch.hub import HubSession, fetch_hub, hub_errors
from modelyard.stages.fetch.preflight import LICENSE_KEYS, BeforeWeights, folder_license, refuse_license
from modelyard.transport.signing import verify_signature
from modelyard.transport.unbundle import read_manifest, unbundle
from modelyard.transport.zstream import check_frames

#: The files a runtime reads from a model folder (fnmatch patterns over the path, ``*`` crossing folders,
#: as ``huggingface_hub``'s allow patterns): the default of ``--include``, and so all that ``model/`` holds.
#: Grounded in the loaders' own file names (transformers 5.17 and vLLM 0.32, as installed):
RUNTIME_FILE_PATTERNS: tuple[str, ...] = (
    # weights and their index: transformers SAFE_WEIGHTS_NAME / SAFE_WEIGHTS_INDEX_NAME; vLLM loads *.safetensors
    "*.safetensors", "*.safetensors.index.json",
    # the model's config: transformers CONFIG_NAME, GENERATION_CONFIG_NAME; vLLM's Mistral format reads params.json
    "config.json", "generation_config.json", "params.json",
    # the tokenizer: transformers TOKENIZER_CONFIG_FILE, FULL_TOKENIZER_FILE (and its versioned tokenizer.*.json),
    # SPECIAL_TOKENS_MAP_FILE, ADDED_TOKENS_FILE; the tokenizer classes' vocab_files_names (vocab.json + merges.txt,
    # vocab.txt, SentencePiece *.model such as tokenizer.model / spiece.model, *.tiktoken); vLLM's Mistral
    # tokenizer (tekken.json, tokenizer.model.v*)
    "tokenizer_config.json", "tokenizer.json", "tokenizer.*.json", "special_tokens_map.json", "added_tokens.json",
    "vocab.json", "merges.txt", "vocab.txt", "*.model", "tokenizer.model.v*", "*.tiktoken", "tekken.json",
    # chat templates: transformers CHAT_TEMPLATE_FILE, LEGACY_PROCESSOR_CHAT_TEMPLATE_FILE, CHAT_TEMPLATE_DIR
    "chat_template.jinja", "chat_template.json", "additional_chat_templates/*.jinja",
    # processors, when present: PROCESSOR_NAME, FEATURE_EXTRACTOR_NAME (= IMAGE_PROCESSOR_NAME), VIDEO_PROCESSOR_NAME
    "processor_config.json", "preprocessor_config.json", "video_preprocessor_config.json",
    # quantization configs vLLM reads beside config.json (QuantizationConfig.get_config_filenames: GPTQ, AWQ and
    # MoE-WNA16 quantize_config.json / quant_config.json, ModelOpt hf_quant_config.json, INC
    # quantization_config.json), and llm-compressor's recipe.yaml, the recipe it saves with compressed-tensors
    # weights (the record of how they were made; read back by llm-compressor, not by vLLM)
    "quantize_config.json", "quant_config.json", "hf_quant_config.json", "quantization_config.json", "recipe.yaml",
    # sentence-transformers modules, which vLLM reads for pooling models (modules.json, sentence_*_config.json, the
    # Pooling and Dense modules' config.json)
    "modules.json", "sentence_*_config.json", "*_Pooling/config.json", "*_Dense/config.json",
)
#: The files a model's license asks to travel with every copy (Apache-2.0 section 4: LICENSE and NOTICE; the
#: Llama community licenses' USE_POLICY.md): kept in ``model/`` by default, although no runtime reads them.
LICENSE_FILE_PATTERNS: tuple[str, ...] = ("LICENSE", "LICENSE.*", "LICENSE-*", "LICENCE", "LICENCE.*", "NOTICE",
                                          "NOTICE.*", "COPYING", "USE_POLICY.md")
DEFAULT_ALLOW_PATTERNS: tuple[str, ...] = RUNTIME_FILE_PATTERNS + LICENSE_FILE_PATTERNS
T = TypeVar("T")
DEFAULT_IGNORE_PATTERNS: tuple[str, ...] = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.gguf", ".git/*", "*.incomplete")


def select_patterns(allow_patterns: Sequence[str] | None = None,
                    ignore_patterns: Sequence[str] | None = None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(allow, ignore)`` for the user's ``--include`` (``allow_patterns``) and ``--exclude``
    (``ignore_patterns``): both ADD to the defaults, as the files a model needs are never optional
    (:data:`DEFAULT_ALLOW_PATTERNS`: what a runtime reads, and the license files). A default ignore pattern
    that the user includes word for word is dropped (``--include '*.gguf'`` fetches the GGUF files)."""
    include = tuple(allow_patterns or ())
    allow = DEFAULT_ALLOW_PATTERNS + tuple(p for p in include if p not in DEFAULT_ALLOW_PATTERNS)
    ignore = tuple(p for p in DEFAULT_IGNORE_PATTERNS if p not in include) + tuple(ignore_patterns or ())
    return allow, ignore


def own_selection(snapshot: Snapshot) -> tuple[str, ...] | None:
    """The paths of a hub ``snapshot``'s files (sorted) when they are not the files the default selection
    (:func:`select_patterns` without the user's patterns) takes of the commit's files (``files`` and
    ``left_out``); None when they are, and for other sources (whose revision names their content already).
    ``--include``/``--exclude`` that change nothing give None: the same content keeps the same revision."""
    if snapshot.kind != "hf":
        return None
    chosen = sorted(f.path for f in snapshot.files)
    every = sorted({*chosen, *snapshot.left_out})
    return None if _filter(every, *select_patterns()) == chosen else tuple(chosen)


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
          ignore_patterns: Sequence[str] | None = None,
          before_weights: BeforeWeights | None = None) -> Snapshot:
    """Fetch ``source``; returns a Snapshot whose ``files`` carry sizes and expected digests
    (``sha256`` is filled later by :func:`modelyard.model.digest.hash_snapshot`, or now for a file
    hashed while it was downloaded: ``received``).

    ``before_weights(snapshot)`` (``hf://`` online only) is called before any ``*.safetensors`` byte
    is downloaded, with a Snapshot of a temporary folder holding the other files and each shard's
    header (:mod:`modelyard.stages.fetch.hub`); an exception from it ends the fetch. What it returns,
    ``(folder, bytes, what)`` needs, is added to the weights still to download, and the fetch raises
    :class:`InsufficientResourcesError` (exit 2) before the first weight byte when a filesystem has less free
    (:func:`~modelyard.stages.fetch.preflight.require_space`). The card's license (README.md front matter,
    :func:`~modelyard.stages.fetch.preflight.card_license`) is recorded in the provenance of ``hf://`` and
    ``file://`` snapshots and carried from a signed bundle's manifest.

    Raises :class:`SourceNotFoundError`, :class:`MissingConfigError`, :class:`UnsupportedWeightsError`,
    :class:`EndpointUnreachableError`, :class:`InvalidSourceError` (all exit code 2).
    """
    allow, ignore = select_patterns(allow_patterns, ignore_patterns)
    if source.kind == "file":
        return _fetch_folder(source, allow, ignore)
    if source.kind == "gguf":

        return fetch_gguf(source, settings)
    if source.kind == "hf":
        return _fetch_hf(source, settings, allow, ignore, before_weights)
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


def check_local(source: Source, *, allow_patterns: Sequence[str] | None = None,
                ignore_patterns: Sequence[str] | None = None) -> None:
    """Every check of a local source that needs neither the network nor a conversion, as :func:`fetch`
    runs them (the same errors, exit 2); the CLI calls it before Prefect starts, so that bad input fails
    in about a second. ``file://``: the folder exists and holds ``config.json`` and ``*.safetensors``
    weights, all regular files (after the allow/ignore patterns); ``gguf://``: the file exists and starts
    with the GGUF magic; ``tar://``: the bundle exists and its zstd frames are whole
    (:func:`~modelyard.transport.zstream.check_frames`). ``hf://`` needs the hub: nothing is checked."""
    allow, ignore = select_patterns(allow_patterns, ignore_patterns)
    if source.kind == "file":
        _fetch_folder(source, allow, ignore)
    elif source.kind == "gguf" and source.path is not None:
        check_gguf(source.path)
    elif source.kind == "tar" and source.path is not None:
        _check_bundle(source.path)
        check_frames(source.path)


def check_hub(source: Source, settings: Settings, *, allow_patterns: Sequence[str] | None = None,
              ignore_patterns: Sequence[str] | None = None, refuse_licenses: Sequence[str] = ()) -> None:
    """The checks of an ``hf://`` fetch that need only the hub's listing and its card, as :func:`fetch` runs them
    (the same errors): the revision resolves (a gated repo, a missing revision or repo: :class:`SourceNotFoundError`,
    exit 2), the selected files can be a model (exit 2), and the card's license is not one of ``refuse_licenses``
    (:class:`VerificationFailedError`, exit 1). Two API requests and at most the card's first bytes; nothing is
    stored. The CLI calls it before Prefect starts, so that ``ingest`` refuses a bad hub source in about the time
    ``verify hf://`` takes. Offline (``HF_HUB_OFFLINE``) it checks nothing: the fetch reads the local cache."""
    if source.kind != "hf" or hub_offline():
        return
    where = settings.endpoint() or "https://huggingface.co"
    allow, ignore = select_patterns(allow_patterns, ignore_patterns)
    hub = HubSession(settings, source, where)
    with hub_errors(hub.repo, hub.rev, where, token=bool(hub.token)):
        tree = hub.resolve()
        everything = [f.path for f in tree]
        _require_model_files(f"hf://{hub.repo}@{hub.commit}", _filter(everything, allow, ignore), everything)
        if refuse_licenses:
            refuse_license({"endpoint": where, **hub.card(tree)}, refuse_licenses, source.uri)


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
    return Snapshot(root=root, source=source.uri, kind="file", files=files, left_out=left_out(everything, selected),
                    provenance=folder_license(root))


def left_out(everything: Sequence[str], selected: Sequence[str]) -> tuple[str, ...]:
    """The paths of ``everything`` (a source's files) that ``selected`` (what ``model/`` gets) leaves out,
    sorted: what the report names as not copied."""
    chosen = set(selected)
    return tuple(sorted(p for p in everything if p not in chosen))


def sweep_incomplete(cache_dir: Path, repo_id: str) -> int:
    """Remove the partial downloads that killed runs left in the hub cache; returns how many.

    huggingface_hub 1.x downloads each blob into a process-unique ``<etag>.<8 hex>.incomplete``
    (huggingface_hub PR 4228) and never resumes or removes another process's file, so a SIGKILLed
    download leaves one behind for good. A file is removed only while its blob lock
    (``<cache>/.locks/<repo folder>/<etag>.lock``, the lock huggingface_hub holds while downloading)
    can be taken at once: a download in progress elsewhere keeps its file. modelyard's own resumable
    ``<etag>.incomplete`` (:func:`~modelyard.stages.fetch.ranges.partial_path`) is kept: the next fetch continues it."""
    from huggingface_hub.file_download import repo_folder_name  # noqa: PLC0415 - heavy: huggingface_hub, imported on first use

    folder = repo_folder_name(repo_id=repo_id, repo_type="model")
    removed = 0
    for f in (cache_dir / folder / "blobs").glob("*.*.incomplete"):
        lock = FileLock(str(cache_dir / ".locks" / folder / f"{f.name.split('.')[0]}.lock"), timeout=0)
        try:
            with lock:
                f.unlink(missing_ok=True)
                removed += 1
        except (Timeout, OSError):
            continue
    return removed


def _fetch_hf(source: Source, settings: Settings, allow: Sequence[str], ignore: Sequence[str],
              before_weights: BeforeWeights | None = None, *, weights: bool = True) -> Snapshot:
    """``hf://``: :func:`modelyard.stages.fetch.hub.fetch_hub` (online) or the local hub cache
    (``HF_HUB_OFFLINE``, where ``before_weights`` is not called: nothing is downloaded)."""
    where = settings.endpoint() or "https://huggingface.co"
    repo, rev = source.repo_id, source.revision
    assert repo is not None and rev is not None
    if hub_offline():
        return _fetch_hf_cached(source, settings, allow, ignore, where)
    snap = fetch_hub(source, settings, where, lambda paths: _filter(paths, allow, ignore), _require_model_files,
                     before_weights, weights=weights)
    sweep_incomplete(settings.cache_dir() / "hf", repo)
    if snap.commit and rev != snap.commit:
        _record_ref(settings.cache_dir() / "hf", repo, rev, snap.commit)
    return snap


def preview(source: Source, settings: Settings, judge: Callable[[Snapshot], T], *,
            allow_patterns: Sequence[str] | None = None, ignore_patterns: Sequence[str] | None = None) -> T:
    """``judge(snapshot)`` on what an ``hf://`` source's weights will be judged by, without downloading
    them: a temporary folder with its small files (downloaded into the hub cache, hashed and checked
    as in :func:`fetch`) and each ``*.safetensors`` shard's header, read by HTTP range, in a sparse file
    of the shard's size. Returns what ``judge`` returns. Raises :class:`InvalidSourceError` for a
    source that is not ``hf://``, else as :func:`fetch`."""
    if source.kind != "hf":
        raise InvalidSourceError(f"{source.uri} is not a hub source; only hf:// sources are judged before download",
                                 fix="Pass hf://org/name@revision, or the local folder itself.")
    out: list[T] = []
    allow, ignore = select_patterns(allow_patterns, ignore_patterns)
    if hub_offline():
        snap = _fetch_hf_cached(source, settings, allow, ignore, settings.endpoint() or "https://huggingface.co")
        return judge(snap)
    _fetch_hf(source, settings, allow, ignore, lambda snap: out.append(judge(snap)), weights=False)
    return out[0]


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
                    commit=commit, provenance={"endpoint": where, "offline": True},
                    left_out=left_out(everything, selected))


def _check_bundle(path: Path) -> None:
    if not path.is_file():
        raise SourceNotFoundError(f"bundle {path} does not exist", fix="Check the path (tar:///absolute/path.tar.zst).")


def extract_bundle(source: Source, settings: Settings) -> tuple[Path, Manifest]:
    """Extract the ``tar://`` bundle ``source`` into the cache (``<cache>/bundles/<content digest>``), every byte
    checked against its manifest, once per content digest: a second call finds it there and reads nothing but
    the manifest. Returns the folder and the manifest. The CLI calls it before Prefect starts, so that ``ingest``
    refuses an edited bundle in the time ``unbundle`` takes (:class:`~modelyard.errors.BundleHashMismatchError`,
    exit 1; a damaged one :class:`~modelyard.errors.BundleError`), and the flow's fetch then reuses the folder."""
    assert source.path is not None
    _check_bundle(source.path)
    manifest_bytes, manifest = read_manifest(source.path)
    digest = manifest.content_digest.removeprefix("sha256:")
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
    return root, manifest


def _fetch_bundle(source: Source, settings: Settings) -> Snapshot:
    """A ``tar://`` bundle: every byte checked against its manifest while extracting (once per
    content digest, into the cache: :func:`extract_bundle`); the Snapshot's expected digests are the manifest's."""
    root, manifest = extract_bundle(source, settings)
    assert source.path is not None
    src = manifest.source
    trusted = _bundle_signed(root, settings, source)
    keep = trusted and not manifest.modified
    files = tuple(FileEntry(path=f.path[len("model/"):], size=f.size, expected_sha256=f.sha256,
                            expected_size=f.size, made_by=f.origin if trusted else "bundle")
                  for f in manifest.files if f.path.startswith("model/"))
    _require_model_files(f"bundle {source.path}", [f.path for f in files], [f.path for f in files])
    return Snapshot(root=root / "model", source=source.uri, kind="tar", files=files, repo_id=src.repo_id,
                    revision=src.revision if keep else None, commit=src.commit if keep else None,
                    provenance={"bundle_of": f"{manifest.name}@{manifest.revision}",
                                "bundle_source": src.uri, "bundle_content_digest": manifest.content_digest,
                                "bundle_signature": "verified" if trusted else "none",
                                **({k: v for k, v in src.to_dict().items() if k in LICENSE_KEYS and v} if keep else
                                   {"bundle_claimed_commit": src.commit})})


def _bundle_signed(root: Path, settings: Settings, source: Source) -> bool:
    """Whether the extracted bundle ``root`` carries a signature that verifies with
    ``settings.signing_public_key``. Without a key: False (its claims are the bundle's word only). With a key,
    an unsigned or badly signed bundle is refused (:class:`SignatureError`): whoever set the key asked for
    signed bundles. Why: a bundle whose manifest was rewritten (other files, a recomputed content digest)
    kept the source's commit as its revision and the hub's origins for its digests, claims made about other
    bytes; a revision must be derived from the content it names unless a trusted signer vouches for it."""
    key = settings.signing_public_key
    if key is None:
        return False
    if not (root / SIGNATURE).is_file():
        raise SignatureError(f"{source.uri}: the bundle is unsigned, and MODELYARD_SIGNING_PUBLIC_KEY asks for signed bundles",
                             fix="Bundle a signed artifact (`modelyard sign`, then `modelyard bundle`), or unset "
                                 "MODELYARD_SIGNING_PUBLIC_KEY to ingest it under a revision derived from its content.")
    verify_signature(root, public_key=key)
    return True
