"""safetensors: headers and the index, header-only (never reading weight bytes).

Rules from the safetensors format (https://github.com/huggingface/safetensors#format): an 8-byte
little-endian header length, a JSON object header, ``data_offsets`` relative to the data section,
contiguous and non-overlapping, the last end equal to the data size; and from transformers' sharded
loading (``model.safetensors.index.json``: ``weight_map`` tensor → shard, ``metadata.total_size``).
A missing shard is the failure of vllm-project/vllm#34859 and #38336.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

from modelyard.checks.base import CheckContext, Finding, Severity, check
from modelyard.checks.files import LFS_POINTER_PREFIX
from modelyard.errors import SafetensorsHeaderError
from modelyard.model.checkpoint import INDEX_NAME, Checkpoint, tensor_nbytes

_SRC = "safetensors format spec (huggingface/safetensors README, 'Format')"
_LIST_MAX = 12  # tensor names quoted in one message


def _names(names: list[str]) -> str:
    shown = ", ".join(names[:_LIST_MAX])
    return shown + (f" and {len(names) - _LIST_MAX} more" if len(names) > _LIST_MAX else "")


@check("safetensors")
def headers(ckpt: Checkpoint, ctx: CheckContext) -> Iterator[Finding]:

    for rel in ckpt.safetensors_files:
        try:
            with open(ckpt.path(rel), "rb") as fh:
                if fh.read(len(LFS_POINTER_PREFIX)) == LFS_POINTER_PREFIX:
                    continue  # reported by files.lfs_pointer
            h = ckpt.header(rel)
        except SafetensorsHeaderError as exc:
            yield Finding(
                code=f"safetensors.header.{exc.reason}", severity=Severity.ERROR,
                message=f"{rel}: {exc.detail}", file=rel,
                fix="Download the file again; if it persists the publisher's file is corrupt.", source=_SRC,
            )
            continue
        except OSError as exc:
            yield Finding(code="safetensors.unreadable", severity=Severity.ERROR,
                          message=f"{rel} cannot be read: {exc.strerror or exc}", file=rel,
                          fix="Check the file's permissions and that it is not a dangling link.", source=_SRC)
            continue
        spans = []
        for t in h.tensors.values():
            nbytes = tensor_nbytes(t)
            if nbytes is None:
                yield Finding(code="safetensors.tensor.unknown_dtype", severity=Severity.ERROR,
                              message=f"{rel}: tensor {t.name} has dtype {t.dtype!r}, not a safetensors dtype",
                              file=rel, field=t.name, value=t.dtype,
                              fix="Re-export the checkpoint with a current safetensors.", source=_SRC)
                continue
            if t.begin < 0 or t.end < t.begin or t.end - t.begin != nbytes:
                yield Finding(code="safetensors.tensor.size_mismatch", severity=Severity.ERROR,
                              message=(f"{rel}: tensor {t.name} ({t.dtype} {list(t.shape)}) needs {nbytes} bytes "
                                       f"but data_offsets [{t.begin}, {t.end}] span {t.end - t.begin}"),
                              file=rel, field=t.name, value=[t.begin, t.end],
                              fix="The header is corrupt; download the file again.", source=_SRC)
                continue
            spans.append((t.begin, t.end, t.name))
        spans.sort()
        pos = 0
        for begin, end, name in spans:
            if begin != pos:
                kind = "overlaps the previous tensor" if begin < pos else f"leaves a gap of {begin - pos} bytes"
                yield Finding(code="safetensors.offsets.not_contiguous", severity=Severity.ERROR,
                              message=f"{rel}: tensor {name} starts at byte {begin} and {kind}",
                              file=rel, field=name, value=[begin, end],
                              fix="The header is corrupt; download the file again.", source=_SRC)
            pos = max(pos, end)
        if spans and pos != h.data_size:
            if pos > h.data_size:
                yield Finding(code="safetensors.data.truncated", severity=Severity.ERROR,
                              message=(f"{rel}: the header needs {pos} bytes of tensor data but the file holds "
                                       f"{h.data_size}; the last {pos - h.data_size} bytes are missing"),
                              file=rel, value=h.file_size,
                              fix="The download was interrupted; fetch the file again.", source=_SRC)
            else:
                yield Finding(code="safetensors.data.trailing_bytes", severity=Severity.ERROR,
                              message=f"{rel}: {h.data_size - pos} bytes follow the last tensor's data",
                              file=rel, value=h.file_size,
                              fix="The file was modified or concatenated; fetch it again.", source=_SRC)


@check("safetensors")
def index(ckpt: Checkpoint, ctx: CheckContext) -> Iterator[Finding]:
    shards = ckpt.safetensors_files
    if INDEX_NAME not in ckpt.files:
        if len(shards) > 1:
            yield Finding(code="safetensors.index.missing", severity=Severity.WARNING,
                          message=(f"{len(shards)} safetensors shards but no {INDEX_NAME}: vLLM reads every "
                                   "*.safetensors file and serves it, but transformers (quality checks, patching, "
                                   "other loaders) cannot load the shards without the index"),
                          file=INDEX_NAME, fix="Download the index file, or re-save the model with save_pretrained.",
                          source="transformers loads sharded checkpoints through the index")
        return
    data, err = ckpt.json(INDEX_NAME)
    wm = data.get("weight_map") if isinstance(data, dict) else None
    if err or not isinstance(wm, dict) or not all(isinstance(v, str) for v in wm.values()):
        yield Finding(code="safetensors.index.invalid", severity=Severity.ERROR,
                      message=f"{INDEX_NAME} is not a valid index ({err or 'weight_map missing or not tensor→file'})",
                      file=INDEX_NAME, field="weight_map",
                      fix="Download the index again or regenerate it from the shard headers.",
                      source="transformers sharded checkpoint index format")
        return
    by_shard: dict[str, list[str]] = defaultdict(list)
    for tensor, shard in wm.items():
        by_shard[shard].append(tensor)
    present: dict[str, set[str]] = {}
    for shard, names in sorted(by_shard.items()):
        if shard not in shards:
            yield Finding(code="safetensors.index.missing_shard", severity=Severity.ERROR,
                          message=(f"{INDEX_NAME} maps {len(names)} tensor(s) to {shard}, which is not in the folder: "
                                   f"{_names(sorted(names))}"),
                          file=INDEX_NAME, field=f"weight_map -> {shard}", value=sorted(names),
                          fix=f"Download {shard} again (or regenerate the index if the checkpoint was resharded).",
                          source="vllm-project/vllm#34859, vllm-project/vllm#38336")
            continue
        try:
            present[shard] = set(ckpt.header(shard).tensors)
        except (SafetensorsHeaderError, OSError):
            continue  # reported by the headers check
        absent = sorted(set(names) - present[shard])
        if absent:
            yield Finding(code="safetensors.index.tensor_not_in_shard", severity=Severity.ERROR,
                          message=f"{INDEX_NAME} maps {len(absent)} tensor(s) to {shard}, whose header lacks them: {_names(absent)}",
                          file=shard, field="weight_map", value=absent,
                          fix="The index and shards come from different exports; download both from the same revision.",
                          source="transformers sharded loading")
    total = 0
    for shard in shards:
        if shard not in by_shard:
            yield _unindexed_shard(ckpt, shard)
            continue
        try:
            h = ckpt.header(shard)
        except (SafetensorsHeaderError, OSError):
            continue
        extra = sorted(set(h.tensors) - set(by_shard[shard]))
        if extra:
            yield Finding(code="safetensors.index.unindexed_tensor", severity=Severity.WARNING,
                          message=f"{shard} holds {len(extra)} tensor(s) the index does not name: {_names(extra)}",
                          file=shard, value=extra, fix="Regenerate the index from the shard headers.",
                          source="transformers sharded loading")
        total += sum(t.end - t.begin for t in h.tensors.values())
    declared = (data.get("metadata") or {}).get("total_size") if isinstance(data.get("metadata"), dict) else None
    all_present = all(s in shards for s in by_shard)
    if isinstance(declared, int) and all_present and declared != total:
        yield Finding(code="safetensors.index.total_size_mismatch", severity=Severity.WARNING,
                      message=f"{INDEX_NAME} metadata.total_size is {declared} but the shards hold {total} bytes of tensors",
                      file=INDEX_NAME, field="metadata.total_size", value=declared,
                      fix="Regenerate the index.", source="transformers sharded checkpoint index format")


@check("safetensors")
def duplicates(ckpt: Checkpoint, ctx: CheckContext) -> Iterator[Finding]:
    """A tensor name stored in more than one of the shards vLLM reads (:attr:`Checkpoint.loaded_safetensors_files`).

    vLLM's default loader does not filter tensors by the index: it iterates every tensor of every shard it
    reads (``safetensors_weights_iterator``) into the model's ``load_weights``, so each copy is loaded in
    turn. A copy whose shape differs from the others is refused there (``default_weight_loader``:
    "Attempted to load weight (...) into parameter (...)"), whichever of them the index names: an error.
    Copies of one shape load, the last one read wins, while transformers loads the one the index names: a
    warning."""
    seen: dict[str, list[tuple[str, tuple[int, ...], str]]] = defaultdict(list)
    for rel in ckpt.loaded_safetensors_files:
        try:
            h = ckpt.header(rel)
        except (SafetensorsHeaderError, OSError):
            continue
        for name, t in h.tensors.items():
            seen[name].append((rel, tuple(t.shape), t.dtype))
    twice = {n: c for n, c in seen.items() if len(c) > 1}
    for name, copies in sorted(twice.items()):
        where = ", ".join(f"{rel} {list(shape)} {dtype}" for rel, shape, dtype in copies)
        named = ((ckpt.index or {}).get("weight_map") or {}).get(name) if isinstance(ckpt.index, dict) else None
        keep = f"the copy in {named} (the one the index names)" if isinstance(named, str) else "one copy"
        if len({shape for _, shape, _ in copies}) > 1:
            yield Finding(code="safetensors.tensor.duplicate_shape_mismatch", severity=Severity.ERROR,
                          message=(f"tensor {name} is stored {len(copies)} times with different shapes ({where}): "
                                   "vLLM's loader loads every copy and refuses the one whose shape does not fit the "
                                   "parameter"),
                          file=copies[-1][0], field=name, value=[list(shape) for _, shape, _ in copies],
                          fix=f"Keep {keep} and remove the others from their shards (re-save the checkpoint with "
                              "save_pretrained).",
                          source="vLLM safetensors_weights_iterator (every tensor of every shard) and default_weight_loader")
        else:
            yield Finding(code="safetensors.tensor.duplicate", severity=Severity.WARNING,
                          message=(f"tensor {name} is stored {len(copies)} times ({where}): vLLM loads every copy and "
                                   "keeps the last one it reads, transformers the one the index names"),
                          file=copies[-1][0], field=name, value=len(copies),
                          fix=f"Keep {keep} and remove the others from their shards.",
                          source="vLLM safetensors_weights_iterator (every tensor of every shard)")


def _unindexed_shard(ckpt: Checkpoint, shard: str) -> Finding:
    """A shard the index does not name: vLLM's default loader skips it (``filter_duplicate_safetensors_files``).
    When it holds about as many bytes as the indexed shards together, it is a second export of the
    same weights (Mistral's ``consolidated.safetensors`` beside HF shards): loaders that glob every
    ``*.safetensors`` read both sets (vllm-project/vllm#40765, NVIDIA/TensorRT-LLM#7225,
    ggml-org/llama.cpp#17286, Blaizzy/mlx-vlm#1464)."""
    try:
        size = ckpt.header(shard).data_size
    except (SafetensorsHeaderError, OSError):
        size = None
    indexed = 0
    for rel in ckpt.loaded_safetensors_files:
        try:
            indexed += ckpt.header(rel).data_size
        except (SafetensorsHeaderError, OSError):
            pass
    if size and indexed and 0.5 <= size / indexed <= 2.0:
        return Finding(code="safetensors.index.duplicate_weight_set", severity=Severity.WARNING,
                       message=(f"{shard} ({size:,} data bytes) is a second weight set beside the {len(ckpt.loaded_safetensors_files)} "
                                f"indexed shard(s) ({indexed:,} bytes): vLLM's default loader follows {INDEX_NAME} and "
                                "skips it, but it doubles the download and disk size, and loaders that glob every "
                                "*.safetensors file read both sets"),
                       file=shard, value=size,
                       fix="Keep the other export (e.g. Mistral's consolidated.safetensors) out of the serving artifact; "
                           "publish it separately if needed.",
                       source="vLLM filter_duplicate_safetensors_files; vllm-project/vllm#40765, NVIDIA/TensorRT-LLM#7225")
    return Finding(code="safetensors.index.unindexed_shard", severity=Severity.WARNING,
                   message=f"{shard} is not named in {INDEX_NAME}; its tensors will not be loaded",
                   file=shard, fix="Remove the stray shard or regenerate the index.",
                   source="transformers sharded loading; vLLM filter_duplicate_safetensors_files")
