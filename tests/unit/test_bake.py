"""The rollout bake's reading of a canary's own series (no server: the bake against a real vLLM canary behind
nginx is tests/e2e/test_rollout_nginx.py): vLLM's /metrics exposition text, and the quantile of the requests a
histogram gained between two readings, by Prometheus' histogram_quantile rule."""

from __future__ import annotations

import math

import pytest

from modelyard.stages.bake import histogram_quantile, parse_metrics


def _exposition(requests_2xx: int, requests_5xx: int, ttft: dict[str, int]) -> str:
    """/metrics as vLLM 0.32's API server writes it: the instrumentator's counter per handler and status class,
    and a latency histogram per model label set."""
    lines = ["# HELP http_requests_total Total number of requests by method, status and handler.",
             "# TYPE http_requests_total counter",
             f'http_requests_total{{handler="/v1/completions",method="POST",status="2xx"}} {requests_2xx}.0',
             f'http_requests_total{{handler="/v1/completions",method="POST",status="5xx"}} {requests_5xx}.0',
             'http_requests_total{handler="/v1/models",method="GET",status="2xx"} 7.0',
             'http_requests_total{handler="/tokenize",method="POST",status="5xx"} 3.0',
             "# TYPE vllm:time_to_first_token_seconds histogram"]
    lines += [f'vllm:time_to_first_token_seconds_bucket{{engine="0",le="{le}",model_name="m"}} {n}.0'
              for le, n in ttft.items()]
    lines += [f'vllm:time_to_first_token_seconds_count{{engine="0",model_name="m"}} {ttft["+Inf"]}.0']
    return "\n".join(lines) + "\n"


def test_parse_metrics_counts_api_requests_and_reads_buckets():
    s = parse_metrics(_exposition(12, 2, {"0.1": 2, "0.5": 6, "1.0": 9, "+Inf": 10}))
    # /v1/ handlers only: 12 + 2 + the 7 of /v1/models; /tokenize is not the API clients call
    assert (s.requests, s.errors) == (21, 2)
    assert s.buckets["ttft"] == {0.1: 2.0, 0.5: 6.0, 1.0: 9.0, math.inf: 10.0}
    assert s.buckets["e2el"] == {}


@pytest.mark.parametrize(("q", "want"), [(0.1, 0.05), (0.5, 0.4), (0.9, 1.0), (0.95, 1.0)])
def test_quantile_of_what_was_observed_between_two_readings(q, want):
    before = {0.1: 1.0, 0.5: 1.0, 1.0: 1.0, math.inf: 1.0}  # one request before the bake: left out
    after = {0.1: 3.0, 0.5: 7.0, 1.0: 10.0, math.inf: 11.0}
    assert histogram_quantile(q, before, after) == pytest.approx(want)


def test_no_request_in_between_is_not_judged():
    same = {0.1: 3.0, math.inf: 3.0}
    assert (histogram_quantile(0.95, same, same), histogram_quantile(0.95, {}, {})) == (None, None)


def test_a_canary_that_is_gone_is_named_by_its_health():
    """Nothing listens on the canary's port (a canary that died before the bake's first look): the bake ends at
    once on /health, and says so rather than that its metrics cannot be read."""
    import socket

    from modelyard.stages.bake import bake

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again when the block ends: connection refused
    v = bake(f"http://127.0.0.1:{port}", 30.0, slo={"ttft_p95_ms": 500.0})
    assert (v.polls, v.unhealthy, v.requests, v.errors, v.failed, v.seconds < 30) == (
        1, 1, 0, 0, ("bake: the canary's /health did not answer 200",), True)
    assert v.latency == {"ttft_p50_ms": None, "ttft_p95_ms": None, "e2el_p50_ms": None, "e2el_p95_ms": None}
