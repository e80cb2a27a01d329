"""sweep: what the ``bench`` load sends, per concurrency level, and which level sizes the server.

A load is :class:`BenchSpec`: concurrency levels (vLLM bench's ``--max-concurrency``, one run per
level, lowest first), per level either a request count or a duration, and a prompt/answer length mix:

- **random** (vLLM bench's ``random`` dataset): prompts of ``input_len`` tokens, ``output_len`` output
  tokens each; ``range_ratio`` r in [0, 1) draws each length uniformly from [len x (1 - r), len x (1 + r)]
  (vLLM's ``--random-range-ratio``).
- **a prompts file** (``--prompts FILE``, :func:`load_prompts`): JSONL, one ``{"prompt": str,
  "output_len": int}`` per line, ``output_len`` optional (default ``output_len``). It is rewritten for
  vLLM bench's ``custom`` dataset (``vllm/benchmarks/datasets/datasets.py``, ``CustomDataset``: a
  ``.jsonl`` file with ``prompt`` and ``output_tokens``, read with ``--custom-output-len -1``; it
  shuffles the rows with the bench seed 0, takes the first N and repeats random rows when N exceeds
  the file). The prompt goes as the user message (chat) or the plain prompt (completion) unchanged:
  ``--skip-chat-template``, the server applies the model's template.

Every request generates exactly its output length (``--ignore-eos``), so the token counts are the mix's.

A **duration** level (``--duration SECONDS``) is sized, not timed: vLLM bench sends a fixed list of
requests and has no time bound, so the runner (``runtime/scripts/vllm_bench.py``) first sends a probe of
two rounds of the level's concurrency, then ceil(probe requests/s x SECONDS) requests (at most 10000);
the level's ``duration`` is vLLM's measured wall time of that run, which is about SECONDS, not exactly.

The sizing answer (:func:`sized_concurrency`) is the highest level such that it **and every level
below it** met the service-level targets: latency grows with concurrency, so a level that passes above
one that missed is noise of a short load, not a safe size.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelyard.errors import InvalidTargetError

#: a sweep's levels, at most (each is one vLLM bench run)
MAX_LEVELS = 16


@dataclass(frozen=True)
class BenchSpec:
    """The load of the ``bench`` level: ``num_prompts`` requests per level (or ``duration`` seconds per
    level), ``max_concurrency`` in flight (the highest of ``concurrency``, the levels; empty: one level,
    ``max_concurrency``), random prompts of ``input_len`` tokens and ``output_len`` output tokens
    (spread by ``range_ratio``) unless ``prompts`` (a JSONL file, :func:`load_prompts`), each run within
    ``timeout`` seconds (plus twice ``duration``). ``prompts_source``: ``path@sha256:<12 hex>``.
    ``request_rates``: an **open-loop** sweep instead (requests/s, lowest first): each level offers that rate with
    Poisson arrivals (vLLM bench's ``--request-rate`` with ``--burstiness 1``), whatever the server's answers do,
    which a capacity test needs; ``concurrency``'s one level, when given, caps the requests in flight."""

    num_prompts: int = 8
    max_concurrency: int = 4
    input_len: int = 32
    output_len: int = 16
    timeout: float = 300.0
    concurrency: tuple[int, ...] = ()
    duration: float | None = None
    range_ratio: float = 0.0
    prompts: str | None = None
    prompts_source: str | None = None
    request_rates: tuple[float, ...] = ()

    @property
    def levels(self) -> tuple[int, ...]:
        """The concurrency levels, lowest first."""
        return self.concurrency or (self.max_concurrency,)

    @property
    def open_loop(self) -> bool:
        """True for a sweep of arrival rates (:attr:`request_rates`), False for one of concurrency levels."""
        return bool(self.request_rates)

    @property
    def level_key(self) -> str:
        """What a level of this sweep is named by in its results: ``request_rate`` or ``concurrency``."""
        return "request_rate" if self.open_loop else "concurrency"


def parse_rates(text: str) -> tuple[float, ...]:
    """``--request-rate`` text, ``0.5,1,2``, to the arrival rates (requests/s) in ascending order. Raises
    :class:`InvalidTargetError` (exit 2) for an item that is not a finite number > 0, a rate given twice, no rate,
    or more than :data:`MAX_LEVELS`."""
    rates: list[float] = []
    fix = "Give the arrival rates in requests per second, e.g. --request-rate 0.5,1,2,4."
    for item in (s.strip() for s in text.split(",")):
        if not item:
            continue
        try:
            r = float(item)
        except ValueError:
            r = float("nan")
        if not (math.isfinite(r) and r > 0):
            raise InvalidTargetError(f"--request-rate {item!r} is not a number of requests per second > 0", fix=fix)
        if r in rates:
            raise InvalidTargetError(f"--request-rate gives {item} twice", fix="Give each rate once.")
        rates.append(r)
    if not rates or len(rates) > MAX_LEVELS:
        raise InvalidTargetError(f"--request-rate {text!r} gives {len(rates)} rates", fix=f"Give 1 to {MAX_LEVELS} rates.")
    return tuple(sorted(rates))


def parse_levels(text: str) -> tuple[int, ...]:
    """``--concurrency`` text, ``1,2,4``, to the levels in ascending order. Raises
    :class:`InvalidTargetError` (exit 2) for an item that is not an integer >= 1, a level given twice, no
    level, or more than :data:`MAX_LEVELS`."""
    levels: list[int] = []
    for item in (s.strip() for s in text.split(",")):
        if not item:
            continue
        if not item.isdigit() or int(item) < 1:
            raise InvalidTargetError(f"--concurrency {item!r} is not an integer >= 1",
                                     fix="Give the levels as integers, e.g. --concurrency 1,2,4,8.")
        if int(item) in levels:
            raise InvalidTargetError(f"--concurrency gives {item} twice", fix="Give each level once.")
        levels.append(int(item))
    if not levels or len(levels) > MAX_LEVELS:
        raise InvalidTargetError(f"--concurrency {text!r} gives {len(levels)} levels",
                                 fix=f"Give 1 to {MAX_LEVELS} levels, e.g. --concurrency 1,2,4,8.")
    return tuple(sorted(levels))


#: the most of a prompts file that is read (bytes): a sweep's prompts are a few MiB at most
PROMPTS_MAX_BYTES = 64 << 20


def load_prompts(path: Path, output_len: int) -> list[dict[str, Any]]:
    """The rows of a prompts file (JSONL: ``{"prompt": non-empty str, "output_len": int >= 1}`` per
    line, ``output_len`` optional, default ``output_len``; blank lines skipped) as
    ``[{"prompt", "output_len"}]``. Raises :class:`InvalidTargetError` (exit 2) naming the line for a
    missing file, bad JSON, a missing or empty prompt, a bad output_len or another key, for a file
    without a prompt, and for one over :data:`PROMPTS_MAX_BYTES` bytes (``/dev/zero`` never ends)."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(PROMPTS_MAX_BYTES + 1)  # a device (/dev/zero) or a huge file is not read to the end
        if len(data) > PROMPTS_MAX_BYTES:
            raise InvalidTargetError(f"--prompts {path} is over {PROMPTS_MAX_BYTES:,} bytes (or never ends)",
                                     fix="Pass a JSONL file of prompts, one {\"prompt\": ...} per line, of at most "
                                         f"{PROMPTS_MAX_BYTES >> 20} MiB.")
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidTargetError(f"--prompts {path}: cannot read it ({exc})",
                                 fix="Pass a UTF-8 JSONL file, one {\"prompt\": ...} per line.") from exc
    fix = 'Write one JSON object per line: {"prompt": "...", "output_len": 64} (output_len optional, tokens).'
    rows = []
    for no, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise InvalidTargetError(f"--prompts {path} line {no} is not JSON ({exc})", fix=fix) from exc
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str) or not row["prompt"].strip():
            raise InvalidTargetError(f"--prompts {path} line {no} has no non-empty \"prompt\" string", fix=fix)
        if set(row) - {"prompt", "output_len"}:
            raise InvalidTargetError(f"--prompts {path} line {no} has unknown keys "
                                     f"{sorted(set(row) - {'prompt', 'output_len'})}", fix=fix)
        n = row.get("output_len", output_len)
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise InvalidTargetError(f"--prompts {path} line {no}: output_len {n!r} is not an integer >= 1", fix=fix)
        rows.append({"prompt": row["prompt"], "output_len": n})
    if not rows:
        raise InvalidTargetError(f"--prompts {path} holds no prompt", fix=fix)
    return rows


def bench_spec(*, concurrency: str | None = None, requests: int | None = None, duration: float | None = None,
               input_len: int | None = None, output_len: int | None = None, range_ratio: float | None = None,
               prompts: Path | None = None, request_rate: str | None = None) -> BenchSpec:
    """The :class:`BenchSpec` of the ``smoke`` options; all None gives the default load. Raises
    :class:`InvalidTargetError` (exit 2) for ``requests`` with ``duration``, ``input_len`` or
    ``range_ratio`` with ``prompts``, a ``range_ratio`` outside [0, 1), a count or length < 1, a
    duration <= 0, ``request_rate`` with more than one ``concurrency`` level (there it is the cap), and for a
    bad level or rate list or prompts file (:func:`parse_levels`, :func:`parse_rates`, :func:`load_prompts`)."""
    rates = parse_rates(request_rate) if request_rate else ()
    if rates and concurrency and len(parse_levels(concurrency)) > 1:
        raise InvalidTargetError(f"--request-rate sweeps arrival rates; --concurrency {concurrency!r} gives several "
                                 "levels", fix="Give --concurrency one value (the cap of requests in flight), or drop it.")
    if requests is not None and duration is not None:
        raise InvalidTargetError("--requests and --duration both bound a level", fix="Pass one of them.")
    if prompts is not None and (input_len is not None or range_ratio is not None):
        raise InvalidTargetError("--input-len and --range-ratio shape random prompts, not a --prompts file",
                                 fix="Drop them, or drop --prompts (output_len rows of the file win over --output-len).")
    if range_ratio is not None and not 0.0 <= range_ratio < 1.0:
        raise InvalidTargetError(f"--range-ratio {range_ratio} is outside [0, 1)",
                                 fix="vLLM bench draws lengths in [len x (1 - r), len x (1 + r)]; give r in [0, 1).")
    if any(v is not None and v < 1 for v in (requests, input_len, output_len)):
        raise InvalidTargetError("--requests, --input-len and --output-len must be >= 1", fix="Give counts >= 1.")
    if duration is not None and not (math.isfinite(duration) and duration > 0):
        raise InvalidTargetError(f"--duration {duration} is not a number of seconds > 0", fix="Give e.g. --duration 60.")
    base = BenchSpec()
    levels = parse_levels(concurrency) if concurrency else ()
    source = None
    if prompts is not None:
        load_prompts(prompts, output_len or base.output_len)  # refused here, before any server starts
        source = f"{prompts}@sha256:{hashlib.sha256(prompts.read_bytes()).hexdigest()[:12]}"
    return BenchSpec(num_prompts=requests or base.num_prompts, max_concurrency=max(levels or (base.max_concurrency,)),
                     input_len=input_len or base.input_len, output_len=output_len or base.output_len,
                     concurrency=levels, duration=duration, range_ratio=range_ratio or 0.0,
                     prompts=str(prompts) if prompts else None, prompts_source=source, request_rates=rates)


def dataset_args(spec: BenchSpec, tmp: Path) -> list[str]:
    """vLLM bench's dataset arguments for ``spec``; a prompts file is rewritten to ``tmp/prompts.jsonl``
    in the ``custom`` dataset's format (``prompt``, ``output_tokens``)."""
    if spec.prompts is None:
        return ["--dataset-name", "random", "--random-input-len", str(spec.input_len), "--random-output-len",
                str(spec.output_len), "--random-range-ratio", str(spec.range_ratio)]
    dst = tmp / "prompts.jsonl"  # CustomDataset reads only names ending in .jsonl
    dst.write_text("".join(json.dumps({"prompt": r["prompt"], "output_tokens": r["output_len"]}) + "\n"
                           for r in load_prompts(Path(spec.prompts), spec.output_len)), encoding="utf-8")
    return ["--dataset-name", "custom", "--dataset-path", str(dst), "--custom-output-len", "-1",
            "--skip-chat-template"]


def sized_concurrency(levels: Sequence[Mapping[str, Any]], key: str = "concurrency") -> Any:
    """The sizing answer: the highest ``key`` (``concurrency``, or ``request_rate`` for an open-loop sweep) of
    ``levels`` (lowest first) such that it and every level below it passed (``passed``: all requests accounted
    for and every target met); None when the lowest did not."""
    best = None
    for level in levels:
        if not level.get("passed"):
            break
        best = level[key]
    return best


def open_loop_requests(rate: float, duration: float) -> int:
    """Requests an open-loop level of ``rate`` requests/s sends to last about ``duration`` seconds:
    ceil(rate x duration), at least 1 (arrivals do not wait for answers, so no probe is needed)."""
    return max(1, math.ceil(rate * duration))
