"""A LoRA adapter artifact on the demo artifact, smoked in the real vLLM CPU runtime with --enable-lora.

peft builds the adapter on the demo's model/ (q_proj, v_proj, r 8) with lora_B filled with noise: a freshly
initialised LoRA has lora_B = 0 and answers exactly as the base, so only a non-zero adapter shows that vLLM
applied it. One engine load per adapter (the load smoke asks through the adapter and through the base, and scores
the reference texts through both); the session's vLLM server is not restarted for it. Noise N(0, 0.1) changes the
answer and keeps the base's numbers; noise N(0, 0.5) wrecks them, and the numerical gate refuses it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.conftest import json_envelope, json_result, run_cli, store_beside
from tests.unit.test_adapter import make_adapter

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]


def test_adapter_is_smoked_through_the_server_with_lora_modules_and_its_bench(demo_run, tmp_path):
    """The ingest's bench smoke: vLLM's OpenAI server on the base with --enable-lora --lora-modules, every check,
    the numerical gate and vLLM's bench client naming the adapter."""
    _, out = demo_run
    home = store_beside(demo_run, tmp_path / "store")  # the demo store stays as the other tests read it
    adapter = make_adapter(Path(out["artifact"]) / "model", tmp_path / "smol-lora", r=8, sigma=0.1)
    r = run_cli("ingest", f"file://{adapter}", "--base", f"{out['name']}@{out['revision']}", "--name", "smol-lora",
                "--store", str(home), "--serve", "completion", "--smoke", "bench", "--json", timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json_result(r.stdout, "ingest")
    smoke = res["smoke"]
    assert (smoke["passed"], smoke["level"], smoke["served_model_name"]) == (True, "bench", "smol-lora")
    # the server it started: the base with the adapter; the record names the artifact's own folder, not the staging one
    assert (smoke["config"]["enable-lora"], smoke["config"]["lora-modules"], smoke["config"]["max-lora-rank"]) == (
        True, ["smol-lora=model"], 16)
    assert [c["name"] for c in smoke["checks"] if not c["passed"]] == []
    assert smoke["bench"]["completed"] == 8 and smoke["bench"]["passed"] is True
    art = Path(res["artifact"])
    m = yaml.safe_load((art / "manifest.json").read_text())
    assert m["kind"] == "lora" and m["base"] == {"name": out["name"], "revision": out["revision"],
                                                 "digest": out["content_digest"]}
    # the base binding travels with the signature: the signed report carries the manifest's identity claims
    assert yaml.safe_load((art / "report.json").read_text())["artifact"] == {
        "name": "smol-lora", "revision": m["revision"], "kind": "lora", "content_digest": m["content_digest"],
        "base": m["base"], "tools": m["tools"]}
    cfg = yaml.safe_load((art / "serve" / "vllm.yaml").read_text())
    assert cfg["enable-lora"] is True and cfg["lora-modules"] == ["smol-lora=model"]
    # the numerical gate: the adapter against its base on the same server, every reference text; the adapter was
    # applied (every text's numbers moved) and kept the base's numbers
    n = smoke["numeric"]
    assert (n["kind"], n["passed"], n["limits"]) == ("adapter", True, {"nll_increase_mean": 1.5})
    assert [t["name"] for t in n["texts"]] == ["prose-en", "code-python", "code-open", "prose-fr", "prose-de", "prose-es"]
    assert 0.0 < n["nll_increase_mean"] < 0.5, n  # 0.1005 measured on the AVX-512 host, offline and served alike
    assert all(t["ppl_adapter"] > t["ppl_base"] > 1.0 for t in n["texts"]), n["texts"]
    assert "### Numerical gate, the adapter against its base (vLLM " in (art / "report.md").read_text()


def test_an_adapter_that_wrecks_the_base_numbers_is_refused(demo_run, tmp_path):
    """It answers something in completion mode, which the load smoke alone passed; its numbers are noise.
    `modelyard smoke` on the stored LoRA artifact loads its base (beside it in the store) with the adapter."""
    _, out = demo_run
    home = store_beside(demo_run, tmp_path / "store")
    adapter = make_adapter(Path(out["artifact"]) / "model", tmp_path / "wreck-lora", r=8, sigma=0.5)
    r = run_cli("ingest", f"file://{adapter}", "--base", f"{out['name']}@{out['revision']}", "--name", "wreck-lora",
                "--store", str(home), "--serve", "completion", "--no-smoke", "--json", timeout=900)
    art = Path(json_result(r.stdout, "ingest")["artifact"])
    r = run_cli("smoke", str(art), "--smoke", "load", "--json", timeout=900)
    env = json_envelope(r.stdout, "smoke", 1)
    assert env["error"]["type"] == "SmokeFailedError", env["error"]
    msg = env["error"]["message"]
    assert msg.startswith("vLLM smoke completion failed: the adapter raises its base's negative log-likelihood on the "
                          "reference texts by "), msg
    rise = float(msg.split(" by ", 1)[1].split(" ", 1)[0])
    assert rise > 3.0, msg  # 6.577 measured
    assert env["error"]["fix"].startswith("The adapter wrecks what the base knows")
    lora = env["result"]["lora"]
    assert (lora["name"], lora["differs"], lora["max_lora_rank"]) == ("wreck-lora", True, 16)  # the adapter was applied
