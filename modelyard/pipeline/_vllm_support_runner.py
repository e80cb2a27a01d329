"""Runs INSIDE the vLLM runtime interpreter (``MODELYARD_VLLM_PYTHON``), for ``compat.measure_local_support``.

Standard library + vLLM only: it must not import modelyard, whose pins clash with vLLM's.
``argv``: a JSON file with ``{"jobs": [{"label", "model"}], "prompt", "max_model_len", "max_tokens",
"repeats"}`` and the JSONL output path. The first line written is the runtime header (``vllm_version``,
``torch_version``, the ISA torch sees, and the kernel library vLLM loaded: ``_C_AVX2``, ``_C_AVX512``
or ``_C``, the AVX-512 + BF16 build, as ``vllm/platforms/cpu.py`` ``import_kernels`` picks it). Then,
for each job not yet in the output, one engine after another in this process (the parent sets
``VLLM_ENABLE_V1_MULTIPROCESSING=0``): load with ``enforce_eager``, generate ``max_tokens`` greedy tokens
once to warm up, then ``repeats`` more times, timed, and append one line ``{"label", "ok", "phase"
("load" | "generate" | "done"), "error"?, "load_seconds", "tokens_per_second"?}``. tokens/s is the best
of the timed runs (completion tokens / wall seconds of ``LLM.generate``), so a busy host reads high
rather than noisy. The parent restarts the runner after a crash, naming the job in ``<out>.current``.
"""

import gc
import json
import os
import sys
import time
import traceback


def _root(exc: BaseException) -> BaseException:
    """The first exception of the chain, followed the way Python prints it (``__cause__``, then an
    unsuppressed ``__context__``)."""
    seen = set()
    while id(exc) not in seen:
        seen.add(id(exc))
        nxt = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
        if nxt is None:
            break
        exc = nxt
    return exc


def _line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0][:400] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _kernel_library() -> str | None:
    """The vLLM CPU kernel library mapped into this process (read from ``/proc/self/maps``)."""
    try:
        maps = open("/proc/self/maps").read()
    except OSError:
        return None
    for name in ("_C_AVX512.abi3.so", "_C_AVX2.abi3.so", "_C.abi3.so"):
        if "/vllm/" + name in maps:
            return name.split(".")[0]
    return None


def _header() -> dict:
    import torch
    import vllm
    from vllm.platforms import current_platform

    current_platform.import_kernels()
    return {"header": True, "vllm_version": vllm.__version__, "torch_version": torch.__version__,
            "torch_avx512": bool(torch.cpu._is_avx512_supported()),
            "torch_avx512_bf16": bool(torch.cpu._is_avx512_bf16_supported()),
            "kernel_library": _kernel_library()}


def main() -> int:
    spec_path, out_path = sys.argv[1], sys.argv[2]
    spec = json.load(open(spec_path))
    done = set()
    if os.path.exists(out_path):
        for line in open(out_path):
            rec = json.loads(line)
            if "label" in rec:
                done.add(rec["label"])
    import logging

    from vllm import LLM, SamplingParams

    logging.getLogger("vllm").setLevel(logging.ERROR)
    with open(out_path, "a") as fh:
        fh.write(json.dumps(_header()) + "\n")
    params = SamplingParams(temperature=0.0, max_tokens=spec["max_tokens"], ignore_eos=True)
    for job in spec["jobs"]:
        if job["label"] in done:
            continue
        with open(out_path + ".current", "w") as fh:
            fh.write(job["label"])
        print(f"=== modelyard support: {job['label']} {job['model']}", file=sys.stderr, flush=True)
        rec = {"label": job["label"], "ok": False, "phase": "load"}
        llm = None
        t0 = time.perf_counter()
        try:
            llm = LLM(model=job["model"], enforce_eager=True, max_model_len=spec["max_model_len"], seed=0,
                      tensor_parallel_size=1, trust_remote_code=False)
            rec["load_seconds"] = round(time.perf_counter() - t0, 2)
            rec["phase"] = "generate"
            llm.generate([spec["prompt"]], params, use_tqdm=False)
            best = 0.0
            for _ in range(spec["repeats"]):
                t1 = time.perf_counter()
                outs = llm.generate([spec["prompt"]], params, use_tqdm=False)
                dt = time.perf_counter() - t1
                n = len(outs[0].outputs[0].token_ids)
                best = max(best, n / dt if dt > 0 else 0.0)
            rec.update(ok=True, phase="done", tokens=n, tokens_per_second=round(best, 2))
        except Exception as exc:
            root = _root(exc)
            rec.update(error=_line(root), raised=_line(exc), traceback=traceback.format_exc()[-2000:])
        with open(out_path, "a") as fh:
            fh.write(json.dumps(rec) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        del llm
        gc.collect()
    sys.stdout.flush()
    sys.stderr.flush()
    # vLLM's engine threads can keep the interpreter alive; leave now that the results are on disk.
    os._exit(0)


if __name__ == "__main__":
    main()
