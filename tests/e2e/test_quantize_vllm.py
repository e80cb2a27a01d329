"""Quantization against the real vLLM runtime (vllm-cpu 0.32 in .venv-vllm).

1. The runtime support table (pipeline/compat.py) is checked against the runtime itself: every
   scheme's tiny checkpoint is loaded in real vLLM and must load exactly when the table says so.
2. The demo SmolLM2-135M-Instruct quantized with w8a8 is ingested end to end: it verifies, its report
   carries perplexity and KL against the bf16 parent, and vLLM answers the demo question with
   "Paris" and finish_reason "stop". w4a16 verifies and is measured, and the local runtime's gate
   refuses it (this AVX2 build has no W4A16 kernel).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from modelyard.errors import SmokeFailedError
from modelyard.pipeline import compat
from modelyard.pipeline import quantize as q
from modelyard.pipeline.smoke import smoke_load
from modelyard.settings import Settings
from tests.conftest import run_cli, store_artifacts
from tests.unit.test_quantize import EXPECTED

pytestmark = [pytest.mark.vllm, pytest.mark.e2e, pytest.mark.quantize]


@pytest.mark.skipif(compat.local_runtime() != "vllm-cpu-0.32-avx2", reason="the table row is for AVX2 hosts")
@pytest.mark.parametrize("scheme", list(q.SCHEMES))
def test_runtime_table_matches_real_vllm(quantized, scheme):
    loads, note = compat.RUNTIME_SUPPORT["vllm-cpu-0.32-avx2"][EXPECTED[scheme][1]]
    try:
        smoke_load(quantized[scheme].model_dir, Settings(), question="w1 w2", max_tokens=4, timeout=600)
        loaded = True
    except SmokeFailedError:
        loaded = False
    assert loaded is (loads != "no"), (scheme, note)


@pytest.fixture(scope="module")
def smollm2_dir(demo_run):
    _, out = demo_run
    return Path(out["artifact"]) / "model"


def test_smollm2_w8a8_verifies_measures_and_answers_paris(smollm2_dir, tmp_path):
    home = tmp_path / "store"
    r = run_cli("ingest", f"file://{smollm2_dir}", "--quantize", "w8a8", "--num-samples", "16", "--max-seq-len",
                "128", "--out", str(home), "--json", timeout=2400)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    s = out["smoke"]
    assert "Paris" in s["text"] and s["finish_reason"] == "stop" and s["passed"] is True
    (art,) = store_artifacts(home)
    report = json.loads((art / "report.json").read_text())
    assert report["summary"]["passed"] is True
    qual = report["quantization"]["quality"]
    assert qual["passed"] is True and qual["ppl_quantized"] > 0 and qual["kl_mean"] >= 0
    cfg = json.loads((art / "model" / "config.json").read_text())
    assert compat.scheme_label(cfg["quantization_config"]) == "W8A8-INT8"


def test_smollm2_w4a16_verifies_and_local_runtime_refuses(smollm2_dir, tmp_path):
    res = q.quantize_model(smollm2_dir, tmp_path / "w4a16", "w4a16", num_samples=16, max_seq_len=128)
    assert res.recipe.adjustments[0].startswith("group_size 128 -> 64: hidden_size 576")
    assert res.quality.ppl_quantized > 0 and res.quality.kl_mean > 0
    r = run_cli("verify", str(tmp_path / "w4a16"), "--json")
    assert r.returncode == 0, r.stderr
    codes = [f.code for f in compat.check_runtime(tmp_path / "w4a16", "vllm-cpu-0.32-avx2")]
    assert codes == ["quantization.runtime.unsupported_scheme"]
    assert compat.check_runtime(tmp_path / "w4a16", "vllm-cuda-0.32") == []
    (tmp_path / "w4a16-quality.json").write_text(json.dumps(res.record()["quality"]))


@pytest.mark.skipif(compat.local_runtime() != "vllm-cpu-0.32-avx2", reason="the table row is for AVX2 hosts")
@pytest.mark.parametrize("scheme,label", [("gptq", "GPTQ-W4"), ("awq-gemm", "AWQ-W4")])
def test_runtime_table_matches_real_vllm_for_legacy_formats(legacy_quantized, scheme, label):
    loads, note = compat.RUNTIME_SUPPORT["vllm-cpu-0.32-avx2"][label]
    try:
        smoke_load(legacy_quantized[scheme].model_dir, Settings(), question="w1 w2", max_tokens=4, timeout=600)
        loaded = True
    except SmokeFailedError as exc:
        loaded = False
        assert "root cause: AttributeError: '_OpNamespace' '_C' object has no attribute 'cpu_gemm_wna16'" in str(exc)
    assert loaded is (loads != "no"), (scheme, note)
