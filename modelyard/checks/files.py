"""files: what is in the folder, before any format is parsed.

Rules: Git LFS pointer texts posing as weights (a clone without ``git lfs pull``; the pointer format
is https://github.com/git-lfs/git-lfs/blob/main/docs/spec.md); ``*.incomplete`` leftovers of an
interrupted huggingface_hub download; pickle weights, which loading would unpickle (vLLM and
transformers call ``torch.load``; modelyard never does).
"""

from __future__ import annotations

from collections.abc import Iterator

from modelyard.checkpoint import PICKLE_SUFFIXES, Checkpoint
from modelyard.checks.findings import CheckContext, Finding, Severity
from modelyard.checks.registry import check

LFS_POINTER_PREFIX = b"version https://git-lfs.github.com/spec/v1"
_LFS_POINTER_MAX = 1024  # bytes; a pointer is ~130 bytes


def is_lfs_pointer(data_head: bytes, size: int) -> bool:
    """True when a file of ``size`` bytes starting with ``data_head`` is a Git LFS pointer text."""
    return size <= _LFS_POINTER_MAX and data_head.startswith(LFS_POINTER_PREFIX)


@check("files")
def lfs_pointers(ckpt: Checkpoint, ctx: CheckContext) -> Iterator[Finding]:
    for rel in ckpt.files:
        p = ckpt.path(rel)
        try:
            size = p.stat().st_size
            if size > _LFS_POINTER_MAX:
                continue
            head = p.read_bytes()[: len(LFS_POINTER_PREFIX)]
        except OSError:
            continue
        if is_lfs_pointer(head, size):
            yield Finding(
                code="files.lfs_pointer",
                severity=Severity.ERROR,
                message=f"{rel} is a {size}-byte Git LFS pointer text, not the file's content.",
                file=rel,
                value=size,
                fix="Fetch the real object (`git lfs pull`, or download with huggingface_hub).",
                source="git-lfs pointer spec; vLLM fails with a safetensors header error on such files",
            )


@check("files")
def incomplete_downloads(ckpt: Checkpoint, ctx: CheckContext) -> Iterator[Finding]:
    for rel in ckpt.files:
        if rel.endswith(".incomplete"):
            yield Finding(
                code="files.incomplete_download",
                severity=Severity.WARNING,
                message=f"{rel} is a leftover of an interrupted download; the folder may mix finished and unfinished files.",
                file=rel,
                fix="Delete it and re-run the download, then verify again.",
                source="huggingface_hub writes *.incomplete while downloading",
            )


@check("files")
def weights_present(ckpt: Checkpoint, ctx: CheckContext) -> Iterator[Finding]:
    pickles = [f for f in ckpt.files if f.endswith(PICKLE_SUFFIXES)]
    for rel in pickles:
        yield Finding(
            code="files.pickle_weights",
            severity=Severity.WARNING,
            message=f"{rel} is a pickle file; loading it runs torch.load (code-execution risk).",
            file=rel,
            fix="Use the safetensors weights, or convert with a trusted tool in a sandbox.",
            source="transformers refuses torch.load on torch < 2.6 (CVE-2025-32434); picklescan flags such files",
        )
    if not ckpt.safetensors_files:
        yield Finding(
            code="files.no_safetensors",
            severity=Severity.WARNING if pickles else Severity.ERROR,
            message="no *.safetensors weights in the folder" + (" (only pickle weights)" if pickles else ""),
            fix="Publish the checkpoint as safetensors (transformers `save_pretrained(safe_serialization=True)`).",
            source="modelyard artifacts carry safetensors only",
        )
