"""Runs INSIDE the vLLM runtime interpreter (``MODELYARD_VLLM_PYTHON``), for ``compat.measure_local_support``.

Standard library + vLLM only: it must not import modelyard, whose pins clash with vLLM's.
``argv``: a JSON spec ``{"baseline": {"label", "model"} | null, "jobs": [{"label", "model"}], "prompt",
"max_model_len", "max_tokens", "repeats"}`` and the JSONL output path. The parent sets
``VLLM_ENABLE_V1_MULTIPROCESSING=0``, so every engine runs in this process.

The first line written is the runtime header (``vllm_version``, ``torch_version``, the ISA torch sees,
and the kernel library vLLM loaded: ``_C_AVX2``, ``_C_AVX512`` or ``_C``, the AVX-512 + BF16 build, as
``vllm/platforms/cpu.py`` ``import_kernels`` picks it). The baseline (the dense parent) is loaded
first and kept loaded; then each job not yet in the output is loaded with ``enforce_eager``, generates
``max_tokens`` greedy tokens (``ignore_eos``) once to warm up, then ``repeats`` timed rounds, each
timing the baseline and then the job on the same prompt, and the job's engine is dropped. One line
per model: ``{"label", "ok", "phase" ("load" | "generate" | "done"), "error"?, "raised"?,
"load_seconds", "tokens_per_second"?, "tokens_per_cpu_second"?, "ratio_to_dense"?,
"dense_tokens_per_cpu_second"?}``. Rates are the best of the rounds, in completion tokens per wall
second and per CPU second of this process (``time.process_time``); ``ratio_to_dense`` is the median
over rounds of the job's CPU rate over the baseline's in the same round, so that a host whose load
drifts between models still compares like with like. The parent restarts the runner after a crash,
naming the job in ``<out>.current``.
"""

import gc
import json
import os
import runpy
import statistics
import sys
import time
import traceback

# vLLM kernels use AMX tiles where the CPU has them: SIGILL unless the process asks first (see that file)
_HERE = os.path.dirname(os.path.abspath(__file__))
runpy.run_path(os.path.join(_HERE, "amx.py"))["request_amx"]()


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


def _kernel_library():
    """The vLLM CPU kernel library mapped into this process (read from ``/proc/self/maps``), or None."""
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


def _timed(llm, prompt: str, params) -> tuple:
    """(completion tokens, wall seconds, CPU seconds) of one greedy generation."""
    t, c = time.perf_counter(), time.process_time()
    outs = llm.generate([prompt], params, use_tqdm=False)
    return len(outs[0].outputs[0].token_ids), time.perf_counter() - t, time.process_time() - c


def _append(path: str, rec: dict) -> None:
    with open(path, "a") as fh:
        fh.write(json.dumps(rec) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def main() -> int:  # noqa: C901
    spec_path, out_path = sys.argv[1], sys.argv[2]
    spec = json.load(open(spec_path))
    done = set()
    if os.path.exists(out_path):
        for line in open(out_path):
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if "label" in rec:
                done.add(rec["label"])
    import logging

    from vllm import LLM, SamplingParams

    logging.getLogger("vllm").setLevel(logging.ERROR)
    _append(out_path, _header())
    params = SamplingParams(temperature=0.0, max_tokens=spec["max_tokens"], ignore_eos=True)
    prompt, repeats = spec["prompt"], max(1, int(spec["repeats"]))

    def load(model: str):
        return LLM(model=model, enforce_eager=True, max_model_len=spec["max_model_len"], seed=0,
                   tensor_parallel_size=1, trust_remote_code=False)

    dense = None
    base = spec.get("baseline")
    if base:
        with open(out_path + ".current", "w") as fh:
            fh.write(base["label"])
        rec = {"label": base["label"], "ok": False, "phase": "load"}
        t0 = time.perf_counter()
        try:
            dense = load(base["model"])
            rec.update(load_seconds=round(time.perf_counter() - t0, 2), phase="generate")
            _timed(dense, prompt, params)
            runs = [_timed(dense, prompt, params) for _ in range(repeats)]
            rec.update(ok=True, phase="done", tokens_per_second=round(max(n / w for n, w, _ in runs), 2),
                       tokens_per_cpu_second=round(max(n / c for n, _, c in runs), 2))
        except Exception as exc:
            dense = None
            rec.update(error=_line(_root(exc)), raised=_line(exc), traceback=traceback.format_exc()[-2000:])
        if base["label"] not in done:
            _append(out_path, rec)

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
            llm = load(job["model"])
            rec.update(load_seconds=round(time.perf_counter() - t0, 2), phase="generate")
            _timed(llm, prompt, params)
            mine, ratios, base_rates = [], [], []
            for _ in range(repeats):
                ref = None
                if dense is not None:
                    try:
                        ref = _timed(dense, prompt, params)
                    except Exception:  # the baseline broke: measure the rest without it
                        dense = None
                run = _timed(llm, prompt, params)
                mine.append(run)
                if ref is not None and ref[2] > 0 and run[2] > 0:
                    base_rates.append(ref[0] / ref[2])
                    ratios.append((run[0] / run[2]) / base_rates[-1])
            rec.update(ok=True, phase="done", tokens_per_second=round(max(n / w for n, w, _ in mine), 2),
                       tokens_per_cpu_second=round(max(n / c for n, _, c in mine), 2))
            if ratios:
                rec.update(ratio_to_dense=round(statistics.median(ratios), 3),
                           dense_tokens_per_cpu_second=round(statistics.median(base_rates), 2), rounds=len(ratios))
        except Exception as exc:
            rec.update(error=_line(_root(exc)), raised=_line(exc), traceback=traceback.format_exc()[-2000:])
        _append(out_path, rec)
        del llm
        gc.collect()
    sys.stdout.flush()
    sys.stderr.flush()
    # vLLM's engine threads can keep the interpreter alive; leave now that the results are on disk.
    os._exit(0)


if __name__ == "__main__":
    main()
