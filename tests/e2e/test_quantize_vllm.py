"""Quantization against the real vLLM runtime (vllm-cpu 0.32 in .venv-vllm).

1. The local runtime is asked which schemes it loads: every scheme's tiny checkpoint (the session's
   ``quantized`` and ``legacy_quantized`` fixtures) is measured once per session by
   ``compat.ensure_local_support`` into a temporary MODELYARD_HOME; ``check_runtime`` must follow that
   measured row exactly, the row must match a separate real load through the smoke (one scheme of each
   verdict), and the table row of this host's runtime must agree with it wherever the table has a verdict.
   These run on any host ISA.
2. The demo SmolLM2-135M-Instruct quantized with w8a8 is ingested end to end: it verifies, its report
   carries perplexity and KL against the bf16 parent, and vLLM answers the demo question with
   "Paris" and finish_reason "stop". w4a16 verifies and is measured, and the AVX2 table row refuses it
   (the AVX2 build has no W4A16 kernel).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from modelyard.errors import SmokeFailedError
from modelyard.settings import Settings
from modelyard.stages import quantize as q
from modelyard.stages.quantize import compat, legacy
from modelyard.stages.smoke import cpu_smoke_unjudgeable, smoke_load
from tests.conftest import json_error, json_result, run_cli, store_artifacts
from tests.unit.test_quantize import EXPECTED

pytestmark = [pytest.mark.vllm, pytest.mark.e2e, pytest.mark.quantize]


#: scheme -> label (compat.scheme_label) of every fixture the session quantizes.
LABELS = {**{s: EXPECTED[s][1] for s in q.SCHEMES}, "gptq": "GPTQ-W4", "awq-gemm": "AWQ-W4"}
WANT = {"yes": [], "slow": [("quantization.runtime.slow_or_unmeasured", "warning")],
        "no": [("quantization.runtime.unsupported_scheme", "error")]}


def _legacy_ready() -> bool:
    """True when the legacy quantizers' venvs exist (``make setup-legacy``), so that the session can make
    the GPTQ and AutoAWQ fixtures."""
    return all(b.python(Settings()).exists() for b in legacy.BACKENDS.values())


@pytest.fixture(scope="session")
def schemes_made(quantized, request) -> dict[str, q.QuantizeResult]:
    """Every scheme's tiny checkpoint this session can make: the compressed-tensors ones always, the
    legacy formats when their quantizer venvs exist."""
    return {**quantized, **(request.getfixturevalue("legacy_quantized") if _legacy_ready() else {})}


@pytest.fixture(scope="session")
def measured_support(schemes_made, tiny128, tmp_path_factory) -> tuple[Settings, compat.SupportRow]:
    """The local runtime's support, measured once per session (dense ``tiny128`` as the tokens/s
    baseline) and cached in a temporary MODELYARD_HOME: (its settings, the measured row)."""
    settings = Settings(home=tmp_path_factory.mktemp("support-home"))
    fixtures = {LABELS[s]: res.model_dir for s, res in schemes_made.items()}
    return settings, compat.ensure_local_support(settings, fixtures, baseline=tiny128)


def _model(schemes_made, scheme: str) -> Path:
    if scheme not in schemes_made:
        pytest.skip(f"{scheme}: the legacy quantizer venvs are missing (make setup-legacy)")
    return schemes_made[scheme].model_dir


def test_local_support_is_measured_once_and_cached(measured_support, schemes_made, monkeypatch):
    settings, row = measured_support
    version = compat.installed_vllm_version(settings)
    path = settings.cache_dir() / "runtime-support" / f"{version}-{compat.host_isa()}.json"
    assert row.measured and row.cache_file == path and row.vllm_version == version
    assert row.runtime == compat.local_runtime()
    data = json.loads(path.read_text())
    assert data["isa_flags"] == sorted(compat.host_flags() & set(compat.ISA_FLAGS)) and data["date"] == row.date
    assert data["kernel_library"] == {"avx2": "_C_AVX2", "avx512": "_C_AVX512", "avx512-bf16": "_C"}[data["isa"]]
    assert data["dense"]["tokens_per_cpu_second"] > 0
    assert set(row.entries) == {LABELS[s] for s in schemes_made}
    for label, (loads, note) in row.entries.items():
        assert loads in ("yes", "slow", "no"), (label, loads)
        if loads == "no":  # the root-cause error line, not a wrapper's
            assert re.search(r"\b\w+(Error|Exception): ", note) and "EngineDeadError" not in note, (label, note)
        else:
            measured = data["schemes"][label]
            assert measured["tokens_per_second"] > 0 and measured["tokens_per_cpu_second"] > 0
            assert measured["rounds"] == data["method"]["repeats"]
            assert (loads == "slow") is (measured["ratio_to_dense"] < compat.SLOW_BELOW), (label, note)
    assert compat.support_row(None, settings) == row
    assert compat.support_row("vllm-cuda-0.32", settings).measured is False

    def measure_again(*args, **kwargs):
        raise AssertionError("measured twice")

    monkeypatch.setattr(compat, "measure_local_support", measure_again)
    assert compat.ensure_local_support(settings, {}) == row


@pytest.mark.parametrize("scheme", list(LABELS))
def test_check_runtime_follows_the_measured_row(measured_support, schemes_made, scheme, monkeypatch, tmp_path):
    settings, row = measured_support
    model = _model(schemes_made, scheme)
    loads, note = row.entries[LABELS[scheme]]
    monkeypatch.setenv("MODELYARD_HOME", str(settings.home))  # the default Settings() of flows and the CLI
    for found in (compat.check_runtime(model, None, Settings()), compat.check_runtime(model, compat.local_runtime(), settings)):
        assert [(f.code, f.severity.value) for f in found] == WANT[loads], (scheme, note)
        for f in found:
            assert f.source.startswith("measured on this host")
            assert row.vllm_version in f.source and row.date in f.source
            assert note in f.message
    # Without the cache the same runtime is judged by the table, and says so.
    monkeypatch.setenv("MODELYARD_HOME", str(tmp_path / "empty"))
    table = compat.RUNTIME_SUPPORT[compat.local_runtime()]
    for f in compat.check_runtime(model, None, Settings()):
        assert f.source.startswith(compat.TABLE_SOURCES[compat.local_runtime()])
    if LABELS[scheme] not in table:
        assert [f.code for f in compat.check_runtime(model, None, Settings())] == ["quantization.runtime.slow_or_unmeasured"]


def _one_per_verdict(schemes_made, row) -> list[str]:
    """The first scheme (in LABELS order) of each verdict the row holds (yes, slow, no): a real load of each
    costs a vLLM start (~30 s here), and the row's verdict is what the second load must agree with."""
    picked: dict[str, str] = {}
    for scheme in LABELS:
        if scheme in schemes_made:
            picked.setdefault(row.entries[LABELS[scheme]][0], scheme)
    return list(picked.values())


def test_measured_row_matches_a_real_load(measured_support, schemes_made):
    """A second, independent load through the smoke agrees with the row, for one scheme of each verdict the row
    holds. The measurement runs its engines inline, so this load keeps vllm serve's process layout
    (``smoke_engine="process"``: an engine-core and a worker process of their own): independent of it in that too."""
    _, row = measured_support
    settings = Settings(smoke_engine="process")
    for scheme in _one_per_verdict(schemes_made, row):
        model = _model(schemes_made, scheme)
        loads, note = row.entries[LABELS[scheme]]
        if cpu_smoke_unjudgeable(model):  # W8A8 on an AMX host: the smoke says it cannot judge, before vLLM starts
            with pytest.raises(SmokeFailedError,
                               match="^the local vLLM CPU runtime cannot judge this checkpoint on this host"):
                smoke_load(model, settings, question="w1 w2", max_tokens=4, timeout=600)
            continue
        try:
            smoke_load(model, settings, question="w1 w2", max_tokens=4, timeout=600)
            loaded = True
        except SmokeFailedError as exc:
            loaded = False
            error = row.detail["schemes"][LABELS[scheme]]["error"]
            assert error in str(exc), (scheme, error, str(exc)[:1500])
        assert loaded is (loads != "no"), (scheme, note)


def test_table_row_agrees_with_the_measurement(measured_support):
    """Where this host's table row has a verdict (yes/slow/no), it must agree with the measurement on
    whether the scheme loads; update the table when it does not."""
    _, row = measured_support
    table = compat.RUNTIME_SUPPORT[compat.local_runtime()]
    wrong = {label: (table[label][0], loads, note) for label, (loads, note) in row.entries.items()
             if table.get(label, ("unknown",))[0] != "unknown" and (table[label][0] == "no") != (loads == "no")}
    assert wrong == {}


@pytest.fixture(scope="module")
def smollm2_dir(demo_run):
    _, out = demo_run
    return Path(out["artifact"]) / "model"


def _amx_int8_host() -> bool:
    return " amx_int8" in Path("/proc/cpuinfo").read_text(errors="replace")


@pytest.mark.timeout(2460)  # its own subprocess may take 2400 s
def test_smollm2_w8a8_verifies_measures_and_answers_paris(smollm2_dir, tmp_path):
    """On a host without AMX: ingested with its smoke, it answers Paris and passes the numerical gate against
    its parent. On an AMX host vllm-cpu 0.32 cannot run W8A8 right in any dtype (stages.smoke.cpu_smoke_unjudgeable):
    it is ingested with --no-smoke, and the smoke of the stored artifact says it cannot judge it there."""
    home = tmp_path / "store"
    amx = _amx_int8_host()
    r = run_cli("ingest", f"file://{smollm2_dir}", "--quantize", "w8a8", "--num-samples", "16", "--max-seq-len",
                "128", "--out", str(home), "--json", *(["--no-smoke"] if amx else []), timeout=2400)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = json_result(r.stdout, "ingest")
    if amx:
        (art,) = store_artifacts(home)
        assert json.loads((art / "report.json").read_text())["quantization"]["quality"]["passed"] is True
        s = run_cli("smoke", str(art), "--smoke", "load", "--json")
        assert s.returncode == 1
        assert json_error(s.stdout, "smoke", 1)["message"] == (
            "the local vLLM CPU runtime cannot judge this checkpoint on this host: its int8 activations (W8A8-INT8) run "
            "through vllm-cpu 0.32's AMX int8 kernel on this AMX host, which takes bfloat16 activations only, and there "
            "vllm-cpu's bfloat16 AMX attention answers garbage")
        return
    s = out["smoke"]
    assert "Paris" in s["text"] and s["finish_reason"] == "stop" and s["passed"] is True
    # the numerical gate judges a quantized model by the quantized limits (W8A8 quantizes activations too)
    n = s["numeric"]
    assert (n["passed"], n["compared"], n["limits"]) == (True, True, {"kl_max": 0.1, "top1_min": 0.7,
                                                                       "ppl_ratio_max": 1.35})
    # and the served artifact against its parent (transformers on the unquantized demo model, same ids)
    par = n["parent"]
    assert (par["compared"], par["limits"], [t["name"] for t in par["texts"]]) == (
        True, {"kl_max": 0.1, "top1_min": 0.7, "ppl_ratio_max": 1.35}, [t["name"] for t in n["texts"]]), par
    assert 0 < par["kl_mean"] <= 0.1 and 1.0 <= par["ppl_ratio_worst"] <= 1.35, par
    (art,) = store_artifacts(home)
    report = json.loads((art / "report.json").read_text())
    assert report["summary"]["passed"] is True
    qual = report["quantization"]["quality"]
    assert qual["passed"] is True and qual["ppl_quantized"] > 0 and qual["kl_mean"] >= 0
    cfg = json.loads((art / "model" / "config.json").read_text())
    assert compat.scheme_label(cfg["quantization_config"]) == "W8A8-INT8"


def test_smollm2_w4a16_verifies_and_local_runtime_refuses(smollm2_dir, tmp_path):
    res = q.quantize_model(smollm2_dir, tmp_path / "w4a16", "w4a16", settings=Settings(), num_samples=16, max_seq_len=128)
    assert res.recipe.adjustments[0].startswith("group_size 128 -> 64: hidden_size 576")
    assert res.quality.ppl_quantized > 0 and res.quality.kl_mean > 0
    r = run_cli("verify", str(tmp_path / "w4a16"), "--json")
    assert r.returncode == 0, r.stderr
    codes = [f.code for f in compat.check_runtime(tmp_path / "w4a16", "vllm-cpu-0.32-avx2", Settings())]
    assert codes == ["quantization.runtime.unsupported_scheme"]
    assert compat.check_runtime(tmp_path / "w4a16", "vllm-cuda-0.32", Settings()) == []
    (tmp_path / "w4a16-quality.json").write_text(json.dumps(res.record()["quality"]))
