"""The AMX permission request every in-process vLLM runner makes first (modelyard/runtime/scripts/amx.py)."""

from __future__ import annotations

import runpy
from pathlib import Path

import modelyard

request_amx = runpy.run_path(str(Path(modelyard.__file__).parent / "runtime" / "scripts" / "amx.py"))["request_amx"]


def test_a_host_without_amx_asks_nothing(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("flags\t\t: fpu avx2 avx512f avx512_bf16\n")
    assert request_amx(str(info)) is None
    assert request_amx(str(tmp_path / "missing")) is None


def test_an_amx_host_is_granted_the_tile_registers():
    has_amx = " amx_tile" in Path("/proc/cpuinfo").read_text()
    assert request_amx() is (True if has_amx else None)
