"""Chat templates against a vetted baseline: the published templates of the known model families.

``modelyard/data/template-baselines.yaml`` holds, per family, the sha256 of its published ``chat_template`` (UTF-8)
and a 16-hex-digit sha256 of each of its pieces (:func:`pieces`: its lines cut at Jinja tags, so a template written
on one line, as DeepSeek-R1's, has pieces too; the hashes, not the text). A template whose sha256 is a baseline's is
that family's, as published: nothing to say. A template that holds at least :data:`NEAR_COPY_SHARE` of a baseline's
pieces but is not byte-identical is a near-copy of it, and each piece it adds, changes or drops is named
(``security.template.baseline_deviation``): one line injected into Llama 3.1's template reads as a hidden edit,
however it is worded and in whatever language, where rules that look for instruction cues only catch what they
know.

The same file holds the words the known families' templates write into a conversation beyond role markup and the
conversation itself (``emitted_words``: default system prompts, tool-calling instructions, date lines; rendered in
the sandbox on the sample conversations). A template that writes :data:`UNKNOWN_WORDS_MIN` or more words none of them
writes (``security.template.unknown_text``, a warning) adds text of its own, in whatever language: the instruction
cues of :mod:`~modelyard.checks.template_risk` know English and a few others, this rule knows what real templates say.

Rule source: the families' own published templates (the zoo the healthy-template tests render), hashed by the test
that keeps this file in step with them; transformers renders a ``chat_template`` string verbatim, so a byte that
differs is a template that differs.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

import yaml

from modelyard.checks.base import CheckContext, Finding, Severity, check
from modelyard.checks.template_risk import (
    INSTRUCTION_CUES,
    MAX_TEMPLATE_BYTES,
    ROLE_WORDS,
    folded,
    residual_text,
    specials_of,
    templates_of,
)
from modelyard.checks.template_sandbox import rendered_once
from modelyard.model.checkpoint import Checkpoint
from modelyard.paths import DATA
from modelyard.text import printable

#: the file of vetted baselines, package data
BASELINES = DATA / "template-baselines.yaml"
#: the share of a baseline's pieces a template must hold (whole pieces, any order) to be read as a copy of it
NEAR_COPY_SHARE = 0.9
#: pieces named in a finding's message, at most
SHOWN = 3
SOURCE = ("the published chat templates of the known families (modelyard/data/template-baselines.yaml: sha256 of each "
          "template and of each of its pieces)")
_TAG = re.compile(r"(\{[{%#].*?[}%#]\})")
#: a template that writes this many words no known family's template writes adds text of its own
UNKNOWN_WORDS_MIN = 3
#: a word: two or more letters of a spaced script, or one character of a script written without spaces (Han, kana)
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_WORD = re.compile(f"[{_CJK}]|[^\\W\\d_{_CJK}]{{2,}}")


def pieces(template: str) -> list[tuple[int, str]]:
    """``template`` cut into pieces: each line (1-based number) split at its Jinja tags (``{{ }}``, ``{% %}``,
    ``{# #}``, kept as pieces of their own), each piece stripped of surrounding whitespace; empty ones dropped."""
    out = []
    for n, line in enumerate(template.split("\n"), 1):
        out += [(n, p.strip()) for p in _TAG.split(line) if p.strip()]
    return out


@dataclass(frozen=True)
class Baseline:
    """One family's published template: ``family`` (label), ``repo`` (a Hub repository that ships it), ``sha256``
    (hex, of the UTF-8 text) and ``pieces`` (the 16-hex-digit sha256 of each of its :func:`pieces`, in order)."""

    family: str
    repo: str
    sha256: str
    pieces: tuple[str, ...]


def piece_hash(piece: str) -> str:
    """The first 16 hex digits of the sha256 of ``piece`` (UTF-8)."""
    return hashlib.sha256(piece.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def baseline_of(family: str, repo: str, template: str) -> dict[str, Any]:
    """The stored form of ``template`` as a baseline: ``{family, repo, sha256, pieces}``."""
    return {"family": family, "repo": repo, "sha256": hashlib.sha256(template.encode("utf-8")).hexdigest(),
            "pieces": [piece_hash(p) for _, p in pieces(template)]}


@cache
def baselines() -> tuple[Baseline, ...]:
    """The vetted baselines (read once per process). Raises ``OSError`` / ``yaml.YAMLError`` for a broken install."""
    doc = yaml.safe_load(BASELINES.read_text())
    return tuple(Baseline(b["family"], b["repo"], b["sha256"], tuple(b["pieces"])) for b in doc["baselines"])


@dataclass(frozen=True)
class Deviation:
    """How a template departs from the baseline it is a near-copy of: its ``added`` pieces (1-based line number and
    text: pieces the baseline does not have, changed ones included) and the count of baseline pieces it ``dropped``."""

    baseline: Baseline
    added: tuple[tuple[int, str], ...]
    dropped: int


def deviation(source: str) -> Deviation | None:
    """The deviation of ``source`` from the baseline it copies, or None: when it is a baseline byte for byte, or
    holds under :data:`NEAR_COPY_SHARE` of every baseline's pieces."""
    digest = hashlib.sha256(source.encode("utf-8", "surrogatepass")).hexdigest()
    known = baselines()
    if any(b.sha256 == digest for b in known):
        return None
    mine = pieces(source)
    hashes = [piece_hash(p) for _, p in mine]
    have = Counter(hashes)
    best: tuple[float, Baseline] | None = None
    for b in known:
        want = Counter(b.pieces)
        share = sum((have & want).values()) / max(1, len(b.pieces))
        if share >= NEAR_COPY_SHARE and (best is None or share > best[0]):
            best = (share, b)
    if best is None:
        return None
    b = best[1]
    left = Counter(b.pieces)
    added = []
    for h, (n, text) in zip(hashes, mine):
        if left[h] > 0:
            left[h] -= 1
        else:
            added.append((n, text))
    return Deviation(b, tuple(added), sum(left.values()))


def baseline_findings(source: str, file: str, field: str) -> list[Finding]:
    """``security.template.baseline_deviation`` (warning) for a template that is a near-copy of a family's
    published one but not byte-identical, naming the family, its repository and the pieces that differ."""
    d = deviation(source)
    if d is None:
        return []
    shown = "; ".join(f"line {n}: {printable(t)[:120]!r}" for n, t in d.added[:SHOWN])
    more = f" (+{len(d.added) - SHOWN} more)" if len(d.added) > SHOWN else ""
    parts = [f"{len(d.added)} piece(s) added or changed" + (f": {shown}{more}" if shown else "")] if d.added else []
    if d.dropped:
        parts.append(f"{d.dropped} of its piece(s) dropped")
    first = d.added[0] if d.added else None
    return [Finding("security.template.baseline_deviation", Severity.WARNING,
                    f"the chat template is a near-copy of {d.baseline.family}'s published template ({d.baseline.repo}, "
                    f"sha256 {d.baseline.sha256[:16]}…) with {' and '.join(parts)}",
                    file=file, field=field, value=printable(first[1])[:200] if first else None,
                    fix=f"Compare it with {d.baseline.repo}'s chat template line by line; unless every difference is "
                        "yours and intended, serve the published template.",
                    source=SOURCE)]


def written_words(source: str, bos_token: str = "", eos_token: str = "", specials: tuple[str, ...] = ()) -> list[str]:
    """The words (letters, two or more, any script; lowercased; role names dropped) that ``source`` writes into the
    sample conversations beyond role markup and the messages (:func:`~modelyard.checks.template_risk.residual_text`),
    in order of first appearance; ``[]`` when it cannot be rendered (the render findings say why)."""
    got = rendered_once(source, bos_token, eos_token)
    if isinstance(got, str):
        return []
    seen: dict[str, None] = {}
    for r in got:
        for w in _WORD.findall(residual_text(r.text, specials) if r.text is not None else ""):
            if w.lower() not in ROLE_WORDS:
                seen.setdefault(w.lower())
    return list(seen)


@cache
def emitted_words() -> frozenset[str]:
    """What the known families' templates write (:func:`written_words` of each), from :data:`BASELINES`."""
    return frozenset(yaml.safe_load(BASELINES.read_text()).get("emitted_words") or ())


def unknown_text_findings(source: str, file: str, field: str, *, bos_token: str = "", eos_token: str = "",
                          specials: tuple[str, ...] = ()) -> list[Finding]:
    """``security.template.unknown_text`` (warning) for a template that writes :data:`UNKNOWN_WORDS_MIN` or more words
    that no known family's template writes (:func:`emitted_words`); none where the rendering already reads as an
    instruction (``security.template.hidden_instruction`` names it)."""
    words = written_words(source, bos_token, eos_token, specials)
    new = [w for w in words if w not in emitted_words()]
    got = rendered_once(source, bos_token, eos_token)
    texts = [residual_text(r.text, specials) for r in got if r.text is not None] if not isinstance(got, str) else []
    if len(new) < UNKNOWN_WORDS_MIN or any(INSTRUCTION_CUES.search(folded(t)) for t in texts):
        return []
    sample = next((t for t in texts if any(w in t.lower() for w in new)), "")
    return [Finding("security.template.unknown_text", Severity.WARNING,
                    f"the chat template writes text into the conversation that no known family's template writes "
                    f"({len(new)} words of its own, e.g. {', '.join(new[:6])}): {printable(sample)[:240]!r}",
                    file=file, field=field, value=new[:20],
                    fix="Read what the template adds beyond role markup: a chat format adds markup, not text; replace it "
                        "with the base model's published template unless the text is yours.",
                    source="the text the published chat templates of the known families write beyond role markup "
                           "(modelyard/data/template-baselines.yaml, emitted_words)")]


@check("security")
def chat_template_baseline(ckpt: Checkpoint, ctx: CheckContext) -> Iterator[Finding]:
    """Every chat template of the checkpoint against the vetted baselines of the known families, and the text it
    writes against theirs."""
    tc = ckpt.tokenizer_config or {}
    tokens = {k: (v.get("content") if isinstance(v, dict) else v) for k in ("bos_token", "eos_token") if (v := tc.get(k))}
    for file, field, source in templates_of(ckpt):
        if len(source.encode("utf-8", "replace")) <= MAX_TEMPLATE_BYTES:  # a longer one is template_risk's finding
            yield from baseline_findings(source, file, field)
            yield from unknown_text_findings(source, file, field, bos_token=str(tokens.get("bos_token") or ""),
                                             eos_token=str(tokens.get("eos_token") or ""), specials=specials_of(ckpt))
