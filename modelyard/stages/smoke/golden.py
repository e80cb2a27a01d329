"""Golden prompts of the server smoke: the prompts and what their answers must hold (a YAML file, or the demo
model's set per serving mode), and the verdict on one answer."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from modelyard import paths
from modelyard.checks.base import Finding, Severity
from modelyard.errors import InvalidTargetError
from modelyard.model.modes import DEFAULT_SERVE, check_mode

DATA = paths.DATA


@dataclass(frozen=True)
class GoldenPrompt:
    """One golden prompt: the user message, substrings that must all appear in the answer, an
    optional regex that must match, and the token budget."""

    name: str
    prompt: str
    expect: tuple[str, ...] = ()
    regex: str | None = None
    max_tokens: int = 64


@dataclass(frozen=True)
class GoldenVerdict:
    """The verdict on one golden answer: the ``answer`` text, the expected substrings ``missing`` from it, the
    ``regex`` and whether it matched (None without one); ``passed`` when nothing is missing and the regex matched.
    Its ``asdict`` is the ``golden`` entry of the smoke's JSON (docs/reference/json.md)."""

    name: str
    prompt: str
    answer: str
    missing: list[str]
    regex: str | None
    regex_matched: bool | None
    passed: bool

    def finding(self) -> Finding | None:
        """A missed golden answer as a ``smoke.golden.missed`` finding (None when it passed)."""
        if self.passed:
            return None
        why = ([f"misses {', '.join(map(repr, self.missing))}"] if self.missing else []) + (
            [f"does not match the regex {self.regex!r}"] if self.regex_matched is False else [])
        return Finding("smoke.golden.missed", Severity.ERROR,
                       f"golden prompt {self.name}: the answer {self.answer!r} {' and '.join(why)}",
                       field=self.name, value=self.answer,
                       fix="Read the answer against the golden file's expectations; a wrong answer from a healthy "
                           "model may mean the wrong revision or template.", source="the golden prompts")


#: the golden prompts used when none are given, per serving mode (both for the demo model)
DEFAULT_GOLDEN = {"chat": "golden-demo.yaml", "completion": "golden-demo-completion.yaml"}


def load_golden(path: Path | None, mode: str = DEFAULT_SERVE) -> tuple[list[GoldenPrompt], str]:
    """Golden prompts from a YAML file (``prompts: [{name, prompt, expect: [..], regex, max_tokens}]``);
    default: the demo model's set for serving ``mode`` (:data:`DEFAULT_GOLDEN` under ``modelyard/data``:
    questions for chat, text to continue for completion). Returns the prompts and a label
    ``path@sha256:<12 hex>``. Raises :class:`InvalidTargetError` (exit 2) naming the entry."""
    path = Path(path) if path else DATA / DEFAULT_GOLDEN[check_mode(mode)]
    try:
        raw = path.read_bytes()
        data = yaml.safe_load(raw)
    except (OSError, yaml.YAMLError) as exc:
        raise InvalidTargetError(f"--golden {path}: cannot read it as YAML ({exc})",
                                 fix="Pass a YAML file with a 'prompts' list.") from exc
    items = data.get("prompts") if isinstance(data, dict) else None
    if not isinstance(items, list) or not items:
        raise InvalidTargetError(f"--golden {path}: no 'prompts' list", fix="Write prompts: [{prompt: ..., expect: [...]}].")
    out = []
    for n, it in enumerate(items):
        if not isinstance(it, dict) or not isinstance(it.get("prompt"), str):
            raise InvalidTargetError(f"--golden {path}: prompts[{n}] has no 'prompt' string", fix="Give every entry a prompt.")
        expect = it.get("expect") or []
        expect = [expect] if isinstance(expect, str) else expect
        regex = it.get("regex")
        if regex is not None:
            try:
                re.compile(regex)
            except re.error as exc:
                raise InvalidTargetError(f"--golden {path}: prompts[{n}].regex {regex!r} is invalid ({exc})",
                                         fix="Fix the regular expression.") from exc
        if not expect and regex is None:
            raise InvalidTargetError(f"--golden {path}: prompts[{n}] has neither 'expect' nor 'regex'",
                                     fix="Say what the answer must contain.")
        mt = it.get("max_tokens", 64)
        if not isinstance(mt, int) or mt < 1:
            raise InvalidTargetError(f"--golden {path}: prompts[{n}].max_tokens {mt!r} is not a positive integer",
                                     fix="Use a token count such as 64.")
        out.append(GoldenPrompt(str(it.get("name") or f"prompt-{n}"), it["prompt"], tuple(map(str, expect)), regex, mt))
    return out, f"{path}@sha256:{hashlib.sha256(raw).hexdigest()[:12]}"


def judge_golden(g: GoldenPrompt, text: str | None) -> GoldenVerdict:
    """The :class:`GoldenVerdict` on the answer ``text`` (None: no answer, judged as empty) to ``g``."""
    text = text or ""
    missing = [e for e in g.expect if e not in text]
    regex_ok = g.regex is None or re.search(g.regex, text) is not None
    return GoldenVerdict(g.name, g.prompt, text, missing, g.regex, regex_ok if g.regex is not None else None,
                         not missing and regex_ok)
