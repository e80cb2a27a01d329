"""What a load smoke costs before the model's own work: the process layout, vLLM's cache and the warm engine host.

Baseline: the load smoke as it ran before (vllm serve's process layout, ``MODELYARD_SMOKE_ENGINE=process``: the
runner, an engine-core process and a worker process, each spawned by the CPU build and importing vLLM; vLLM's
cache in a fresh temp folder each run, ``MODELYARD_VLLM_CACHE=off``). Candidates, each changing one more thing:

1. ``process + kept cache``: vLLM's cache kept between runs (the model-class inspection is read, not recomputed);
2. ``inline + kept cache``: the engine in the runner's own process (the default now);
3. ``inline + kept cache + host``: the run forked from a warm engine host that imported vLLM once (what the test
   suite does; ``modelyard.runtime.engine_host``).

Runs interleave (baseline, 1, 2, 3, baseline, ...), ``--repeat`` rounds after one warm-up round that fills the kept
cache and the page cache; prints each run's wall time, the medians and each candidate's ratio to the baseline.
The model is a tiny random Llama (hidden 128) built here, or ``--model DIR``, asked greedily without the
numerical gate, so that the figures are the start-up, not the model. Needs the runtime venv (``make setup``).

    .venv/bin/python benchmarks/smoke_start.py [--repeat 3] [--model DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from modelyard.runtime import engine_host  # noqa: E402 - after the path set-up
from modelyard.runtime.venv import runtime_env  # noqa: E402
from modelyard.settings import Settings  # noqa: E402
from modelyard.stages.smoke import smoke_load  # noqa: E402
from tests.fixtures import make_tiny_llama  # noqa: E402

CONFIGS = {  # name -> (MODELYARD_SMOKE_ENGINE, MODELYARD_VLLM_CACHE is kept, hosted)
    "baseline: process, fresh cache": ("process", False, False),
    "process + kept cache": ("process", True, False),
    "inline + kept cache": ("inline", True, False),
    "inline + kept cache + host": ("inline", True, True),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--model", help="a safetensors model folder (default: a tiny random Llama built here)")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="smoke-start-"))
    model = Path(a.model) if a.model else make_tiny_llama(work / "tiny", hidden=128, intermediate=256)
    cache = work / "vllm-cache"
    base = Settings(home=work / "store")
    host_env = runtime_env(Settings(home=work / "store", vllm_cache=str(cache)), str(work / "host")) \
        | {"TORCH_COMPILE_DISABLE": "1"}
    proc, sock = engine_host.start(base.vllm_interpreter(), host_env, log=work / "host.log")
    times: dict[str, list[float]] = {name: [] for name in CONFIGS}
    try:
        for round_ in range(a.repeat + 1):
            for name, (layout, kept, hosted) in CONFIGS.items():
                os.environ["MODELYARD_ENGINE_HOST"] = sock if hosted else "off"
                settings = Settings(home=work / "store", smoke_engine=layout, vllm_cache=str(cache) if kept else "off")
                t0 = time.perf_counter()
                r = smoke_load(model, settings, question="w1 w2 w3", max_tokens=8, mode="completion", numbers=False)
                wall = time.perf_counter() - t0
                assert r.completion_tokens == 8, r
                print(f"round {round_}{' (warm-up)' if round_ == 0 else ''}  {name:<32} {wall:6.1f} s", flush=True)
                if round_ > 0:
                    times[name].append(wall)
    finally:
        engine_host.stop(proc)
    base_median = statistics.median(times[next(iter(CONFIGS))])
    print(f"\nmedians over {a.repeat} rounds ({os.cpu_count()} cores), model {model.name}:")
    for name, ts in times.items():
        m = statistics.median(ts)
        print(f"  {name:<32} {m:6.1f} s   {m / base_median:5.2f}x the baseline")


if __name__ == "__main__":
    main()
