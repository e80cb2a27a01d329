"""gguf: dequantize a GGUF file into a bf16 safetensors checkpoint with transformers.

transformers reads GGUF through ``from_pretrained(..., gguf_file=...)`` (needs PyPI ``gguf``) and
dequantizes every tensor to torch; it then refuses ``save_pretrained`` because the model still
carries a ``GgufHfQuantizer`` ("not serializable"), although the weights are plain tensors by
then. We drop the quantizer and ``quantization_config`` before saving (transformers 5.17
``modeling_utils.save_pretrained``).

transformers 5.17's GGUF tokenizer converters also mix up the special tokens (``GGUFGPTConverter``
takes the eos token from ``bos_token_id`` and swaps bos/eos in ``additional_kwargs``), so SmolLM2's
``tokenizer_config.json`` said ``eos_token: <|im_start|>`` while the header says id 2, ``<|im_end|>``.
We read the ids from the header ourselves (llama.cpp ``gguf-py`` keys ``tokenizer.ggml.{bos,eos,
padding,unknown}_token_id``, through PyPI ``gguf``'s ``GGUFReader``) and set the tokenizer's
bos/eos/pad/unk tokens and the config/generation-config ids from them before saving.

The result is cached by the GGUF's SHA256 under ``<home>/.cache/gguf/<sha256>/`` and written to a
temp folder first, then renamed. The cache marker names :data:`CONVERTER_VERSION`: a conversion
cached by a modelyard that wrote different files is redone, not reused.
"""

from __future__ import annotations

import importlib.metadata as md
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

from modelyard import progress
from modelyard.errors import ConversionError, InvalidSourceError, SourceNotFoundError
from modelyard.model.digest import sha256_file
from modelyard.model.snapshot import FileEntry, Snapshot
from modelyard.model.source import Source
from modelyard.settings import Settings

_DONE = ".modelyard-converted"
#: the version of what :func:`convert_gguf` writes; bump it whenever the written files change, so
#: that conversions cached by an older modelyard are redone (it is part of the cache marker).
#: 2: special tokens and their ids taken from the GGUF header.
CONVERTER_VERSION = "2"
#: GGUF header key of each special-token id -> the transformers tokenizer attribute it sets
#: (llama.cpp ``gguf-py`` ``Keys.Tokenizer``: BOS_ID, EOS_ID, PAD_ID, UNK_ID).
SPECIAL_TOKEN_KEYS: dict[str, str] = {
    "tokenizer.ggml.bos_token_id": "bos_token",
    "tokenizer.ggml.eos_token_id": "eos_token",
    "tokenizer.ggml.padding_token_id": "pad_token",
    "tokenizer.ggml.unknown_token_id": "unk_token",
}


def gguf_special_token_ids(gguf_path: Path) -> dict[str, int]:
    """The special-token ids the GGUF header of ``gguf_path`` declares, keyed by tokenizer attribute
    (``bos_token``, ``eos_token``, ``pad_token``, ``unk_token``); keys the header lacks, or whose value
    is not a non-negative integer, are left out. Reads the header only (memory-mapped)."""
    from gguf import GGUFReader  # noqa: PLC0415 - heavy: gguf, imported on first use

    reader = GGUFReader(str(gguf_path))
    out: dict[str, int] = {}
    for key, attr in SPECIAL_TOKEN_KEYS.items():
        fld = reader.get_field(key)
        value = fld.contents() if fld is not None else None
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            out[attr] = value
    return out


def _with_id(current: Any, want: int) -> int | list[int]:
    """``want`` as a config ``*_token_id`` value that keeps ``current``'s other ids: a list stays a
    list (``want`` first when it lacks it), anything else becomes ``want``."""
    if isinstance(current, list):
        return current if want in current else [want, *current]
    return want


def apply_special_tokens(tok: Any, model: Any, ids: dict[str, int]) -> dict[str, str]:
    """Make ``tok``'s special tokens (and ``model``'s config and generation config ids) those of the
    header ``ids`` (:func:`gguf_special_token_ids`). An id outside ``tok``'s vocabulary is skipped.
    Only the attribute is set: which tokens are special (split or not) stays as the converter made
    it. Returns ``{attribute: token}`` of what was set."""
    size = len(tok)
    done: dict[str, str] = {}
    for attr, tid in ids.items():
        token = tok.convert_ids_to_tokens(tid) if tid < size else None
        if not isinstance(token, str):
            continue
        setattr(tok, attr, token)
        done[attr] = token
        if attr == "unk_token":
            continue
        key = f"{attr}_id"
        text = getattr(model.config, "get_text_config", lambda: model.config)()
        for cfg in {id(c): c for c in (model.config, text)}.values():
            setattr(cfg, key, _with_id(getattr(cfg, key, None), tid))
        gen = getattr(model, "generation_config", None)
        if gen is not None:
            setattr(gen, key, _with_id(getattr(gen, key, None), tid))
    if len(tok) != size:
        raise ValueError(f"setting the special tokens grew the vocabulary from {size} to {len(tok)}")
    return done


def convert_gguf(gguf_path: Path, out_dir: Path, dtype: str = "bfloat16") -> None:
    """Write a safetensors checkpoint (config, generation config, tokenizer, chat template, weights)
    of ``gguf_path`` into the existing empty folder ``out_dir``. Raises :class:`ConversionError`."""
    try:
        import torch  # noqa: PLC0415 - heavy: torch, imported on first use
        import transformers  # noqa: PLC0415 - heavy: transformers, imported on first use
        from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: PLC0415 - heavy: transformers, imported on first use

        transformers.utils.logging.disable_progress_bar()
        logging.getLogger("transformers").setLevel(logging.ERROR)
        folder, name = str(gguf_path.parent), gguf_path.name
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=getattr(torch, dtype))
        apply_special_tokens(tok, model, gguf_special_token_ids(gguf_path))  # see module docstring
        model.hf_quantizer = None  # weights are already dequantized; see module docstring
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.config.__dict__.pop("_name_or_path", None)
        model.save_pretrained(str(out_dir), safe_serialization=True)
        tok.save_pretrained(str(out_dir))
    except Exception as exc:
        raise ConversionError(f"cannot convert {gguf_path.name} to safetensors: {type(exc).__name__}: {str(exc)[:300]}",
                              fix="Check that the GGUF's architecture is one transformers' GGUF loader supports.") from exc


def check_gguf(path: Path) -> None:
    """Raise SourceNotFoundError when ``path`` is not a file, InvalidSourceError when it does not start
    with the GGUF magic (``b"GGUF"``, the GGUF specification's first four bytes)."""
    if not path.is_file():
        raise SourceNotFoundError(f"GGUF file {path} does not exist", fix="Check the path (gguf:///absolute/path/model.gguf).")
    with open(path, "rb") as fh:
        if fh.read(4) != b"GGUF":
            raise InvalidSourceError(f"{path} is not a GGUF file (no GGUF magic)", fix="Point gguf:// at a *.gguf model file.")


def fetch_gguf(source: Source, settings: Settings) -> Snapshot:
    """Convert (or reuse the cached conversion of) ``source.path``; returns the Snapshot of the
    converted folder with ``provenance['gguf_sha256']``. Raises SourceNotFoundError, ConversionError."""
    path = source.path
    assert path is not None
    check_gguf(path)
    digest = sha256_file(path, label=f"hashing {path.name}")
    cache = settings.cache_dir() / "gguf" / digest
    marker = f"{digest} converter {CONVERTER_VERSION}\n"
    if not _marked_done(cache, marker):
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=cache.parent))
        try:
            with progress.task(f"converting {path.name} to safetensors", total=None):
                convert_gguf(path, tmp)
            (tmp / _DONE).write_text(marker)
            if cache.exists():
                shutil.rmtree(cache)
            tmp.rename(cache)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)

    files = tuple(FileEntry(path=p.name, size=p.stat().st_size) for p in sorted(cache.iterdir())
                  if p.is_file() and p.name != _DONE)
    prov = {"gguf_file": path.name, "gguf_sha256": digest,
            "converter": {"modelyard": CONVERTER_VERSION, "transformers": md.version("transformers"),
                          "gguf": md.version("gguf")},
            "dtype": "bfloat16"}
    return Snapshot(root=cache, source=source.uri, kind="gguf", files=files, provenance=prov)


def _marked_done(cache: Path, marker: str) -> bool:
    """Whether ``cache`` holds a finished conversion whose marker is exactly ``marker`` (same GGUF
    sha256 and :data:`CONVERTER_VERSION`); an older modelyard's marker (the sha256 alone) is not."""
    try:
        return (cache / _DONE).read_text() == marker
    except (OSError, UnicodeDecodeError):
        return False
