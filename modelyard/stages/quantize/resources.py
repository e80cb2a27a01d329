"""The quantize stage's own preflight: the RAM and disk a scheme needs on this model, refused before any work."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from modelyard.errors import InsufficientResourcesError
from modelyard.model.checkpoint import Checkpoint
from modelyard.stages.quantize.schemes import Scheme

GIB = 1024**3


@dataclass(frozen=True)
class Preflight:
    """Estimates and what is available, bytes."""

    weight_bytes: int
    ram_needed: int
    ram_available: int | None
    disk_needed: int
    disk_available: int


def preflight(model_dir: Path, sch: Scheme, out_parent: Path) -> Preflight:
    """Estimate RAM and disk for quantizing ``model_dir`` and refuse when they do not fit.

    RAM: 2.5 x the weight bytes (the model, calibration activations, GPTQ Hessians) + 1.5 GiB for
    the interpreter and libraries; disk: the weights at ``weight_bits`` plus 10% and 64 MiB.
    Raises :class:`InsufficientResourcesError` naming both numbers."""
    ckpt = Checkpoint(model_dir)
    weight_bytes = sum(t.end - t.begin for t in ckpt.tensors.values())
    ram_needed = int(weight_bytes * 2.5 + 1.5 * GIB)
    disk_needed = int(weight_bytes * sch.weight_bits / 16 * 1.1 + 64 * 1024**2)
    ram_avail = _mem_available()
    out_parent.mkdir(parents=True, exist_ok=True)
    disk_avail = shutil.disk_usage(out_parent).free
    pf = Preflight(weight_bytes, ram_needed, ram_avail, disk_needed, disk_avail)
    if ram_avail is not None and ram_needed > ram_avail:
        raise InsufficientResourcesError(
            f"quantizing {model_dir.name} ({weight_bytes / GIB:.1f} GiB of weights) needs about {ram_needed / GIB:.1f} GiB "
            f"of RAM; {ram_avail / GIB:.1f} GiB is available", fix="Run it on a host with more memory (or a GPU host).")
    if disk_needed > disk_avail:
        raise InsufficientResourcesError(
            f"the {sch.name} output needs about {disk_needed / GIB:.2f} GiB under {out_parent}; "
            f"{disk_avail / GIB:.2f} GiB is free", fix="Free disk space there or pass another --out.")
    return pf


def _mem_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
