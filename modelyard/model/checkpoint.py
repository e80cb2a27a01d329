"""Checkpoint: a typed, read-only, lazy view of a model folder.

Nothing here writes, and nothing reads weight bytes: safetensors files are read header-only
(the first 8 bytes give the header length, then the JSON header), per the safetensors format
(https://github.com/huggingface/safetensors, "Format" section; the Rust reader caps the header at
100,000,000 bytes, ``MAX_HEADER_SIZE``).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelyard.errors import SafetensorsHeaderError

#: safetensors' own header-size cap (bytes), ``MAX_HEADER_SIZE`` in safetensors/src/tensor.rs.
MAX_HEADER_BYTES = 100_000_000

#: bits per element of each safetensors dtype (safetensors ``Dtype`` enum).
DTYPE_BITS: dict[str, int] = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32, "C64": 64, "F64": 64, "I64": 64, "U64": 64,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}

WEIGHT_SUFFIXES = (".safetensors",)
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
INDEX_NAME = "model.safetensors.index.json"


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int  # byte offset into the data section
    end: int


@dataclass(frozen=True)
class SafetensorsHeader:
    """One shard's header. Sizes in bytes; ``data_size`` = file size − 8 − ``header_size``."""

    path: Path
    file_size: int
    header_size: int
    data_size: int
    tensors: dict[str, TensorInfo]
    metadata: dict[str, Any]


def read_safetensors_header(path: Path) -> SafetensorsHeader:
    """Parse the header of ``path`` without reading tensor data.

    Raises :class:`SafetensorsHeaderError` (reason ``too_small``, ``header_too_large``,
    ``header_beyond_file``, ``bad_json``, ``not_object``, ``bad_entry``) when the bytes cannot be a
    safetensors header. Offsets are *not* cross-checked here; ``checks.safetensors`` does that and
    reports findings. Reads at most 8 + min(header length, 100 MB) bytes.
    """
    size = path.stat().st_size
    if size < 8:
        raise SafetensorsHeaderError(path, "too_small", f"file is {size} bytes, shorter than the 8-byte header length")
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        if n > MAX_HEADER_BYTES:
            raise SafetensorsHeaderError(path, "header_too_large", f"header length {n} exceeds the 100,000,000-byte limit")
        if 8 + n > size:
            raise SafetensorsHeaderError(path, "header_beyond_file", f"header length {n} runs past the end of the {size}-byte file")
        raw = fh.read(n)
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise SafetensorsHeaderError(path, "bad_json", f"header is not valid JSON ({exc.__class__.__name__})") from exc
    if not isinstance(doc, dict):
        raise SafetensorsHeaderError(path, "not_object", "header JSON is not an object")
    meta = doc.pop("__metadata__", None) or {}
    if not isinstance(meta, dict):
        raise SafetensorsHeaderError(path, "bad_entry", "__metadata__ is not an object")
    tensors: dict[str, TensorInfo] = {}
    for name, ent in doc.items():
        try:
            dtype = ent["dtype"]
            shape = tuple(ent["shape"])
            begin, end = ent["data_offsets"]
            if not isinstance(dtype, str) or not all(type(d) is int and d >= 0 for d in shape):
                raise TypeError
            if type(begin) is not int or type(end) is not int:
                raise TypeError
        except (KeyError, TypeError, ValueError) as exc:
            raise SafetensorsHeaderError(path, "bad_entry", f"tensor entry {name!r} lacks a valid dtype, shape or data_offsets") from exc
        tensors[name] = TensorInfo(name, dtype, shape, begin, end)
    return SafetensorsHeader(path, size, n, size - 8 - n, tensors, meta)


def tensor_nbytes(t: TensorInfo) -> int | None:
    """Bytes ``t`` must occupy (shape product × dtype bits / 8); None for an unknown dtype."""
    bits = DTYPE_BITS.get(t.dtype)
    if bits is None:
        return None
    if 0 in t.shape:
        return 0
    n = 1
    for d in t.shape:
        n *= d
        if n > _NBYTES_CAP:  # a hostile header's product: any value this large already exceeds every file
            return (n * bits + 7) // 8
    return (n * bits + 7) // 8


#: element counts past this are not a real tensor (2**80 elements); stop multiplying a hostile shape there,
#: so that a header of 10^6 huge dimensions cannot cost quadratic big-integer time.
_NBYTES_CAP = 2**80


#: deepest JSON nesting modelyard accepts (real configs nest a handful of levels); deeper documents
#: would make repr/json.dumps of a finding's value hit the recursion limit.
MAX_JSON_DEPTH = 64
#: bytes of a JSON file read whole (config.json, the safetensors index, tokenizer_config.json, ...): the
#: largest healthy ones are a few MB (a 671B model's shard index: ~9 MB); a 50 MB config.json took
#: 4.5 minutes and 2.1 GB to judge
MAX_JSON_BYTES = 32 << 20
#: bytes of tokenizer.json that are parsed or handed to transformers: the largest of the known families
#: is Gemma 3's (33 MB); a 200 MB one took 8.3 GB of memory to load
MAX_TOKENIZER_BYTES = 64 << 20


def json_too_deep(doc: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """True when ``doc`` nests lists/dicts deeper than ``limit`` (checked without recursion)."""
    stack = [(doc, 1)]
    while stack:
        obj, depth = stack.pop()
        if depth > limit:
            return True
        for v in obj.values() if isinstance(obj, dict) else obj if isinstance(obj, list) else ():
            if isinstance(v, (dict, list)):
                stack.append((v, depth + 1))
    return False


def read_json(path: Path) -> tuple[Any, str | None]:
    """``(data, None)`` or ``(None, reason)``; never raises for a missing or malformed file, and
    never opens a FIFO or device (``reason`` "not a regular file"). A document nested deeper than
    :data:`MAX_JSON_DEPTH` levels is refused like invalid JSON."""
    try:
        if path.exists() and not path.is_file():
            return None, "not a regular file"
        size = path.stat().st_size
        limit = MAX_TOKENIZER_BYTES if path.name == "tokenizer.json" else MAX_JSON_BYTES
        if size > limit:
            return None, f"not read: {size} bytes, over the {limit >> 20} MiB limit modelyard reads whole"
        with open(path, "rb") as fh:
            data = json.loads(fh.read())
        if json_too_deep(data):
            return None, f"not valid JSON (nested deeper than {MAX_JSON_DEPTH} levels)"
        return data, None
    except FileNotFoundError:
        return None, "missing"
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        return None, f"not valid JSON ({exc.__class__.__name__}: {exc})"


class Checkpoint:
    """Read-only view of the model folder ``root``. Properties load lazily and are cached."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    @functools.cached_property
    def files(self) -> tuple[str, ...]:
        """Relative POSIX paths of every entry below ``root`` (files and links), sorted."""
        out = []
        for dirpath, dirnames, filenames in os.walk(self.root):
            dirnames[:] = sorted(d for d in dirnames if d != ".git")
            for f in filenames:
                out.append(Path(dirpath, f).relative_to(self.root).as_posix())
        return tuple(sorted(out))

    def path(self, rel: str) -> Path:
        return self.root / rel

    def json(self, rel: str) -> tuple[Any, str | None]:
        return read_json(self.root / rel)

    @functools.cached_property
    def config(self) -> dict[str, Any] | None:
        data, _ = self.json("config.json")
        return data if isinstance(data, dict) else None

    @functools.cached_property
    def generation_config(self) -> dict[str, Any] | None:
        data, _ = self.json("generation_config.json")
        return data if isinstance(data, dict) else None

    @functools.cached_property
    def tokenizer_config(self) -> dict[str, Any] | None:
        data, _ = self.json("tokenizer_config.json")
        return data if isinstance(data, dict) else None

    @functools.cached_property
    def safetensors_files(self) -> tuple[str, ...]:
        return tuple(f for f in self.files if f.endswith(".safetensors"))

    @functools.cached_property
    def pickle_files(self) -> tuple[str, ...]:
        return tuple(f for f in self.files if f.endswith(PICKLE_SUFFIXES))

    @functools.cached_property
    def index(self) -> dict[str, Any] | None:
        if INDEX_NAME not in self.files:
            return None
        data, _ = self.json(INDEX_NAME)
        return data if isinstance(data, dict) else None

    @functools.lru_cache(maxsize=None)  # noqa: B019 - per-instance view, lives as long as the check run
    def header(self, rel: str) -> SafetensorsHeader:
        """Header of shard ``rel``; raises :class:`SafetensorsHeaderError` or ``OSError``."""
        return read_safetensors_header(self.root / rel)

    @functools.cached_property
    def special_files(self) -> tuple[tuple[str, str], ...]:
        """``(relative path, kind)`` of entries that are not regular files or directories (FIFOs,
        sockets, device nodes; links are followed): opening one can block forever or read a device,
        so :func:`~modelyard.stages.verify.verify_folder` stops at them."""
        out = []
        for rel in self.files:
            try:
                mode = (self.root / rel).stat().st_mode
            except OSError:
                continue  # dangling link: reported by files.symlinks
            if not stat.S_ISREG(mode):
                kind = ("FIFO" if stat.S_ISFIFO(mode) else "socket" if stat.S_ISSOCK(mode) else
                        "character device" if stat.S_ISCHR(mode) else "block device" if stat.S_ISBLK(mode) else "special file")
                out.append((rel, kind))
        return tuple(out)

    @functools.cached_property
    def text_config(self) -> dict[str, Any]:
        """The language-model part of config.json: ``text_config`` for multimodal configs, else the
        whole config (vLLM ``get_hf_text_config``); ``{}`` when config.json is unusable."""
        cfg = self.config or {}
        tc = cfg.get("text_config")
        return tc if isinstance(tc, dict) else cfg

    @functools.cached_property
    def loaded_safetensors_files(self) -> tuple[str, ...]:
        """The shards vLLM's default loader reads: with a readable ``model.safetensors.index.json`` only
        the present files its ``weight_map`` names (vLLM ``filter_duplicate_safetensors_files``; a
        Mistral ``consolidated.safetensors`` beside indexed shards is skipped), else every
        ``*.safetensors`` file."""
        wm = (self.index or {}).get("weight_map")
        if isinstance(wm, dict) and wm:
            named = {v for v in wm.values() if isinstance(v, str)}
            return tuple(f for f in self.safetensors_files if f in named)
        return self.safetensors_files

    @functools.cached_property
    def tensors(self) -> dict[str, TensorInfo]:
        """Union of the readable headers of the shards the loader reads (:attr:`loaded_safetensors_files`):
        tensor name → TensorInfo (no weight bytes read). Unreadable shards are skipped here;
        ``checks.safetensors`` reports them."""
        out: dict[str, TensorInfo] = {}
        for rel in self.loaded_safetensors_files:
            try:
                out.update(self.header(rel).tensors)
            except (SafetensorsHeaderError, OSError):
                continue
        return out

    @functools.cached_property
    def tensor_shard(self) -> dict[str, str]:
        """Tensor name → the shard file (relative path) whose header holds it."""
        out: dict[str, str] = {}
        for rel in self.loaded_safetensors_files:
            try:
                out.update(dict.fromkeys(self.header(rel).tensors, rel))
            except (SafetensorsHeaderError, OSError):
                continue
        return out

    @functools.cached_property
    def weights_readable(self) -> bool:
        """True when there is at least one safetensors shard and every shard header parses."""
        if not self.safetensors_files:
            return False
        try:
            for rel in self.safetensors_files:
                self.header(rel)
        except (SafetensorsHeaderError, OSError):
            return False
        return True

    @functools.cached_property
    def hf_config(self) -> tuple[Any, str | None]:
        """``(transformers PretrainedConfig, None)`` or ``(None, "ExcType: message")``.

        Loaded with ``trust_remote_code=False`` and ``local_files_only=True``: never runs the
        repository's code, never touches the network."""
        try:

            from transformers import AutoConfig  # noqa: PLC0415 - heavy: transformers, imported on first use

            logging.getLogger("transformers").setLevel(logging.ERROR)
            return AutoConfig.from_pretrained(str(self.root), trust_remote_code=False, local_files_only=True), None
        except Exception as exc:  # transformers raises ValueError, KeyError, OSError, ...
            return None, _exc_line(exc)

    @functools.cached_property
    def hf_tokenizer(self) -> tuple[Any, str | None]:
        """``(transformers tokenizer, None)`` or ``(None, "ExcType: message")``; a ``tokenizer.json`` over
        :data:`MAX_TOKENIZER_BYTES` is not loaded (``LimitError``); fast mode,
        ``trust_remote_code=False``, ``local_files_only=True``. tiktoken's file cache is switched off for
        the load (``TIKTOKEN_CACHE_DIR=""``): it keys a BPE file by its path, so a ``tokenizer.model``
        rewritten in place would be read stale and a fixed folder would keep its old verdict."""
        for name in ("tokenizer.json", "tokenizer_config.json"):
            p = self.root / name
            limit = MAX_TOKENIZER_BYTES if name == "tokenizer.json" else MAX_JSON_BYTES
            if p.is_file() and p.stat().st_size > limit:
                return None, (f"LimitError: {name} is {p.stat().st_size} bytes, over the {limit >> 20} MiB limit "
                              "modelyard loads (memory grows ~40x the file)")
        saved = os.environ.get("TIKTOKEN_CACHE_DIR")
        os.environ["TIKTOKEN_CACHE_DIR"] = ""
        try:

            from transformers import AutoTokenizer  # noqa: PLC0415 - heavy: transformers, imported on first use

            logging.getLogger("transformers").setLevel(logging.ERROR)
            return AutoTokenizer.from_pretrained(str(self.root), trust_remote_code=False, local_files_only=True,
                                                 use_fast=True), None
        except Exception as exc:
            return None, _exc_line(exc)
        finally:
            if saved is None:
                os.environ.pop("TIKTOKEN_CACHE_DIR", None)
            else:
                os.environ["TIKTOKEN_CACHE_DIR"] = saved

    def chat_template(self) -> str | None:
        """The chat template: ``chat_template.jinja`` beside the tokenizer (transformers ≥ 4.47),
        else ``tokenizer_config.chat_template`` (a string, or the first of a named list)."""
        p = self.root / "chat_template.jinja"
        if p.is_file():
            return p.read_text(encoding="utf-8", errors="replace")
        tc = self.tokenizer_config or {}
        ct = tc.get("chat_template")
        if isinstance(ct, str):
            return ct
        if isinstance(ct, list) and ct and isinstance(ct[0], dict):
            return ct[0].get("template")
        return None


def _exc_line(exc: BaseException) -> str:
    """``"ExcType: first line of the message"``, at most 300 characters."""
    text = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
