"""bench_out: the ``bench`` load's files for ``--bench-out DIR``: ``bench.json`` (the bench result, levels
included) and ``bench.png``, the sweep plotted against concurrency.

The plot (matplotlib, Agg backend, :data:`FIGSIZE` inches at :data:`DPI`, so :data:`PIXELS`) has four
panels over the concurrency levels (log2 axis): TTFT, ITL and end-to-end latency at p50/p95/p99 (ms), and
request and output-token throughput (per second). Each panel draws the SLO targets that bound its figures
as dashed horizontal lines (the latency ``max`` targets of :data:`~modelyard.stages.smoke.bench.SLO_METRICS`;
the throughput ``min`` targets), and a dotted vertical line marks the sizing answer (the highest
concurrency meeting the targets). Both files are written atomically (a temp file in DIR, then renamed).
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
    xs = [x["concurrency"] for x in levels]
    targets = _targets(bench)
    best = bench.get("max_concurrency_meeting_slo")
    fig = Figure(figsize=FIGSIZE, dpi=DPI)
    axes = fig.subplots(2, 2).ravel()
    styles = {50: "-", 95: "--", 99: ":"}
    for ax, (title, metric) in zip(axes, LATENCY_PANELS, strict=False):
        for p in PERCENTILES:
            ax.plot(xs, [x.get(f"p{p}_{metric}_ms") for x in levels], styles[p], marker="o", label=f"p{p}")
        for p in PERCENTILES:
            if (limit := targets.get(f"{metric}_p{p}_ms")) is not None:
                ax.axhline(limit, color="red", linestyle="--", linewidth=1, label=f"SLO p{p} <= {limit:g} ms")
        ax.set_title(f"{title} (ms)")
        ax.set_ylabel("ms")
    ax = axes[3]
    ax.plot(xs, [x.get("output_throughput") for x in levels], marker="o", color="tab:blue", label="output tokens/s")
    if (limit := targets.get("output_tokens_per_s")) is not None:
        ax.axhline(limit, color="red", linestyle="--", linewidth=1, label=f"SLO >= {limit:g} tokens/s")
    ax.set_title("throughput")
    ax.set_ylabel("output tokens/s")
    rx = ax.twinx()
    rx.plot(xs, [x.get("request_throughput") for x in levels], marker="s", color="tab:green", label="requests/s")
    if (limit := targets.get("requests_per_s")) is not None:
        rx.axhline(limit, color="darkred", linestyle="-.", linewidth=1, label=f"SLO >= {limit:g} requests/s")
    rx.set_ylabel("requests/s")
    rx.legend(loc="lower right", fontsize=7)
    for ax in axes:
        if xs:
            ax.set_xscale("log", base=2)
            ax.set_xticks(xs, [str(x) for x in xs])
        if best is not None:
            ax.axvline(best, color="grey", linestyle=":", linewidth=1.5, label=f"meets SLO up to {best}")
        ax.set_xlabel("concurrency")
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", fontsize=7)
    fig.suptitle(f"vLLM bench sweep: highest concurrency meeting the SLO: {best if best is not None else 'none'}")
    fig.savefig(dst, format="png")
