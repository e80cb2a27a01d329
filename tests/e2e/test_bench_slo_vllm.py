"""The bench level's SLO verdict for real: `modelyard smoke --smoke bench --url` against the session's
vLLM server runs vLLM's own benchmark client; loose targets pass (exit 0), an impossible one fails the
gate (exit 1) naming the target."""

from __future__ import annotations

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
