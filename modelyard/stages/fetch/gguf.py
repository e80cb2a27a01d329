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

The converted tokenizer is then read back as vLLM reads it (``AutoTokenizer`` on the written folder) and
checked against llama.cpp's reading of the GGUF's own arrays (:mod:`modelyard.checks.gguf_tokenizer`):
bos policy, single-token words, whole-text encodings. A SentencePiece-BPE GGUF (``tokenizer.ggml.model
== "llama"``) whose conversion disagrees is repaired: its tokenizer is rebuilt from the arrays with the
``tokenizers`` library (:func:`spm_tokenizer`: BPE whose merges are ranked by the GGUF scores, byte
fallback, bos/eos as the header says) and checked again. A conversion that still disagrees is refused
(:class:`ConversionError`), never published. What was found and done is recorded in the snapshot's
provenance (``tokenizer_check``).

The result is cached by the GGUF's SHA256 under ``<home>/.cache/gguf/<sha256>/`` and written to a
temp folder first, then renamed. The cache marker names :data:`CONVERTER_VERSION`: a conversion
cached by a modelyard that wrote different files is redone, not reused.
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import json
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from modelyard import progress
from modelyard.checks.base import Finding, Severity
from modelyard.checks.gguf_tokenizer import (
    CONTROL,
    NORMAL,
    SOURCE,
    UNKNOWN,
    USER_DEFINED,
    GgufVocab,
    Reference,
    TokenizerCheck,
    compare,
    probe_texts,
)
from modelyard.errors import ConversionError, InvalidSourceError, SourceNotFoundError
from modelyard.model.digest import sha256_file
from modelyard.model.snapshot import FileEntry, Snapshot
from modelyard.model.source import Source
from modelyard.runtime.process import run_script
from modelyard.settings import Settings

_DONE = ".modelyard-converted"
#: the version of what :func:`convert_gguf` writes; bump it whenever the written files change, so
#: that conversions cached by an older modelyard are redone (it is part of the cache marker).
#: 2: special tokens and their ids taken from the GGUF header. 3: the tokenizer checked (and repaired)
#: against the GGUF's own arrays. 4: user-defined tokens matched before the model in a rebuilt tokenizer,
#: byte-level vocabularies read through bytes-to-unicode, llama.cpp itself as the reference where installed.
CONVERTER_VERSION = "4"
CHECK_FILE = ".modelyard-tokenizer-check.json"
HAND_READING = "llama.cpp's algorithm read by hand"
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


@contextmanager
def one_reader_per_file() -> Iterator[None]:
    """Within the block, every ``gguf.GGUFReader(path)`` of one file returns the same reader.

    A conversion reads the header of one GGUF six times: transformers' tokenizer (twice: ``AutoTokenizer`` and the
    tokenizer's own ``__init__``), config and model loaders each construct a ``GGUFReader`` (``load_gguf_checkpoint``
    imports it from ``gguf`` on every call), and so do :func:`gguf_special_token_ids` and :func:`read_vocab`. Parsing
    a header is dominated by its string arrays (a 262,144-token vocabulary took 12-16 s a read on 2 cores: a Gemma-3
    270M conversion took 115 s, 55 s with one reader; ``benchmarks/gguf_convert.py``); the reader is a
    read-only memory map, so one per file serves every caller. The module attribute is swapped for the block and
    restored after it; a conversion runs in one thread."""
    import gguf  # noqa: PLC0415 - heavy: gguf, imported on first use

    original = gguf.GGUFReader
    readers: dict[tuple[str, Any], Any] = {}

    def shared(path: Any, mode: Any = "r") -> Any:
        key = (os.path.realpath(path), mode)
        if key not in readers:
            readers[key] = original(path, mode)
        return readers[key]

    gguf.GGUFReader = shared  # type: ignore[assignment,misc]
    try:
        yield
    finally:
        gguf.GGUFReader = original  # type: ignore[misc]
        readers.clear()


def convert_gguf(gguf_path: Path, out_dir: Path, dtype: str = "bfloat16") -> None:
    """Write a safetensors checkpoint (config, generation config, tokenizer, chat template, weights)
    of ``gguf_path`` into the existing empty folder ``out_dir`` (the header parsed once,
    :func:`one_reader_per_file`). Raises :class:`ConversionError`."""
    with one_reader_per_file():
        _convert(gguf_path, out_dir, dtype)


def _convert(gguf_path: Path, out_dir: Path, dtype: str) -> None:
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
        # weights are already dequantized, see module docstring (torch types a Module's attributes Tensor | Module)
        model.hf_quantizer = None  # type: ignore[assignment]
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.config.__dict__.pop("_name_or_path", None)
        model.save_pretrained(str(out_dir), safe_serialization=True)
        tok.save_pretrained(str(out_dir))
        check_and_repair(gguf_path, out_dir)
    except ConversionError:
        raise
    except Exception as exc:
        raise ConversionError(f"cannot convert {gguf_path.name} to safetensors: {type(exc).__name__}: {str(exc)[:300]}",
                              fix="Check that the GGUF's architecture is one transformers' GGUF loader supports.") from exc


def read_vocab(gguf_path: Path) -> GgufVocab:
    """The ``tokenizer.ggml.*`` arrays of ``gguf_path``'s header (PyPI ``gguf``'s ``GGUFReader``)."""
    from gguf import GGUFReader  # noqa: PLC0415 - heavy: gguf, imported on first use

    reader = GGUFReader(str(gguf_path))

    def get(key: str) -> Any:
        fld = reader.get_field(f"tokenizer.ggml.{key}")
        return fld.contents() if fld is not None else None

    def opt_int(key: str) -> int | None:
        v = get(key)
        return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None

    def opt_bool(key: str) -> bool | None:
        v = get(key)
        return v if isinstance(v, bool) else None

    return GgufVocab(model=str(get("model") or ""), tokens=tuple(get("tokens") or ()),
                     scores=tuple(float(x) for x in get("scores") or ()), token_types=tuple(int(x) for x in get("token_type") or ()),
                     bos_token_id=opt_int("bos_token_id"), eos_token_id=opt_int("eos_token_id"),
                     unk_token_id=opt_int("unknown_token_id"), add_bos_token=opt_bool("add_bos_token"),
                     add_eos_token=opt_bool("add_eos_token"), add_space_prefix=opt_bool("add_space_prefix"))


def spm_tokenizer(vocab: GgufVocab) -> Any:
    """A ``tokenizers.Tokenizer`` for a SentencePiece-BPE GGUF vocabulary, built from its arrays: BPE over
    ``tokens`` whose merges are every split of a token into two tokens, ranked by the merged token's score
    (SentencePiece-BPE and llama.cpp merge the highest score first), byte fallback to ``<0xXX>``, spaces as
    ``▁`` (one prepended when ``add_space_prefix``), control and unknown tokens special, user-defined tokens
    (a Gemma GGUF's runs of spaces and tabs, HTML tags) added tokens matched before the model and not
    normalized, as llama.cpp matches them; bos/eos added as ``add_bos_token``/``add_eos_token`` say."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, processors  # noqa: PLC0415 - heavy

    index = vocab.index
    ranked = []
    for tid, tok in enumerate(vocab.tokens):
        if vocab.type_of(tid) not in (NORMAL, USER_DEFINED):
            continue
        for cut in range(1, len(tok)):
            left, right = tok[:cut], tok[cut:]
            if left in index and right in index:
                ranked.append((-vocab.scores[tid], tid, index[left], left, right))
    ranked.sort()
    bpe = models.BPE(dict(index), [(lt, rt) for *_, lt, rt in ranked],
                     unk_token=vocab.tokens[vocab.unk_token_id] if vocab.unk_token_id is not None else None,
                     fuse_unk=True, byte_fallback=True)
    tk = Tokenizer(bpe)
    norm = [normalizers.Prepend("▁")] if vocab.adds_space_prefix() else []
    tk.normalizer = normalizers.Sequence([*norm, normalizers.Replace(" ", "▁")])
    dec = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    tk.decoder = decoders.Sequence(dec + ([decoders.Strip(" ", 1, 0)] if vocab.adds_space_prefix() else []))
    # llama.cpp cuts control, unknown and user-defined tokens out of the text before the model (checks.
    # gguf_tokenizer.partition); tokenizers does the same with added tokens that are not normalized
    tk.add_special_tokens([AddedToken(t, normalized=False, special=True) for i, t in enumerate(vocab.tokens)
                           if t and vocab.type_of(i) in (CONTROL, UNKNOWN)])
    tk.add_tokens([AddedToken(t, normalized=False, special=False) for i, t in enumerate(vocab.tokens)
                   if t and vocab.type_of(i) == USER_DEFINED])
    bos = vocab.tokens[vocab.bos_token_id] if vocab.bos_token_id is not None else None
    eos = vocab.tokens[vocab.eos_token_id] if vocab.eos_token_id is not None else None
    single = ([f"{bos}:0"] if bos and vocab.adds_bos() else []) + ["$A:0"] + ([f"{eos}:0"] if eos and vocab.add_eos_token else [])
    pair = single + [s.replace(":0", ":1").replace("$A", "$B") for s in single]
    special = [(t, index[t]) for t in {bos, eos} if t and any(t in s for s in single)]
    tk.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=special)
    return tk


LLAMA_TOKENIZE = Path(__file__).resolve().parents[2] / "runtime" / "scripts" / "llama_tokenize.py"


@dataclass(frozen=True)
class LlamaCppReading:
    """llama.cpp's reading of a GGUF's vocabulary over some texts (:func:`llama_cpp_reference`): ``name`` (with
    the llama-cpp-python version), ``ids`` per text, and ``overridden``: the ids of the tokens llama.cpp treats
    as control though the GGUF declares them normal. ``error`` instead when llama.cpp could not read it."""

    name: str
    ids: dict[str, list[int]] = field(default_factory=dict)
    overridden: frozenset[int] = frozenset()
    error: str | None = None

    def encode(self, text: str) -> list[int] | None:
        """The ids of ``text`` (one of the texts read), or None where llama.cpp's reading holds an overridden
        token (not compared: its heuristic, not the format) or the text was not read."""
        ids = self.ids.get(text)
        return None if ids is None or self.overridden.intersection(ids) else ids


def llama_cpp_reference(gguf_path: Path, vocab: GgufVocab, texts: list[str], *,
                        timeout: float = 300) -> LlamaCppReading | None:
    """llama.cpp's own tokenizer of ``gguf_path`` over ``texts`` (PyPI ``llama-cpp-python``, the ``reference``
    extra: ``Llama(path, vocab_only=True)`` reads the vocabulary, no weights; ``parse_special``, no bos), run in a
    child process of this interpreter (``runtime/scripts/llama_tokenize.py``: llama.cpp aborts its process on a
    vocabulary it cannot load). None where the package is not installed; a reading with ``error`` where llama.cpp
    failed (the caller falls back to the hand reading and records why).

    The tokens llama.cpp treats as control though ``vocab`` declares them normal are its own heuristic, not the
    format: it makes every "control-looking" end-of-generation text control ("this is probably a bug in the
    model. its type will be overridden", llama-vocab.cpp), so it reads a literal ``</s>`` in a Qwen2.5 text as
    one token where the model's own tokenizer (and vLLM's) reads three; texts with them are not compared."""
    if importlib.util.find_spec("llama_cpp") is None:
        return None
    name = f"llama.cpp (llama-cpp-python {md.version('llama-cpp-python')})"
    with tempfile.TemporaryDirectory(prefix="modelyard-llama-cpp-") as tmp:
        job, out, log = Path(tmp, "job.json"), Path(tmp, "out.json"), Path(tmp, "log")
        job.write_text(json.dumps({"texts": texts}), encoding="utf-8")
        env = {**os.environ, "GGML_NO_BACKTRACE": "1"}  # an abort's backtrace would attach gdb to the child
        run = run_script(sys.executable, LLAMA_TOKENIZE, [str(gguf_path), str(job), str(out)], env=env,
                         timeout=timeout, log=log)
        if run.returncode != 0 or not out.is_file():
            why = "timed out" if run.timed_out else f"exit status {run.returncode}"
            last = [ln for ln in run.tail.splitlines() if "GGML_ASSERT" in ln or "error" in ln.lower()][-1:]
            return LlamaCppReading(name, error=f"llama.cpp could not read the vocabulary ({why}): "
                                               f"{(last or [run.tail.strip()[-200:]])[0][-300:]}")
        data = json.loads(out.read_text(encoding="utf-8"))
    over = frozenset(i for i in data["control"] if i < len(vocab.tokens) and vocab.type_of(i) == NORMAL)
    return LlamaCppReading(name, dict(zip(texts, data["ids"])), over)


def _check_folder(vocab: GgufVocab, out_dir: Path, texts: list[str], reference: Reference | None) -> list[Any]:
    from transformers import AutoTokenizer  # noqa: PLC0415 - heavy: transformers, imported on first use

    tok = AutoTokenizer.from_pretrained(str(out_dir))
    found = compare(vocab, lambda t, special: list(tok(t, add_special_tokens=special).input_ids), texts,
                    reference=reference)
    bad = [t for t in texts[:3] if tok.decode(tok(t, add_special_tokens=False).input_ids) != t]
    if bad:
        found.append(Finding("tokenizer.gguf.round_trip", Severity.ERROR,
                             f"decoding the converted tokenizer's ids does not give the text back: {bad[0][:60]!r}",
                             file="tokenizer.json", field="decoder", source=SOURCE,
                             fix="Rebuild the tokenizer from the GGUF's own arrays."))
    return found


def check_and_repair(gguf_path: Path, out_dir: Path) -> TokenizerCheck:
    """Check the tokenizer written in ``out_dir`` against ``gguf_path``'s own arrays (module docstring), read by
    llama.cpp itself where ``llama-cpp-python`` is installed (:func:`llama_cpp_reference`), else by hand;
    repair a SentencePiece-BPE one that disagrees. Returns what was found (also written to :data:`CHECK_FILE`
    when the GGUF has a vocabulary). Raises :class:`ConversionError` when it still disagrees."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast  # noqa: PLC0415 - heavy: transformers

    vocab = read_vocab(gguf_path)
    texts = probe_texts(markers=True)
    ref = llama_cpp_reference(gguf_path, vocab, texts) if vocab.tokens else None
    reference_name, reference_error, overrides = HAND_READING, None, None
    if ref is not None and ref.error:
        reference_error, ref = ref.error, None  # llama.cpp could not read it: the hand reading judges
    elif ref is not None:
        reference_name = ref.name
        if ref.overridden:
            overrides = tuple(sorted(vocab.tokens[i] for i in ref.overridden))  # not compared
    check = partial(TokenizerCheck, model=vocab.model, checked=len(texts), reference=reference_name,
                    reference_error=reference_error, reference_overrides=overrides)
    if not vocab.tokens:
        return check(repaired=False, findings=())
    reference = ref.encode if ref else None
    found = _check_folder(vocab, out_dir, texts, reference)
    before = tuple(f.to_dict() for f in found)
    result = check(repaired=False, findings=before)
    if found and vocab.model == "llama" and vocab.scores:
        old = AutoTokenizer.from_pretrained(str(out_dir))
        fast = PreTrainedTokenizerFast(tokenizer_object=spm_tokenizer(vocab), chat_template=old.chat_template,
                                       **{k: getattr(old, k) for k in ("bos_token", "eos_token", "unk_token", "pad_token")
                                          if getattr(old, k, None) is not None})
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model"):
            (out_dir / name).unlink(missing_ok=True)
        fast.save_pretrained(str(out_dir))
        found = _check_folder(vocab, out_dir, texts, reference)
        result = check(repaired=True, findings=before, after=tuple(f.to_dict() for f in found))
    if found:
        raise ConversionError(
            f"the tokenizer transformers converted from {gguf_path.name} reads text otherwise than the GGUF's own "
            f"vocabulary ({vocab.model}): {found[0].message}", fix=found[0].fix or "")
    (out_dir / CHECK_FILE).write_text(json.dumps(result.to_dict(), indent=1))
    return result


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
                  if p.is_file() and p.name not in (_DONE, CHECK_FILE))
    prov = {"gguf_file": path.name, "gguf_sha256": digest,
            "converter": {"modelyard": CONVERTER_VERSION, "transformers": md.version("transformers"),
                          "gguf": md.version("gguf")},
            "dtype": "bfloat16", "tokenizer_check": _read_check(cache)}
    return Snapshot(root=cache, source=source.uri, kind="gguf", files=files, provenance=prov)


def _marked_done(cache: Path, marker: str) -> bool:
    """Whether ``cache`` holds a finished conversion whose marker is exactly ``marker`` (same GGUF
    sha256 and :data:`CONVERTER_VERSION`); an older modelyard's marker (the sha256 alone) is not."""
    try:
        return (cache / _DONE).read_text() == marker
    except (OSError, UnicodeDecodeError):
        return False


def _read_check(cache: Path) -> dict[str, Any] | None:
    """The tokenizer check's record of a cached conversion (:data:`CHECK_FILE`), or None."""
    try:
        return json.loads((cache / CHECK_FILE).read_text())
    except (OSError, ValueError):
        return None
