"""The gate follows the target's serving mode: the smoke's pass rule per mode, the mode threaded from
``smoke_load`` to the vLLM runner and into SmokeResult (a fake runtime interpreter stands in for
vLLM), the completions API of the server smoke (a mock transport), the reuse rule of a stored smoke,
and the one CLI default of ``ingest`` and ``verify``. Real vLLM: tests/e2e/test_completion_vllm.py."""

from __future__ import annotations

import json
import re
import shutil
import sys

import httpx
import pytest
from typer.testing import CliRunner

from modelyard.artifact.records import SmokeRecord
from modelyard.cli import app
from modelyard.errors import InvalidTargetError
from modelyard.flows.ingest import smoke_covers
from modelyard.flows.options import IngestOptions
from modelyard.model.modes import DEFAULT_SERVE, judge_answer
from modelyard.settings import Settings
from modelyard.stages.smoke import bench, golden, smoke_load
from modelyard.stages.smoke import server as ss
from tests.conftest import json_result, run_cli


@pytest.mark.parametrize("mode,text,finish,error", [
    ("chat", "Paris.", "stop", None),
    ("chat", "Paris, Paris, Paris", "length",
     "finish_reason='length': the model did not stop at its end-of-turn token within 64 tokens"),
    ("chat", "  ", "stop", "finish_reason='stop': vLLM returned no text for the chat turn"),
    ("completion", " Paris.", "stop", None),
    ("completion", " Paris, the city of light, is", "length", None),
    ("completion", "", "length", "finish_reason='length': vLLM returned no text for the plain-text prompt"),
    ("completion", " Paris", "abort",
     "finish_reason='abort': vLLM did not end the completion normally (expected stop or length)"),
    ("completion", " Paris", None,
     "finish_reason=None: vLLM did not end the completion normally (expected stop or length)"),
])
def test_pass_rule_per_mode(mode, text, finish, error):
    assert judge_answer(mode, text, finish, 64) == error


def test_default_prompt_and_golden_set_per_mode():
    """A plain-text prompt is continued, not answered: the completion defaults are text to continue."""
    assert [IngestOptions(serve=m).smoke_prompt() for m in ("chat", "completion")] == [
        "What is the capital of France?", "The capital of France is"]
    assert IngestOptions(serve="completion", question="Once upon a time").smoke_prompt() == "Once upon a time"
    prompts, src = golden.load_golden(None, "completion")
    assert [(p.name, p.prompt, p.expect, p.max_tokens) for p in prompts] == [
        ("capital-of-france-continued", "The capital of France is", ("Paris",), 16)]
    assert src.startswith(str(ss.DATA / "golden-demo-completion.yaml") + "@sha256:")
    assert golden.load_golden(None)[1].startswith(str(golden.DATA / "golden-demo.yaml") + "@")


def test_unknown_mode_is_a_usage_error():
    with pytest.raises(InvalidTargetError, match="serving mode 'embed' is not chat or completion") as e:
        judge_answer("embed", "x", "stop", 64)
    assert e.value.exit_code == 2 and e.value.fix == "Use --serve chat or --serve completion."


FAKE_RUNNER = """#!{python}
import json, sys
argv = sys.argv[2:]
arg = lambda k: argv[argv.index(k) + 1]
mode = arg("--mode")
text = " Paris, and the river that runs through it" if mode == "completion" else "Paris."
json.dump({{"ok": True, "mode": mode, "argv": argv, "vllm_version": "fake", "text": text,
            "finish_reason": "length" if mode == "completion" else "stop", "completion_tokens": 8}},
          open(arg("--out"), "w"))
"""


@pytest.fixture()
def fake_runtime(tmp_path):
    """A stand-in for the vLLM runtime interpreter: answers like the runner would, without vLLM."""
    py = tmp_path / "fake-python"
    py.write_text(FAKE_RUNNER.format(python=sys.executable))
    py.chmod(0o755)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text('{"max_position_embeddings": 2048}')
    return Settings(home=tmp_path / "home", vllm_python=py), tmp_path / "model"


@pytest.mark.parametrize("mode,passed,finish", [("chat", True, "stop"), ("completion", True, "length")])
def test_smoke_load_threads_the_mode_to_the_runner_and_the_result(fake_runtime, mode, passed, finish):
    settings, model = fake_runtime
    res = smoke_load(model, settings, question="The capital of France is", max_tokens=8, mode=mode)
    assert (res.mode, res.passed, res.finish_reason, res.error) == (mode, passed, finish, None)
    assert res.to_dict()["mode"] == mode and res.question == "The capital of France is"


def test_smoke_load_default_mode_is_chat(fake_runtime):
    settings, model = fake_runtime
    assert DEFAULT_SERVE == "chat"
    assert smoke_load(model, settings, question="q", max_tokens=8).mode == "chat"


def test_smoke_load_refuses_an_unknown_mode_before_starting_vllm(fake_runtime):
    settings, model = fake_runtime
    with pytest.raises(InvalidTargetError):
        smoke_load(model, settings, question="q", mode="chatty")


def _sse(events: list[dict]) -> bytes:
    return "".join(f"data: {json.dumps(e)}\n\n" for e in events).encode() + b"data: [DONE]\n\n"


def test_server_smoke_completion_requests_use_v1_completions():
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append((request.url.path, sorted(body)))
        if body.get("stream"):
            return httpx.Response(200, content=_sse([
                {"choices": [{"index": 0, "text": " Paris", "finish_reason": None}]},
                {"choices": [{"index": 0, "text": " is", "finish_reason": "length"}]},
                {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}}]))
        return httpx.Response(200, json={"choices": [{"index": 0, "text": " Paris is", "finish_reason": "length"}],
                                         "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}})

    with httpx.Client(base_url="http://test", transport=httpx.MockTransport(handler)) as client:
        plain = ss._ask(client, "completion", "m", "The capital of France is", 2)
        streamed = ss._ask_stream(client, "completion", "m", "The capital of France is", 2)
    assert ss.answer_text("completion", plain) == " Paris is"
    assert streamed == (" Paris is", "length", {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}, 3)
    assert seen == [("/v1/completions", ["max_tokens", "model", "prompt", "temperature"]),
                    ("/v1/completions", ["max_tokens", "model", "prompt", "stream", "stream_options", "temperature"])]
    assert ss.answer_text("chat", {"choices": [{"message": {"content": "Paris."}}]}) == "Paris."
    assert (bench.ENDPOINTS, bench.BENCH_BACKENDS) == ({"chat": "/v1/chat/completions", "completion": "/v1/completions"},
                                                 {"chat": "openai-chat", "completion": "openai"})


GATE = {"passed": True, "compared": True}


@pytest.mark.parametrize("prev,serve,level,covers", [
    ({"passed": True, "mode": "completion", "numeric": GATE}, "completion", "load", True),
    ({"passed": True, "mode": "completion", "numeric": GATE}, "chat", "load", False),  # never exercised the template
    ({"passed": True, "mode": "chat", "numeric": GATE}, "completion", "load", True),  # the stricter rule passed
    ({"passed": True, "numeric": GATE}, "chat", "load", True),  # stored before modes were recorded: a chat smoke
    ({"passed": False, "mode": "completion", "numeric": GATE}, "completion", "load", False),
    ({"passed": True, "mode": "completion", "level": "server", "numeric": GATE}, "completion", "load", True),
    ({"passed": True, "mode": "completion", "numeric": GATE}, "completion", "server", False),
    ({"passed": True, "mode": "chat"}, "chat", "load", False),  # stored before the numerical gate: smoke again
    ({"passed": True, "mode": "chat", "numeric": None}, "chat", "load", False),
])
def test_a_stored_smoke_is_reused_only_for_its_mode_or_a_weaker_one(prev, serve, level, covers):
    assert smoke_covers(SmokeRecord.model_validate(prev), IngestOptions(serve=serve, smoke_level=level)) is covers


def _help(command: str) -> str:
    r = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "100"})
    assert r.exit_code == 0, r.output
    return re.sub(r"\s+", " ", re.sub(r"[│╭╮╰╯─]", " ", r.output))


@pytest.mark.parametrize("command", ["ingest", "verify"])
def test_ingest_and_verify_document_one_default_serving_mode(command):
    assert ("--serve <chat|completion> how it will be served: chat (needs a chat template) or completion (plain-text "
            "prompts); default: chat; use --serve completion for a base model") in _help(command)


def test_verify_judges_for_chat_by_default_like_ingest(tiny_llama_dir, tmp_path):
    """A folder without a chat template: `verify` fails it by default, as `ingest` would; with
    --serve completion it passes with one warning."""
    d = tmp_path / "base"
    shutil.copytree(tiny_llama_dir, d)
    (d / "chat_template.jinja").chmod(0o644)
    (d / "chat_template.jinja").unlink()
    default = run_cli("verify", str(d), "--json")
    assert default.returncode == 1, default.stderr
    doc = json_result(default.stdout, "verify", 1)
    assert doc["target"]["serve"] == "chat"
    assert [(f["code"], f["severity"]) for f in doc["findings"]] == [("tokenizer.chat_template.missing", "error")]
    completion = run_cli("verify", str(d), "--serve", "completion", "--json")
    assert completion.returncode == 0, completion.stderr
    doc = json_result(completion.stdout, "verify")
    assert doc["target"]["serve"] == "completion"
    assert [(f["code"], f["severity"]) for f in doc["findings"]] == [("tokenizer.chat_template.missing", "warning")]
