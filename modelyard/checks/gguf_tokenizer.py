"""A converted GGUF tokenizer against an independent reading of the GGUF's own vocabulary.

transformers converts a GGUF's ``tokenizer.ggml.*`` arrays into a tokenizers-JSON tokenizer; vLLM serves
that. Its conversion can be wrong while every file is well formed: for the Gemma family (``gemma2``,
``gemma3_text``) transformers 5.17 builds a Unigram model from the GGUF's SentencePiece-BPE scores
(``GGUFGemmaConverter``) and no post-processor, so words that are one token of the vocabulary
(``▁capital``) are split into several pieces and ``<bos>`` is dropped: the model then reads nonsense and
answers " is is is ...". No structural check sees that; encoding text both ways does.

The independent reading is llama.cpp's own tokenizer of that vocabulary (the reference runtime of the
format). Where PyPI ``llama-cpp-python`` is installed (the ``reference`` extra) the caller passes llama.cpp
itself as ``reference`` (``Llama(path, vocab_only=True).tokenize``). Without it, the hand reading here does
what llama.cpp does: user-defined and control tokens are partitioned out of the text first, longest first
(:func:`partition`, llama.cpp's ``tokenizer_st_partition``: a GGUF stores runs of spaces as user-defined
tokens, which the model's own algorithm never reaches); for ``tokenizer.ggml.model == "llama"``
(SentencePiece-BPE) each remaining piece goes through the SPM algorithm of ``llm_tokenizer_spm``
(:func:`spm_encode`: merge the adjacent pair whose concatenation is a token of the highest score, leftmost
first; byte fallback to ``<0xXX>`` tokens), with ``tokenizer.ggml.add_space_prefix`` and
``tokenizer.ggml.add_bos_token`` / ``add_eos_token`` as llama.cpp reads them (``add_bos_token`` defaults to
true for ``llama``, false for ``gpt2``). Byte-level BPE vocabularies (``gpt2``) spell every text through
GPT-2's bytes-to-unicode map (:func:`byte_level`): the token ``ĠÃł`` is the text `` à``.

:func:`compare` returns the disagreements as findings (``tokenizer.gguf.*``); pure Python, the caller
passes an ``encode(text, add_special_tokens)`` of the converted tokenizer.
"""

from __future__ import annotations

import functools
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

    @functools.cached_property
    def partitioned(self) -> tuple[tuple[str, int, int], ...]:
        """The tokens llama.cpp matches in a text before its model runs (``cache_special_tokens``): user-defined,
        control and unknown tokens, ``(text, id, type)``, longest text first (ties by id)."""
        keep = (USER_DEFINED, CONTROL, UNKNOWN)
        found = [(t, i, self.type_of(i)) for i, t in enumerate(self.tokens) if t and self.type_of(i) in keep]
        return tuple(sorted(found, key=lambda x: (-len(x[0]), x[1])))


@functools.cache
def _byte_map() -> dict[int, str]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode  # noqa: PLC0415 - heavy: transformers

    return dict(bytes_to_unicode())  # type: ignore[no-untyped-call]


def byte_level(text: str) -> str:
    """``text`` spelt as a byte-level BPE vocabulary spells it: its UTF-8 bytes through GPT-2's bytes-to-unicode
    map (transformers ``convert_slow_tokenizer.bytes_to_unicode``, the same table as tokenizers' ``ByteLevel``
    and llama.cpp's ``unicode_byte_to_utf8``): ``" à"`` is ``"ĠÃł"``, ``" Paris"`` is ``"ĠParis"``."""
    m = _byte_map()
    return "".join(m[b] for b in text.encode("utf-8"))


def partition(vocab: GgufVocab, text: str, *, special: bool = True) -> list[str | int]:
    """``text`` split as llama.cpp's ``tokenizer_st_partition`` splits it before the model: each token of
    :attr:`GgufVocab.partitioned`, longest first, is cut out of the raw pieces left, every occurrence, left
    to right; control and unknown tokens only when ``special`` (llama.cpp's ``parse_special``). Returns the
    raw text pieces (``str``) and the ids of matched tokens (``int``), in order."""
    parts: list[str | int] = [text]
    for tok, tid, kind in vocab.partitioned:
        if kind != USER_DEFINED and not special:
            continue
        if not any(isinstance(p, str) and tok in p for p in parts):
            continue
        nxt: list[str | int] = []
        for p in parts:
            if not isinstance(p, str) or tok not in p:
                nxt.append(p)
                continue
            pieces = p.split(tok)
            for k, piece in enumerate(pieces):
                if piece:
                    nxt.append(piece)
                if k < len(pieces) - 1:
                    nxt.append(tid)
        parts = nxt
    return parts


def hand_encode(vocab: GgufVocab, text: str) -> list[int] | None:
    """``text`` as llama.cpp encodes it with ``parse_special`` (no bos/eos), read by hand: :func:`partition`,
    then :func:`spm_encode` on each raw piece, with a space prefixed where llama.cpp prefixes one (the first
    piece and each piece after a matched token, when ``add_space_prefix``). None for vocabularies other than
    SentencePiece-BPE with scores (byte-level BPE is judged by its words and by llama.cpp itself)."""
    if vocab.model != "llama" or not vocab.scores:
        return None
    out: list[int] = []
    prev_token = True
    for part in partition(vocab, text):
        if isinstance(part, int):
            out.append(part)
            prev_token = True
            continue
        out.extend(spm_encode(vocab, part, space_prefix=vocab.adds_space_prefix() and prev_token))
        prev_token = False
    return out


def spm_encode(vocab: GgufVocab, text: str, *, space_prefix: bool | None = None) -> list[int]:
    """``text`` encoded as llama.cpp's SPM tokenizer encodes one raw piece (no bos/eos, no partition): spaces
    become ``▁`` (and one is prepended when ``space_prefix``, by default :meth:`GgufVocab.adds_space_prefix`),
    characters are merged pairwise by the highest score of their concatenation (leftmost first on ties), and
    a piece that is no token falls back to its UTF-8 bytes (``<0xXX>``), or to the unknown token."""
    text = text.replace(" ", "▁")
    if vocab.adds_space_prefix() if space_prefix is None else space_prefix:
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
    :func:`byte_level` of `` word`` for byte-level BPE, e.g. ``ĠÃł`` for `` à``): ``[(word, token_id)]``,
    each word once, in order of appearance."""
    spell = (lambda w: byte_level(" " + w)) if vocab.model == "gpt2" else (lambda w: "▁" + w)
    seen: dict[str, int] = {}
    for t in texts:
        for w in _WORD.findall(t):
            tid = vocab.index.get(spell(w))
            if w not in seen and tid is not None and vocab.type_of(tid) == NORMAL:
                seen[w] = tid
    return list(seen.items())


def probe_texts(*, markers: bool = False) -> list[str]:
    """What a served tokenizer is checked on (a converted GGUF's here, every folder's in the runtime oracle): one
    plain sentence, the numerical gate's reference texts line by line (``modelyard/data/reference-texts.yaml``),
    then the whole texts of ``modelyard/data/tokenizer-probe.yaml`` (indented code, runs of spaces and tabs, CJK,
    accents); with ``markers`` also its chat role-marker texts (ChatML, Llama-3, Gemma, Mistral), which are
    compared as ids only."""
    import yaml  # noqa: PLC0415 - light, but only needed here

    data = yaml.safe_load((paths.DATA / "reference-texts.yaml").read_text(encoding="utf-8"))
    lines = [ln for t in data["texts"] for ln in t["text"].splitlines() if ln.strip()]
    probe = yaml.safe_load((paths.DATA / "tokenizer-probe.yaml").read_text(encoding="utf-8"))
    extra = [t["text"] for t in probe["texts"] if markers or not t.get("markers")]
    return ["The capital of France is Paris.", *lines, *extra]


Encode = Callable[[str, bool], list[int]]
#: llama.cpp's own encoding of a text (``parse_special``, no bos/eos), when the caller has it; None: not compared
Reference = Callable[[str], "list[int] | None"]


def compare(vocab: GgufVocab, encode: Encode, texts: Sequence[str], *, file: str = "tokenizer.json",
            reference: Reference | None = None) -> list[Finding]:
    """Findings where ``encode`` (the converted tokenizer: ``encode(text, add_special_tokens)``) disagrees
    with ``vocab`` read as llama.cpp reads it, over ``texts``:

    - ``tokenizer.gguf.bos_policy``: bos added (or not) where llama.cpp would not (would);
    - ``tokenizer.gguf.splits_single_tokens``: words that are one token of the vocabulary come out as several;
    - ``tokenizer.gguf.encoding_mismatch``: whole texts encode to other ids than ``reference`` (llama.cpp
      itself) gives, or without it than :func:`hand_encode` (SentencePiece-BPE vocabularies only);
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
    want_of = reference or (lambda t: hand_encode(vocab, t))
    bad = []
    for t in texts:
        want = want_of(t)
        if want is not None and (got := encode(t, False)) != want:
            bad.append((t, got, want))
    if bad:
        t, got, want = bad[0]
        k = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        reader = "llama.cpp (llama-cpp-python)" if reference else "llama.cpp's algorithm read by hand"
        out.append(Finding(
            "tokenizer.gguf.encoding_mismatch", Severity.ERROR,
            f"{len(bad)} of {len(texts)} probe texts encode otherwise than {reader} reads the GGUF vocabulary "
            f"({len(got)} tokens against {len(want)}); first difference in {t[:40]!r} at token {k}: "
            f"{_pieces(vocab, got[k:k + 4])} against {_pieces(vocab, want[k:k + 4])}",
            file=file, field="model", value=len(bad),
            fix="Rebuild the tokenizer from the GGUF's own arrays (modelyard does for SentencePiece-BPE GGUFs).",
            source=SOURCE))
    return out


def summary(findings: Sequence[Finding]) -> list[dict[str, Any]]:
    """``findings`` as dicts (the conversion's record)."""
    return [f.to_dict() for f in findings]


@dataclass(frozen=True)
class TokenizerCheck:
    """What :func:`modelyard.stages.fetch.gguf.check_and_repair` found: the GGUF's tokenizer model
    (``tokenizer.ggml.model``), how many probe texts were compared, which reading was the reference (llama.cpp's,
    or the hand reading), whether the tokenizer was rebuilt, the findings before (and, when rebuilt, after) as
    stored finding dicts, why llama.cpp could not be the reference (None when it was, or was not installed) and
    the tokens whose ids llama.cpp's reading overrides (not compared; None when none)."""

    model: str
    checked: int
    reference: str
    repaired: bool
    findings: tuple[dict[str, Any], ...]
    after: tuple[dict[str, Any], ...] | None = None
    reference_error: str | None = None
    reference_overrides: tuple[str, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The record written beside the converted folder and carried as the snapshot's ``tokenizer_check``: ``{model,
        checked, reference, repaired, [reference_error | reference_overrides], findings, [after]}``."""
        d: dict[str, Any] = {"model": self.model, "checked": self.checked, "reference": self.reference,
                             "repaired": self.repaired}
        if self.reference_error is not None:
            d["reference_error"] = self.reference_error
        if self.reference_overrides is not None:
            d["reference_overrides"] = list(self.reference_overrides)
        d["findings"] = list(self.findings)
        if self.after is not None:
            d["after"] = list(self.after)
        return d
