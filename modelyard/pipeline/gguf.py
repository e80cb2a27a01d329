"""gguf: dequantize a GGUF file into a bf16 safetensors checkpoint with transformers.

transformers reads GGUF through ``from_pretrained(..., gguf_file=...)`` (needs PyPI ``gguf``) and
dequantizes every tensor to torch; it then refuses ``save_pretrained`` because the model still
carries a ``GgufHfQuantizer`` ("not serializable"), although the weights are plain tensors by
then. We drop the quantizer and ``quantization_config`` before saving (transformers 5.17
``modeling_utils.save_pretrained``). The result is cached by the GGUF's SHA256 under
``<home>/.cache/gguf/<sha256>/`` and written to a temp folder first, then renamed.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path

from modelyard import progress
from modelyard.errors import ConversionError, InvalidSourceError, SourceNotFoundError
from modelyard.pipeline.hashing import sha256_file
from modelyard.pipeline.snapshot import FileEntry, Snapshot
from modelyard.pipeline.sources import Source
from modelyard.settings import Settings

_DONE = ".modelyard-converted"


def convert_gguf(gguf_path: Path, out_dir: Path, dtype: str = "bfloat16") -> None:
    """Write a safetensors checkpoint (config, generation config, tokenizer, chat template, weights)
    of ``gguf_path`` into the existing empty folder ``out_dir``. Raises :class:`ConversionError`."""
    try:
        import torch
        import transformers
        from transformers import AutoModelForCausalLM, AutoTokenizer

        transformers.utils.logging.disable_progress_bar()
        logging.getLogger("transformers").setLevel(logging.ERROR)
        folder, name = str(gguf_path.parent), gguf_path.name
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=getattr(torch, dtype))
        model.hf_quantizer = None  # weights are already dequantized; see module docstring
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.config.__dict__.pop("_name_or_path", None)
        model.save_pretrained(str(out_dir), safe_serialization=True)
        tok.save_pretrained(str(out_dir))
    except Exception as exc:
        raise ConversionError(f"cannot convert {gguf_path.name} to safetensors: {type(exc).__name__}: {str(exc)[:300]}",
                              fix="Check that the GGUF's architecture is one transformers' GGUF loader supports.") from None


def fetch_gguf(source: Source, settings: Settings) -> Snapshot:
    """Convert (or reuse the cached conversion of) ``source.path``; returns the Snapshot of the
    converted folder with ``provenance['gguf_sha256']``. Raises SourceNotFoundError, ConversionError."""
    path = source.path
    assert path is not None
    if not path.is_file():
        raise SourceNotFoundError(f"GGUF file {path} does not exist", fix="Check the path (gguf:///absolute/path/model.gguf).")
    with open(path, "rb") as fh:
        if fh.read(4) != b"GGUF":
            raise InvalidSourceError(f"{path} is not a GGUF file (no GGUF magic)", fix="Point gguf:// at a *.gguf model file.")
    digest = sha256_file(path, label=f"hashing {path.name}")
    cache = settings.cache_dir() / "gguf" / digest
    if not (cache / _DONE).is_file():
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=cache.parent))
        try:
            with progress.task(f"converting {path.name} to safetensors", total=None):
                convert_gguf(path, tmp)
            (tmp / _DONE).write_text(digest + "\n")
            if cache.exists():
                shutil.rmtree(cache)
            tmp.rename(cache)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    import importlib.metadata as md

    files = tuple(FileEntry(path=p.name, size=p.stat().st_size) for p in sorted(cache.iterdir())
                  if p.is_file() and p.name != _DONE)
    prov = {"gguf_file": path.name, "gguf_sha256": digest,
            "converter": {"transformers": md.version("transformers"), "gguf": md.version("gguf")},
            "dtype": "bfloat16"}
    return Snapshot(root=cache, source=source.uri, kind="gguf", files=files, provenance=prov)
