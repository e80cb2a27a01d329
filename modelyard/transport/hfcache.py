"""hfcache: rehydrate a bundle's ``model/`` into the Hugging Face cache layout.

With ``HF_HUB_CACHE=DIR`` and ``HF_HUB_OFFLINE=1``, plain transformers then loads
``from_pretrained("org/name", revision=<commit>)`` (or without a revision, through ``refs/main``)::

    DIR/models--org--name/blobs/<id>                       one per distinct file
    DIR/models--org--name/snapshots/<commit>/<path>        relative symlinks to ../../blobs/<id>
    DIR/models--org--name/refs/main                        the commit

Blob ids follow the hub's rules: an LFS file is stored under its sha256, a regular (git) file under
its git blob sha1, computed while extracting. Which is which: the manifest's ``origin`` (``hub-lfs``
or ``hub-git``); for other origins, the hub's defaults: LFS for files of 10 MiB or more and for
weight/archive suffixes (``*.safetensors``, ``*.bin``, ``tokenizer.model``, ...).

Identity: ``repo_id`` and ``commit`` come from the manifest's source (``hf://org/name@sha``).
``--repo-id`` overrides the repo id and is required when the source was not a hub. The commit is
the hub's only when the artifact holds the hub's bytes unchanged; for a patched or quantized
artifact, or a non-hub source, it is synthesized: ``sha1("modelyard:" + content_digest)``, 40 hex
digits, stable for the same content (and never a real hub commit of different bytes).

Every byte is verified as in :func:`modelyard.transport.unbundle.unbundle`, into a temp folder inside
the cache; only then are blobs moved in, the snapshot folder renamed into place and ``refs/main``
replaced. Files outside ``model/`` (reports, manifest) are verified and not written.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from modelyard.artifact.manifest import Manifest
from modelyard.errors import BundleError
from modelyard.paths import require_space
from modelyard.transport.unbundle import (
    DEFAULT_MAX_RATIO,
    BundleContents,
    Discard,
    MemberFile,
    Sink,
    read_bundle,
    read_manifest,
    remove_tree,
)

LFS_THRESHOLD = 10 * 1024 * 1024
LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".onnx", ".gguf", ".model",
                ".tiktoken", ".npy", ".npz", ".pkl", ".pickle", ".zip", ".gz", ".zst", ".tar", ".7z", ".ot", ".tflite")
_REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class HFCacheResult:
    cache_dir: Path
    repo_id: str
    commit: str
    commit_synthesized: bool
    snapshot: Path
    files: int
    reused: bool  # the snapshot was already in the cache with the same blobs


def is_lfs(path: str, size: int, origin: str | None) -> bool:
    """Whether the hub would store ``path`` (relative to the repo) with LFS."""
    if origin in ("hub-lfs", "hub-git"):
        return origin == "hub-lfs"
    return size >= LFS_THRESHOLD or path.endswith(LFS_SUFFIXES)


def identity(manifest: Manifest, repo_id: str | None = None) -> tuple[str, str, bool]:
    """(repo id, commit, synthesized?) for a manifest; see the module doc. Raises BundleError."""
    src = manifest.source
    repo = repo_id or src.repo_id
    if not repo:
        raise BundleError(f"the bundle's source {src.uri!r} is not a hub repo, so it has no repo id",
                          fix="Pass --repo-id org/name: the name the far side will load.")
    if not _REPO_RE.match(repo):
        raise BundleError(f"repo id {repo!r} is not of the form org/name", fix="Pass --repo-id org/name.")
    modified = manifest.modified or any(f.origin not in ("hub-lfs", "hub-git") for f in manifest.files)
    commit = src.commit
    if isinstance(commit, str) and _COMMIT_RE.match(commit) and not modified:
        return repo, commit, False
    return repo, hashlib.sha1(f"modelyard:{manifest.content_digest}".encode()).hexdigest(), True


class HFCacheSink(Sink):
    """Writes ``model/`` files as blobs under ``tmp/blobs`` and discards the rest (after checking it)."""

    def __init__(self, tmp: Path) -> None:
        self.blobs = tmp / "blobs"
        self.blobs.mkdir()
        self.blob_of: dict[str, str] = {}  # path relative to model/ -> blob id
        self._incoming: dict[str, Path] = {}
        self._contents: BundleContents | None = None

    def start(self, contents: BundleContents) -> None:
        self._contents = contents
        model = sum(e.size for rel, e in contents.files.items() if rel.startswith("model/"))
        require_space([(self.blobs, model, "the model's blobs")], elsewhere="pass another --hf-cache")

    def _lfs(self, rel: str) -> bool:
        assert self._contents is not None
        e = self._contents.files[rel]
        return is_lfs(rel[len("model/"):], e.size, e.origin)

    def wants_git(self, rel: str) -> bool:
        return rel.startswith("model/") and not self._lfs(rel)

    def open(self, rel: str) -> MemberFile:
        if not rel.startswith("model/"):
            return Discard()
        p = self.blobs / f".incoming-{len(self._incoming)}"
        self._incoming[rel] = p
        return open(p, "xb")  # noqa: SIM115 - closed in commit()

    def commit(self, rel: str, fh: MemberFile, sha256: str, git_sha1: str | None) -> None:
        fh.close()
        if not rel.startswith("model/"):
            return
        blob = sha256 if self._lfs(rel) else git_sha1
        assert blob is not None
        src, dst = self._incoming.pop(rel), self.blobs / blob
        if dst.exists():  # two files with the same bytes share a blob
            src.unlink()
        else:
            src.rename(dst)
        self.blob_of[rel[len("model/"):]] = blob


def rehydrate(bundle: Path, cache_dir: Path, *, repo_id: str | None = None,
              max_ratio: float = DEFAULT_MAX_RATIO) -> HFCacheResult:
    """Verify ``bundle`` and place its model into the HF cache ``cache_dir`` (see the module doc)."""
    _, first = read_manifest(bundle)
    identity(first, repo_id)  # fail on a missing repo id before reading gigabytes
    cache_dir = Path(cache_dir).expanduser().absolute()
    created = not cache_dir.exists()
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".modelyard-unbundle-", dir=cache_dir))
    try:
        sink = HFCacheSink(tmp)
        contents = read_bundle(bundle, sink, max_ratio=max_ratio)
        repo, commit, synthesized = identity(contents.manifest, repo_id)
        staged = tmp / "snapshots" / commit
        for rel, blob in sorted(sink.blob_of.items()):
            link = staged / rel
            link.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(os.path.relpath(sink.blobs / blob, link.parent), link)
        repo_dir = cache_dir / ("models--" + repo.replace("/", "--"))
        for sub in ("blobs", "snapshots", "refs"):
            (repo_dir / sub).mkdir(parents=True, exist_ok=True)
        for blob_path in sink.blobs.iterdir():
            if not (repo_dir / "blobs" / blob_path.name).exists():
                os.rename(blob_path, repo_dir / "blobs" / blob_path.name)
        snap = repo_dir / "snapshots" / commit
        reused = snap.exists()
        if reused:
            _same_snapshot(snap, staged, sink.blob_of)
        else:
            os.rename(staged, snap)
        ref = repo_dir / "refs" / "main"
        tmp_ref = tmp / "ref"
        tmp_ref.write_text(commit)
        os.replace(tmp_ref, ref)
    except BaseException:
        remove_tree(tmp)
        if created:
            try:
                cache_dir.rmdir()
            except OSError:
                pass
        raise
    remove_tree(tmp)
    return HFCacheResult(cache_dir, repo, commit, synthesized, snap, len(sink.blob_of), reused)


def _same_snapshot(snap: Path, staged: Path, blob_of: dict[str, str]) -> None:
    """An existing snapshot folder must link exactly our files to our blobs."""
    have = {p.relative_to(snap).as_posix() for p in snap.rglob("*") if p.is_symlink() or p.is_file()}
    diff = sorted(have ^ set(blob_of))
    for rel, blob in blob_of.items():
        link = snap / rel
        if rel not in diff and (not link.is_symlink() or Path(os.readlink(link)).name != blob):
            diff.append(rel)
    if diff:
        raise BundleError(f"{snap} already exists with other content ({', '.join(diff[:5])})",
                          fix=f"Remove {snap} (and refs/main if it points there), then run unbundle again.")
