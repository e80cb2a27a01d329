"""A LoRA adapter artifact on the demo artifact, smoked in the real vLLM CPU runtime with --enable-lora.

peft builds the adapter on the demo's model/ (q_proj, v_proj, r 8) with lora_B filled with noise: a freshly
initialised LoRA has lora_B = 0 and answers exactly as the base, so only a non-zero adapter shows that vLLM
applied it. One engine load (the load smoke asks through the adapter and through the base); the session's
vLLM server is not restarted for it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.conftest import json_result, run_cli, store_beside
from tests.unit.test_adapter import make_adapter

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]


def test_adapter_answers_through_vllm_lora(demo_run, tmp_path):
    _, out = demo_run
    home = store_beside(demo_run, tmp_path / "store")  # the demo store stays as the other tests read it
    adapter = make_adapter(Path(out["artifact"]) / "model", tmp_path / "smol-lora", r=8)
    r = run_cli("ingest", f"file://{adapter}", "--base", f"{out['name']}@{out['revision']}", "--name", "smol-lora",
                "--store", str(home), "--serve", "completion", "--json", timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json_result(r.stdout, "ingest")
    lora = res["smoke"]["lora"]
    assert lora["path"] == "model"  # the artifact's own folder, not the staging one vLLM loaded it from
    assert res["smoke"]["passed"] and lora["name"] == "smol-lora" and lora["max_lora_rank"] == 16
    assert lora["differs"] and lora["answer_ids"] != lora["base_answer_ids"]  # the adapter was applied
    assert res["smoke"]["text"] == lora["text"]
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
