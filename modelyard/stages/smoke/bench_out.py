"""bench_out: the ``bench`` load's files for ``--bench-out DIR``: ``bench.json`` (the bench result, levels
included) and ``bench.png``, the sweep plotted against concurrency.

The plot (matplotlib, Agg backend, constrained layout so that no label overlaps another, :data:`FIGSIZE` inches
at :data:`DPI`, so :data:`PIXELS`) has six panels over the levels (log2 axis: the concurrency levels, or the
offered arrival rates of an open-loop sweep): TTFT, ITL and end-to-end latency at p50/p95/p99 (ms, log axis, so
p50 and p99 a decade apart both stay readable), output-token and request throughput (per second, each on its own
panel; an open-loop sweep also draws the offered rate), and the failed requests. Each panel draws the SLO
targets that bound its figures as dashed horizontal lines (the latency ``max`` targets of
:data:`~modelyard.stages.smoke.bench.SLO_METRICS`; the throughput ``min`` targets), except a latency target more
than 10x above every figure, which would squash the data and is named in the panel's title instead; a dotted
vertical line marks the sizing answer (the highest level meeting the targets). Both files are written
atomically (a temp file in DIR, then renamed).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from modelyard.stages.smoke.bench import PERCENTILES

BENCH_JSON = "bench.json"
BENCH_PNG = "bench.png"
FIGSIZE = (11.0, 7.5)  # inches
DPI = 100
PIXELS = (int(FIGSIZE[0] * DPI), int(FIGSIZE[1] * DPI))  # width, height of bench.png
#: the latency panels: (title, vLLM's metric name in its keys ``p95_<metric>_ms``)
LATENCY_PANELS = (("TTFT", "ttft"), ("inter-token latency", "itl"), ("end-to-end latency", "e2el"))


def _atomic(dst: Path, write) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{dst.name}.", dir=dst.parent)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, dst)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_bench_out(out_dir: Path, bench: Mapping[str, Any]) -> dict[str, str]:
    """Write ``out_dir/bench.json`` (``bench`` as JSON) and ``out_dir/bench.png`` (:func:`plot`);
    ``out_dir`` is created. Returns ``{"json": path, "plot": path}``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    js, png = out_dir / BENCH_JSON, out_dir / BENCH_PNG
    _atomic(js, lambda tmp: Path(tmp).write_text(json.dumps(bench, indent=2, sort_keys=True) + "\n"))
    _atomic(png, lambda tmp: plot(bench, Path(tmp)))
    return {"json": str(js), "plot": str(png)}


def _targets(bench: Mapping[str, Any]) -> dict[str, float]:
    """The SLO targets the levels were judged against: ``{key: limit}``."""
    levels = bench.get("levels") or []
    slo = (levels[0].get("slo") if levels else None) or bench.get("slo") or {}
    return {v["target"]: v["limit"] for v in slo.get("verdicts", [])}


def plot(bench: Mapping[str, Any], dst: Path) -> None:
    """Plot ``bench``'s levels (see the module docstring) as a PNG at ``dst``."""
    import matplotlib  # noqa: PLC0415 - heavy, imported only when a plot is asked for

    matplotlib.use("Agg")
    from matplotlib.figure import Figure  # noqa: PLC0415 - after choosing the Agg backend

    levels = [x for x in bench.get("levels") or [] if x.get("completed")]
    rated = any(x.get("request_rate") is not None for x in levels)
    key = "request_rate" if rated else "concurrency"
    xs = [x[key] for x in levels]
    targets = _targets(bench)
    best = bench.get("max_request_rate_meeting_slo" if rated else "max_concurrency_meeting_slo")
    fig = Figure(figsize=FIGSIZE, dpi=DPI, layout="constrained")
    axes = fig.subplots(2, 3).ravel()
    styles = {50: "-", 95: "--", 99: ":"}
    for ax, (title, metric) in zip(axes, LATENCY_PANELS, strict=False):
        values = [v for p in PERCENTILES for x in levels if isinstance(v := x.get(f"p{p}_{metric}_ms"), (int, float))]
        for p in PERCENTILES:
            ax.plot(xs, [x.get(f"p{p}_{metric}_ms") for x in levels], styles[p], marker="o", label=f"p{p}")
        for p in PERCENTILES:
            limit = targets.get(f"{metric}_p{p}_ms")
            if limit is None:
                continue
            if values and limit > 10 * max(values):  # drawn, it would squash the data: said in the title instead
                ax.set_title(f"{title} (ms); SLO p{p} <= {limit:g} ms, off the scale", fontsize=9)
                continue
            ax.axhline(limit, color="red", linestyle="--", linewidth=1, label=f"SLO p{p} <= {limit:g} ms")
        if not ax.get_title():
            ax.set_title(f"{title} (ms)", fontsize=9)
        if values and min(values) > 0:
            ax.set_yscale("log")  # p50 and p99 a decade apart both stay readable
        ax.set_ylabel("ms (log)")
    for ax, (title, field, unit, target) in zip(axes[3:5], (
            ("output token throughput", "output_throughput", "tokens/s", "output_tokens_per_s"),
            ("request throughput", "request_throughput", "requests/s", "requests_per_s")), strict=True):
        ax.plot(xs, [x.get(field) for x in levels], marker="o", color="tab:blue", label=unit)
        if (limit := targets.get(target)) is not None:
            ax.axhline(limit, color="red", linestyle="--", linewidth=1, label=f"SLO >= {limit:g} {unit}")
        if rated and field == "request_throughput":  # what was offered, beside what was served
            ax.plot(xs, xs, color="grey", linewidth=0.8, linestyle=":", label="offered")
        ax.set_title(title, fontsize=9)
        ax.set_ylabel(unit)
    ax = axes[5]
    ax.bar([str(x) for x in xs], [x.get("failed") or 0 for x in levels], color="tab:red", label="failed")
    ax.set_title("failed requests", fontsize=9)
    ax.set_ylabel("requests")
    label = "offered requests/s (Poisson arrivals)" if rated else "concurrency"
    for ax in axes[:5]:
        if xs:
            ax.set_xscale("log", base=2)
            ax.set_xticks(xs, [f"{x:g}" for x in xs])
            ax.minorticks_off()
        if best is not None:
            ax.axvline(best, color="grey", linestyle=":", linewidth=1.5, label=f"meets SLO up to {best:g}")
    for ax in axes:
        ax.set_xlabel(label, fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize=7)
    what = "arrival rate" if rated else "concurrency"
    fig.suptitle(f"vLLM bench sweep ({'open loop' if rated else 'closed loop'}): highest {what} meeting the SLO: "
                 f"{f'{best:g}' if best is not None else 'none'}")
    fig.savefig(dst, format="png")
