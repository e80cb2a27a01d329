"""A converted GGUF tokenizer against an independent reading of the GGUF's own vocabulary.

transformers converts a GGUF's ``tokenizer.ggml.*`` arrays into a tokenizers-JSON tokenizer; vLLM serves
that. Its conversion can be wrong while every file is well formed: for the Gemma family (``gemma2``,
``gemma3_text``) transformers 5.17 builds a Unigram model from the GGUF's SentencePiece-BPE scores
(``GGUFGemmaConverter``) and no post-processor, so words that are one token of the vocabulary
(``▁capital``) are split into several pieces and ``<bos>`` is dropped: the model then reads nonsense and
answers " is is is ...". No structural check sees that; encoding text both ways does.

The independent reading is llama.cpp's own tokenizer of that vocabulary (the reference runtime of the
format): for ``tokenizer.ggml.model == "llama"`` (SentencePiece-BPE) the SPM algorithm of llama.cpp's
``llm_tokenizer_spm`` (:func:`spm_encode`: merge the adjacent pair whose concatenation is a token of the
highest score, leftmost first; byte fallback to ``<0xXX>`` tokens), with ``tokenizer.ggml.add_space_prefix``
and ``tokenizer.ggml.add_bos_token`` / ``add_eos_token`` as llama.cpp reads them (``add_bos_token``
defaults to true for ``llama``, false for ``gpt2``). For byte-level BPE (``gpt2``) the word check alone.

:func:`compare` returns the disagreements as findings (``tokenizer.gguf.*``); pure Python, the caller
passes an ``encode(text, add_special_tokens)`` of the converted tokenizer.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from modelyard import paths
from modelyard.checks.base import Finding, Severity

#: llama.cpp ``llama_token_type`` values (``gguf-py`` ``TokenType``)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
SOURCE = ("llama.cpp's tokenizer of the GGUF vocabulary (llm_tokenizer_spm; tokenizer.ggml.* keys of gguf-py) "
          "against the converted tokenizer vLLM serves")
_WORD = re.compile(r"[^\W\d_]+", re.UNICODE)


@dataclass(frozen=True)
class GgufVocab:
    """The ``tokenizer.ggml.*`` arrays of one GGUF: ``model`` (``llama``, ``gpt2``, ...), ``tokens``,
    ``scores`` (empty when absent), ``token_types`` (empty when absent), the bos/eos ids and flags
    (None when the header lacks the key)."""

    model: str
    tokens: tuple[str, ...]
    scores: tuple[float, ...] = ()
    token_types: tuple[int, ...] = ()
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    unk_token_id: int | None = None
    add_bos_token: bool | None = None
    add_eos_token: bool | None = None
    add_space_prefix: bool | None = None
    index: dict[str, int] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.index:
            idx: dict[str, int] = {}
            for i, t in enumerate(self.tokens):
                idx.setdefault(t, i)
            object.__setattr__(self, "index", idx)

    def type_of(self, i: int) -> int:
        return self.token_types[i] if i < len(self.token_types) else NORMAL

    def adds_bos(self) -> bool:
        """Whether llama.cpp prepends bos: the header's ``add_bos_token``, else true for ``llama`` (SPM)."""
        return self.add_bos_token if self.add_bos_token is not None else self.model == "llama"

    def adds_space_prefix(self) -> bool:
        """llama.cpp's ``add_space_prefix``: the header's value, else true (its default for SPM)."""
        return self.add_space_prefix if self.add_space_prefix is not None else True


def spm_encode(vocab: GgufVocab, text: str) -> list[int]:
    """``text`` encoded as llama.cpp's SPM tokenizer encodes it (no bos/eos): spaces become ``▁`` (and one
    is prepended when :meth:`GgufVocab.adds_space_prefix`), characters are merged pairwise by the highest
    score of their concatenation (leftmost first on ties), and a piece that is no token falls back to
    its UTF-8 bytes (``<0xXX>``), or to the unknown token."""
    text = text.replace(" ", "▁")
    if vocab.adds_space_prefix():
        text = "▁" + text
    sym = list(text)
    if not sym:
        return []
    prev = list(range(-1, len(sym) - 1))
    nxt = list(range(1, len(sym) + 1))
    nxt[-1] = -1
    scores, index = vocab.scores, vocab.index
    heap: list[tuple[float, int, int, str]] = []

    def push(left: int, right: int) -> None:
        if left < 0 or right < 0:
            return
        piece = sym[left] + sym[right]
        tid = index.get(piece)
        if tid is not None:
            score = scores[tid] if tid < len(scores) else 0.0
            heapq.heappush(heap, (-score, left, right, piece))

    for i in range(len(sym) - 1):
        push(i, i + 1)
    while heap:
        _, left, right, piece = heapq.heappop(heap)
        if sym[left] == "" or sym[right] == "" or nxt[left] != right or sym[left] + sym[right] != piece:
            continue  # stale: one side was merged since
        sym[left], sym[right] = piece, ""
        nxt[left] = nxt[right]
        if nxt[right] >= 0:
            prev[nxt[right]] = left
        push(prev[left], left)
        push(left, nxt[left])
    out: list[int] = []
    i = 0
    while i >= 0:
        piece = sym[i]
        tid = index.get(piece)
        if tid is not None:
            out.append(tid)
        else:
            for b in piece.encode("utf-8"):
                bid = index.get(f"<0x{b:02X}>")
                if bid is not None:
                    out.append(bid)
                elif vocab.unk_token_id is not None:
                    out.append(vocab.unk_token_id)
        i = nxt[i]
    return out


def _pieces(vocab: GgufVocab, ids: Sequence[int]) -> list[str]:
    return [vocab.tokens[i] if 0 <= i < len(vocab.tokens) else f"#{i}" for i in ids]


def single_token_words(vocab: GgufVocab, texts: Sequence[str]) -> list[tuple[str, int]]:
    """The words of ``texts`` that are one normal token of ``vocab`` after a space (``▁word`` for SPM,
    ``Ġword`` for byte-level BPE): ``[(word, token_id)]``, each word once, in order of appearance."""
    mark = "Ġ" if vocab.model == "gpt2" else "▁"
    seen: dict[str, int] = {}
    for t in texts:
        for w in _WORD.findall(t):
            tid = vocab.index.get(mark + w)
            if w not in seen and tid is not None and vocab.type_of(tid) == NORMAL:
                seen[w] = tid
    return list(seen.items())


def probe_texts() -> list[str]:
    """What a served tokenizer is checked on (a converted GGUF's here, every folder's in the runtime oracle):
    the numerical gate's reference texts, line by line (``modelyard/data/reference-texts.yaml``), and one
    plain sentence first."""
    import yaml  # noqa: PLC0415 - light, but only needed here

    data = yaml.safe_load((paths.DATA / "reference-texts.yaml").read_text(encoding="utf-8"))
    lines = [ln for t in data["texts"] for ln in t["text"].splitlines() if ln.strip()]
    return ["The capital of France is Paris.", *lines]


Encode = Callable[[str, bool], list[int]]


def compare(vocab: GgufVocab, encode: Encode, texts: Sequence[str], *, file: str = "tokenizer.json") -> list[Finding]:
    """Findings where ``encode`` (the converted tokenizer: ``encode(text, add_special_tokens)``) disagrees
    with ``vocab`` read as llama.cpp reads it, over ``texts``:

    - ``tokenizer.gguf.bos_policy``: bos added (or not) where llama.cpp would not (would);
    - ``tokenizer.gguf.splits_single_tokens``: words that are one token of the vocabulary come out as several;
    - ``tokenizer.gguf.encoding_mismatch`` (SPM only): whole texts encode to other ids than :func:`spm_encode`;
    - ``tokenizer.gguf.round_trip``: decoding is not checked here (see the caller), only ids.

    Every finding is an error: a served tokenizer that reads text otherwise than its vocabulary defines
    feeds the model nonsense."""
    out: list[Finding] = []
    probe = texts[0] if texts else "Hello"
    with_special = encode(probe, True)
    plain = encode(probe, False)
    if vocab.bos_token_id is not None:
        has = bool(with_special) and with_special[0] == vocab.bos_token_id and (not plain or plain[0] != vocab.bos_token_id)
        if has != vocab.adds_bos():
            out.append(Finding(
                "tokenizer.gguf.bos_policy", Severity.ERROR,
                f"the converted tokenizer {'adds' if has else 'does not add'} the bos token "
                f"{vocab.tokens[vocab.bos_token_id]!r} (id {vocab.bos_token_id}), but the GGUF says add_bos_token="
                f"{vocab.adds_bos()}", file=file, field="post_processor", value=with_special[:3],
                fix="Rebuild the tokenizer from the GGUF's own arrays (modelyard does for SentencePiece-BPE GGUFs) "
                    "or convert the original checkpoint instead of the GGUF.", source=SOURCE))
    words = single_token_words(vocab, texts)
    split = []
    for w, tid in words:
        got = encode(w if vocab.model == "llama" and vocab.adds_space_prefix() else " " + w, False)
        if got != [tid]:
            split.append((w, _pieces(vocab, got)))
    if split:
        shown = ", ".join(f"{w!r} -> {p}" for w, p in split[:5])
        out.append(Finding(
            "tokenizer.gguf.splits_single_tokens", Severity.ERROR,
            f"{len(split)} of {len(words)} words that are single tokens of the GGUF vocabulary are split by the "
            f"converted tokenizer: {shown}", file=file, field="model", value=len(split),
            fix="Rebuild the tokenizer from the GGUF's own arrays (modelyard does for SentencePiece-BPE GGUFs) "
                "or convert the original checkpoint instead of the GGUF.", source=SOURCE))
    if vocab.model == "llama" and vocab.scores:
        bad = [(t, encode(t, False), spm_encode(vocab, t)) for t in texts]
        bad = [b for b in bad if b[1] != b[2]]
        if bad:
            t, got, want = bad[0]
            k = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
            out.append(Finding(
                "tokenizer.gguf.encoding_mismatch", Severity.ERROR,
                f"{len(bad)} of {len(texts)} probe texts encode otherwise than llama.cpp reads the GGUF vocabulary "
                f"({len(got)} tokens against {len(want)}); first difference at token {k}: "
                f"{_pieces(vocab, got[k:k + 4])} against {_pieces(vocab, want[k:k + 4])}",
                file=file, field="model", value=len(bad),
                fix="Rebuild the tokenizer from the GGUF's own arrays (modelyard does for SentencePiece-BPE GGUFs).",
                source=SOURCE))
    return out


def summary(findings: Sequence[Finding]) -> list[dict[str, Any]]:
    """``findings`` as dicts (the conversion's record)."""
    return [f.to_dict() for f in findings]
