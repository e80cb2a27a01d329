"""A base model (no chat template) ingested for completion serving, for real: the demo model's converted
folder (from the session's `modelyard demo`, no second GGUF conversion) with its chat template removed
publishes with ``--serve completion``, its smoke asks vLLM (CPU) for a plain-text completion, and the
manifest records the mode. Without ``--serve`` the same folder is judged for chat and refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import json_error, json_result, run_cli, store_artifacts

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]


@pytest.fixture(scope="module")
def base_smollm2(demo_run, tmp_path_factory) -> Path:
    """The demo artifact's model/ without chat_template.jinja and without tokenizer_config's chat_template."""
    _, out = demo_run
    d = tmp_path_factory.mktemp("base") / "smollm2-base"
    shutil.copytree(f"{out['artifact']}/model", d)
    for p in d.iterdir():
        p.chmod(0o644)
    (d / "chat_template.jinja").unlink()
    tc = json.loads((d / "tokenizer_config.json").read_text())
    tc.pop("chat_template", None)
    (d / "tokenizer_config.json").write_text(json.dumps(tc, indent=2) + "\n")
    return d


@pytest.mark.timeout(1560)  # its own subprocess may take 1500 s
def test_base_model_publishes_for_completion_and_the_gate_follows_the_target(base_smollm2, tmp_path):
    home = tmp_path / "store"
    chat = run_cli("ingest", f"file://{base_smollm2}", "--json", "--out", str(home))
    assert chat.returncode == 1, chat.stdout[-2000:] + chat.stderr[-2000:]
    refused = json_error(chat.stdout, "ingest", 1)
    assert refused["type"] == "VerificationFailedError"
    errors = {f["code"] for f in refused["report"]["findings"] if f["severity"] == "error"}
    # the hand rule, and the runtime oracle's twin when ingest asks the local vLLM (MODELYARD_VERIFY_RUNTIME)
    assert "tokenizer.chat_template.missing" in errors and errors <= {"tokenizer.chat_template.missing",
                                                                      "runtime.chat_template.missing"}
    assert store_artifacts(home) == []

    r = run_cli("ingest", f"file://{base_smollm2}", "--serve", "completion", "--json", "--out", str(home), timeout=1500)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = json_result(r.stdout, "ingest")
    art = Path(out["artifact"])
    assert store_artifacts(home) == [art]
    assert not (art / "model" / "chat_template.jinja").exists()
    manifest = json.loads((art / "manifest.json").read_text())
    s = manifest["smoke"]
    assert (s["mode"], s["passed"], s["error"]) == ("completion", True, None)
    assert s["question"] == "The capital of France is"  # the completion mode's default prompt
    assert s["finish_reason"] in ("stop", "length") and "Paris" in s["text"]
    assert 0 < s["completion_tokens"] <= 64
    assert out["smoke"] == s
    report = json.loads((art / "report.json").read_text())
    assert report["target"]["serve"] == "completion" and report["smoke"]["mode"] == "completion"
    judged = {(f["code"], f["severity"]) for f in report["findings"] if f["severity"] != "info"}
    assert ("tokenizer.chat_template.missing", "warning") in judged and judged <= {
        ("tokenizer.chat_template.missing", "warning"), ("runtime.chat_template.missing", "warning")}

    # verify shares ingest's default (chat): the completion artifact verifies only when told so
    assert run_cli("verify", str(art)).returncode == 1
    ok = run_cli("verify", str(art), "--serve", "completion")
    assert ok.returncode == 0, ok.stderr
