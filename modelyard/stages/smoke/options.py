"""What a user asks of the smoke stage in ``ingest`` and a watch YAML: whether and how deep to smoke, the
golden prompts, and the bench's service-level targets."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

from modelyard.model.options import Flag
from modelyard.stages.smoke.bench import SLO_METRICS
from modelyard.stages.smoke.server import LEVELS

#: ``--help`` text of ``--slo`` (``ingest`` and ``smoke``)
SLO_HELP = ("bench targets, e.g. ttft_p95_ms=500,itl_p95_ms=50,error_rate=0 (keys: " + ", ".join(SLO_METRICS)
            + "); others: the class defaults")
#: ``--help`` text of ``--slo-class`` (``ingest`` and ``smoke``)
SLO_CLASS_HELP = "default targets of this class: cpu or a GPU such as H100-80GB (default: the device the vLLM runtime runs on)"


class SmokeFlags(BaseModel):
    """``smoke`` False: no smoke; ``smoke_level``: load, server or bench (the levels of
    :mod:`modelyard.stages.smoke.server`); ``golden``: a YAML of golden prompts (server, bench; default
    modelyard/data/golden-demo.yaml); ``slo``: bench targets ``key=value,...``; ``slo_class``: the row of
    default targets (cpu or a GPU class; None: the runtime's device)."""

    model_config = ConfigDict(frozen=True)

    smoke: Annotated[bool, Flag("--no-smoke", negate=True)] = Field(True, description="skip the vLLM smoke load")
    smoke_level: Annotated[Literal[LEVELS], Flag("--smoke", choices=LEVELS)] = Field(  # type: ignore[valid-type]
        "load", description="load (in-process chat), server (OpenAI server checks + golden prompts) or bench "
                            "(server + a short load test)")
    golden: Annotated[Optional[str], Flag("--golden", cli_type=Path)] = Field(
        None, description="golden prompts YAML for --smoke server|bench (default: the demo set of the serving mode)")
    slo: Annotated[Optional[str], Flag("--slo")] = Field(None, description=SLO_HELP)
    slo_class: Annotated[Optional[str], Flag("--slo-class")] = Field(None, description=SLO_CLASS_HELP)


class BenchLoadFlags(BaseModel):
    """The ``bench`` load of ``modelyard smoke`` (:func:`modelyard.stages.smoke.sweep.bench_spec` checks
    them): concurrency levels, requests or seconds per level, the prompt/answer length mix (tokens) or a
    prompts file, and where to write bench.json and its plot. None: the default load."""

    model_config = ConfigDict(frozen=True)

    concurrency: Annotated[Optional[str], Flag("--concurrency")] = Field(
        None, description="bench: concurrency levels to sweep, e.g. 1,2,4,8 (one vLLM bench run each; default 4)")
    request_rate: Annotated[Optional[str], Flag("--request-rate")] = Field(
        None, description="bench: an open-loop sweep of arrival rates instead, requests/s, e.g. 0.5,1,2 (Poisson "
                          "arrivals whatever the answers do; --concurrency, one value, caps the requests in flight)")
    requests: Annotated[Optional[int], Flag("--requests")] = Field(None, description="bench: requests per level (default 8)")
    duration: Annotated[Optional[float], Flag("--duration")] = Field(
        None, description="bench: seconds per level instead of --requests (sized from a probe of the level)")
    input_len: Annotated[Optional[int], Flag("--input-len")] = Field(
        None, description="bench: random prompt length (tokens, default 32)")
    output_len: Annotated[Optional[int], Flag("--output-len")] = Field(
        None, description="bench: answer length (tokens, default 16; the default of --prompts rows without output_len)")
    range_ratio: Annotated[Optional[float], Flag("--range-ratio")] = Field(
        None, description="bench: spread r in [0, 1) of random lengths, drawn in [len x (1 - r), len x (1 + r)]")
    prompts: Annotated[Optional[str], Flag("--prompts", cli_type=Path)] = Field(
        None, description='bench: JSONL of {"prompt": ..., "output_len": N} rows to sample instead of random prompts')
    bench_out: Annotated[Optional[str], Flag("--bench-out", cli_type=Path)] = Field(
        None, description="bench: write DIR/bench.json and DIR/bench.png (latency and throughput vs concurrency)")
