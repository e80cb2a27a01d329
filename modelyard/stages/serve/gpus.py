"""gpus: the table of common serving GPUs the serve plan sizes against.

Memory rule (one rule, used everywhere): a card's memory is the **total the driver reports**, in
bytes: ``nvidia-smi --query-gpu=memory.total`` in MiB x 2**20 (``rocm-smi --showmeminfo vram``
bytes for AMD). That is the number vLLM multiplies by ``--gpu-memory-utilization``: vLLM's
``Worker.determine_available_memory`` takes the fraction of ``torch.cuda.mem_get_info()`` total,
which is the driver's figure, not the marketing "80 GB". An "80 GB" H100 reports 81559 MiB
(85,520,809,984 bytes = 79.6 GiB); neither 80 x 10**9 nor 80 x 2**30 would be right.

Each figure below is the value seen in published ``nvidia-smi`` / ``rocm-smi`` output of that card
(for example ``1MiB / 81559MiB`` for an H100 SXM). Compute capability is NVIDIA's (CUDA GPUs
table); AMD cards have none (``None``) and are judged by ``fp8`` instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from modelyard.errors import InvalidTargetError

MIB = 2**20
GIB = 2**30


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model. ``memory_bytes``: the driver-reported total (bytes); ``compute_capability``:
    "major.minor" for NVIDIA, None for AMD; ``fp8``: native FP8 tensor cores (vLLM's FP8 W8A8 path)."""

    name: str
    memory_bytes: int
    vendor: str
    compute_capability: str | None
    fp8: bool
    aliases: tuple[str, ...] = ()
    smi_name: str = ""  # what nvidia-smi / rocm-smi prints, for doctor

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / GIB


def _nv(name: str, mib: int, cc: str, aliases: tuple[str, ...], smi: str) -> GpuSpec:
    major, minor = (int(x) for x in cc.split("."))
    return GpuSpec(name, mib * MIB, "nvidia", cc, (major, minor) >= (8, 9), aliases, smi)


#: name -> spec. Memory: nvidia-smi ``memory.total`` MiB as the cards report it.
GPUS: dict[str, GpuSpec] = {g.name: g for g in (
    _nv("H100-80GB", 81559, "9.0", ("H100", "H100-SXM", "H100-PCIE"), "NVIDIA H100 80GB HBM3"),
    _nv("H100-94GB", 95830, "9.0", ("H100-NVL", "H100NVL"), "NVIDIA H100 NVL"),
    _nv("H200-141GB", 143771, "9.0", ("H200",), "NVIDIA H200"),
    _nv("A100-80GB", 81920, "8.0", ("A100", "A100-SXM4-80GB"), "NVIDIA A100-SXM4-80GB"),
    _nv("A100-40GB", 40960, "8.0", ("A100-40G", "A100-SXM4-40GB"), "NVIDIA A100-SXM4-40GB"),
    _nv("L40S-48GB", 46068, "8.9", ("L40S",), "NVIDIA L40S"),
    _nv("L4-24GB", 23034, "8.9", ("L4",), "NVIDIA L4"),
    _nv("A10G-24GB", 23028, "8.6", ("A10G",), "NVIDIA A10G"),
    _nv("RTX-4090-24GB", 24564, "8.9", ("RTX-4090", "4090"), "NVIDIA GeForce RTX 4090"),
    _nv("B200-180GB", 183359, "10.0", ("B200",), "NVIDIA B200"),
    # rocm-smi "VRAM Total Memory (B): 205822885888" (= 196288 MiB); FP8 (e4m3fnuz) is native on CDNA3.
    GpuSpec("MI300X-192GB", 205822885888, "amd", None, True, ("MI300X",), "AMD Instinct MI300X"),
)}


def _norm(s: str) -> str:
    return s.upper().replace("_", "-").replace(" ", "-")


def gpu_spec(name: str) -> GpuSpec:
    """The table entry for ``name`` (case-insensitive; short aliases such as ``H100`` accepted).
    Raises :class:`InvalidTargetError` naming the known GPUs."""
    key = _norm(name)
    for g in GPUS.values():
        if key == _norm(g.name) or key in (_norm(a) for a in g.aliases):
            return g
    raise InvalidTargetError(f"unknown GPU {name!r}",
                             fix=f"Use one of: {', '.join(GPUS)}.")


def spec_for_smi_name(smi_name: str, memory_bytes: int | None = None) -> GpuSpec | None:
    """Match a device name as nvidia-smi/torch print it (``NVIDIA H100 80GB HBM3``) to the table,
    using memory to tell variants apart (H100 80 GB vs NVL 94 GB); None when unknown."""
    n = _norm(smi_name)
    exact = [g for g in GPUS.values() if _norm(g.smi_name) == n]
    if exact:
        return exact[0]
    tokens = set(n.split("-"))
    cands = [g for g in GPUS.values()
             if _norm(g.smi_name) == n or any(_norm(a) in tokens for a in g.aliases)]
    if memory_bytes and cands:
        return min(cands, key=lambda g: abs(g.memory_bytes - memory_bytes))
    return cands[0] if cands else None
