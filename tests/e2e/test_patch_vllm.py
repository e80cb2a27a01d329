"""Real-model proof of the patch stage: SmolLM2-135M-Instruct broken the Llama 3 way runs
past its end-of-turn token in real vLLM; after `modelyard patch` it stops right there.

The broken copy: generation_config and config `eos_token_id` and the tokenizer's `eos_token` are
`<|endoftext|>` (id 0) while the chat template still ends turns with `<|im_end|>` (id 2).
"""

from __future__ import annotations

import json
import shutil

import pytest

from modelyard.settings import Settings
from modelyard.stages.smoke import smoke_load
from tests.conftest import json_result, run_cli

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]

QUESTION = "What is the capital of France?"


def _edit(path, fn):
    data = json.loads(path.read_text())
    fn(data)
    path.write_text(json.dumps(data, indent=2) + "\n")


@pytest.fixture(scope="module")
def broken_smollm2(demo_run, tmp_path_factory):
    _, out = demo_run
    d = tmp_path_factory.mktemp("broken") / "smollm2-broken"
    shutil.copytree(f"{out['artifact']}/model", d)
    for p in d.iterdir():
        p.chmod(0o644)
    _edit(d / "generation_config.json", lambda g: g.update(eos_token_id=0))
    _edit(d / "config.json", lambda c: c.update(eos_token_id=0))
    _edit(d / "tokenizer_config.json", lambda t: t.update(eos_token="<|endoftext|>"))
    return d


def test_broken_runs_past_end_of_turn_and_patch_stops_it(broken_smollm2, tmp_path):
    before = run_cli("verify", str(broken_smollm2), "--serve", "chat", "--json")
    assert before.returncode == 1
    codes = [f["code"] for f in json_result(before.stdout, "verify", 1)["findings"] if f["severity"] == "error"]
    assert codes == ["tokenizer.stop_tokens.missing_turn_terminator"]

    settings = Settings()
    broken = smoke_load(broken_smollm2, settings, question=QUESTION, max_tokens=48)
    raw = broken.text_with_special_tokens or ""
    assert "Paris" in raw
    # Generation ran past the end of its answer: <|im_end|> is followed by more tokens.
    assert "<|im_end|>" in raw and not raw.endswith("<|im_end|>"), raw
    assert broken.passed is False

    r = run_cli("patch", str(broken_smollm2), "--out", str(tmp_path / "fixed"), "--serve", "chat")
    assert r.returncode == 0, r.stderr
    assert '"eos_token_id": [\n+    0,\n+    2\n+  ]' in r.stdout
    after = run_cli("verify", str(tmp_path / "fixed" / "model"), "--serve", "chat", "--json")
    assert after.returncode == 0
    assert [f for f in json_result(after.stdout, "verify")["findings"] if f["severity"] != "info"] == []

    fixed = smoke_load(tmp_path / "fixed" / "model", settings, question=QUESTION, max_tokens=48)
    assert fixed.passed is True and fixed.finish_reason == "stop" and fixed.last_token == "<|im_end|>"
    assert "Paris" in fixed.text
    # Nothing after the answer: the one <|im_end|> is the last token.
    assert fixed.text_with_special_tokens.count("<|im_end|>") == 1
    assert fixed.text_with_special_tokens.endswith("<|im_end|>")


def test_ingest_repairs_what_the_runtime_also_finds_before_refusing(broken_smollm2, tmp_path):
    """With the runtime oracle on, vLLM's own reading of the same defect (runtime.chat.turn_terminator_not_stop,
    the twin of tokenizer.stop_tokens.missing_turn_terminator) refused the ingest before the patch stage repaired
    it. Now the repair comes first and the runtime judges the patched folder: repaired, smoked, published."""
    from tests.conftest import store_artifacts

    home = tmp_path / "store"
    r = run_cli("ingest", f"file://{broken_smollm2}", "--serve", "chat", "--out", str(home), "--json",
                env={"MODELYARD_VERIFY_RUNTIME": "local"})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json_result(r.stdout, "ingest")
    assert (res["patches"], res["smoke"]["passed"], res["smoke"]["finish_reason"]) == (1, True, "stop")
    assert "Paris" in res["smoke"]["text"]
    (art,) = store_artifacts(home)
    diff = (art / "patch.diff").read_text()
    assert diff.startswith("--- a/generation_config.json") and '-  "eos_token_id": 0,' in diff
    assert '"eos_token_id": [\n+    0,\n+    2\n+  ]' in diff
    report = json.loads((art / "report.json").read_text())
    codes = {f["code"] for f in report["findings"]}
    assert report["summary"]["passed"] is True
    assert not codes & {"runtime.chat.turn_terminator_not_stop", "tokenizer.stop_tokens.missing_turn_terminator"}
