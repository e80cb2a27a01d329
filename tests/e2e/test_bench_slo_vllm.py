"""The bench level's SLO verdict for real: `modelyard smoke --smoke bench --url` against the session's
vLLM server runs vLLM's own benchmark client; loose targets pass (exit 0), an impossible one fails the
gate (exit 1) naming the target."""

from __future__ import annotations

import json

import pytest

from tests.conftest import json_envelope, json_result, run_cli

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]

LOOSE = "ttft_p95_ms=120000,itl_p99_ms=10000,error_rate=0,output_tokens_per_s=0.1"


def _bench(art, base: str, slo: str):
    return run_cli("smoke", str(art), "--smoke", "bench", "--url", base, "--slo", slo, "--json", timeout=900)


def test_bench_meets_loose_targets(vllm_server):
    art, server = vllm_server
    r = _bench(art, server.base, LOOSE)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    s = json_result(r.stdout, "smoke")
    assert (s["passed"], s["level"], s["url"], s["startup_seconds"], s["error"]) == (True, "bench", server.base, None, None)
    b = s["bench"]
    assert (b["completed"], b["failed"], b["errors"]) == (8, 0, [])
    assert b["total_output_tokens"] == 8 * 16  # --ignore-eos: every request generates output_len tokens
    for m in ("ttft", "itl"):
        assert 0 < b[f"p50_{m}_ms"] <= b[f"p95_{m}_ms"] <= b[f"p99_{m}_ms"], m
    assert b["output_throughput"] > 0 and b["request_throughput"] > 0
    assert b["device"] == {"type": "cpu", "name": "cpu", "memory_bytes": None}
    slo = b["slo"]
    # the four --slo targets, then the cpu class's default left (itl_p95_ms); error_rate came from --slo
    assert (slo["class"], slo["passed"]) == ("cpu", True)
    assert [(v["target"], v["limit"], v["source"], v["passed"]) for v in slo["verdicts"]] == [
        ("ttft_p95_ms", 120000.0, "--slo", True), ("itl_p95_ms", 2000.0, "default", True),
        ("error_rate", 0.0, "--slo", True), ("itl_p99_ms", 10000.0, "--slo", True),
        ("output_tokens_per_s", 0.1, "--slo", True)]
    assert {v["target"]: v["value"] for v in slo["verdicts"]}["ttft_p95_ms"] == b["p95_ttft_ms"]


def test_impossible_target_fails_the_gate(vllm_server):
    art, server = vllm_server
    r = _bench(art, server.base, "ttft_p95_ms=0.001")
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    s = json_envelope(r.stdout, "smoke", 1)["result"]
    assert (s["passed"], s["error"]) == (False, "failed: slo:ttft_p95_ms")
    b = s["bench"]
    assert (b["completed"], b["failed"], b["passed"]) == (8, 0, False)
    missed = [v for v in b["slo"]["verdicts"] if not v["passed"]]
    assert [(v["target"], v["limit"], v["value"]) for v in missed] == [("ttft_p95_ms", 0.001, b["p95_ttft_ms"])]
    assert b["p95_ttft_ms"] > 0.001
    # the server itself passed, the numerical gate included; only the target failed
    assert [(c["name"], c["passed"]) for c in s["checks"]][-1] == ("numeric", True)
    assert [c["passed"] for c in s["checks"]] == [True] * 8


#: the sweep's prompts: 3 rows, one without output_len (it takes --output-len 6)
SWEEP_PROMPTS = [{"prompt": "Name a colour.", "output_len": 4}, {"prompt": "Count to three.", "output_len": 8},
                 {"prompt": "Say hello."}]


def test_sweep_two_levels_from_a_prompts_file(vllm_server, tmp_path):
    """A 2-level sweep (concurrency 1 then 2, 3 requests each, the prompts file's lengths): every request of
    each level completes with exactly its output length (--ignore-eos), the levels come in order, each is
    judged, the sizing answer is the higher level under loose targets, and --bench-out writes bench.json
    (the same result) and a PNG that opens."""
    from PIL import Image

    art, server = vllm_server
    f = tmp_path / "prompts.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in SWEEP_PROMPTS))
    r = run_cli("smoke", str(art), "--smoke", "bench", "--url", server.base, "--slo", LOOSE, "--concurrency", "1,2",
                "--requests", "3", "--prompts", str(f), "--output-len", "6", "--bench-out", str(tmp_path / "out"),
                "--json", timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    b = json_result(r.stdout, "smoke")["bench"]
    levels = b["levels"]
    assert [(x["concurrency"], x["num_prompts"], x["completed"], x["failed"], x["errors"], x["passed"])
            for x in levels] == [(1, 3, 3, 0, [], True), (2, 3, 3, 0, [], True)]
    # 3 requests of 3 rows: each row once, 4 + 8 + 6 output tokens
    assert [x["total_output_tokens"] for x in levels] == [18, 18]
    for x in levels:
        for m in ("ttft", "itl", "e2el"):
            assert 0 < x[f"p50_{m}_ms"] <= x[f"p95_{m}_ms"] <= x[f"p99_{m}_ms"], (x["concurrency"], m)
        assert x["request_throughput"] > 0 and x["output_throughput"] > 0 and x["total_token_throughput"] > 0
        assert [v["target"] for v in x["slo"]["verdicts"]] == ["ttft_p95_ms", "itl_p95_ms", "error_rate", "itl_p99_ms",
                                                              "output_tokens_per_s"]
    assert (b["max_concurrency_meeting_slo"], b["passed"], b["p95_ttft_ms"]) == (2, True, levels[1]["p95_ttft_ms"])
    assert b["spec"]["concurrency"] == [1, 2] and b["spec"]["prompts"] == str(f)
    assert b["files"] == {"json": str(tmp_path / "out" / "bench.json"), "plot": str(tmp_path / "out" / "bench.png")}
    written = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert written == {k: v for k, v in b.items() if k != "files"}
    with Image.open(tmp_path / "out" / "bench.png") as im:
        assert (im.format, im.size) == ("PNG", (1100, 750))
    print("sweep figures:", json.dumps([{k: x[k] for k in ("concurrency", "duration", "p50_ttft_ms", "p95_ttft_ms",
                                                          "p50_itl_ms", "p95_itl_ms", "p50_e2el_ms", "p95_e2el_ms",
                                                          "p99_e2el_ms", "request_throughput", "output_throughput")}
                                         for x in levels]))


def test_open_loop_levels_offer_poisson_arrivals(vllm_server, tmp_path):
    """--request-rate: vLLM's client offers each rate with Poisson arrivals whatever the answers do (an open loop,
    which a capacity test needs); each level sends its requests, is judged, and the sizing answer is a rate."""
    from PIL import Image

    art, server = vllm_server
    r = run_cli("smoke", str(art), "--smoke", "bench", "--url", server.base, "--slo", LOOSE, "--request-rate", "4,1",
                "--requests", "4", "--output-len", "4", "--bench-out", str(tmp_path / "out"), "--json", timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    b = json_result(r.stdout, "smoke")["bench"]
    levels = b["levels"]
    assert [(x["request_rate"], x["concurrency"], x["num_prompts"], x["completed"], x["failed"], x["passed"])
            for x in levels] == [(1.0, None, 4, 4, 0, True), (4.0, None, 4, 4, 0, True)]
    assert [x["total_output_tokens"] for x in levels] == [16, 16]
    # an open loop does not wait for answers: 4 arrivals at 1/s span about 3 s whatever the server does
    assert levels[0]["duration"] >= 1.0, levels[0]["duration"]
    assert (b["max_request_rate_meeting_slo"], b["max_concurrency_meeting_slo"], b["passed"]) == (4.0, None, True)
    assert b["headline"] == {"concurrency": None, "request_rate": 4.0, "num_prompts": 4}
    assert (b["spec"]["request_rates"], b["spec"]["concurrency"]) == ([1.0, 4.0], [])
    with Image.open(tmp_path / "out" / "bench.png") as im:
        assert (im.format, im.size) == ("PNG", (1100, 750))
