"""Metrics for real: Debian's prometheus runs the demo artifact's generated serve/prometheus.yml
(target rewritten to the session's vLLM server) and scrapes vLLM's /metrics; a query for a `vllm:`
series returns a value, and every query of the generated Grafana dashboard returns data. The
generated alerts.yml, beside it, is loaded and evaluated: every rule healthy, none firing against an
idle server; against a target that does not answer, the server-down alert goes pending (no vLLM
needed for that one)."""

from __future__ import annotations

import json
import math
import time

import httpx
import pytest

from modelyard.stages.serve import ServeTarget, plan_serve, write_serve_files
from modelyard.stages.serve.alerts import ALERTS_FILE
from modelyard.stages.serve.monitoring import DASHBOARD_FILE
from tests.e2e.publish_servers import free_port
from tests.e2e.serving_tools import PROMETHEUS, prometheus, rewrite_prometheus_yml, tool_missing
from tests.unit.test_serve_plan import artifact, llamas  # noqa: F401 - fixtures

pytestmark = [pytest.mark.prometheus, pytest.mark.e2e]
#: the alerts of serve/alerts.yml
ALERTS = ["VLLMTTFTBudgetBurnFast", "VLLMTTFTBudgetBurnSlow", "VLLME2ELatencyBudgetBurnFast",
          "VLLME2ELatencyBudgetBurnSlow", "VLLMRequestsWaiting", "VLLMQueueGrowing", "VLLMKVCacheNearlyFull",
          "VLLMPreemptions", "VLLMServerDown"]


def _query(prom: str, expr: str) -> list[dict]:
    r = httpx.get(f"{prom}/api/v1/query", params={"query": expr}, timeout=10)
    r.raise_for_status()
    body = r.json()
    assert body["status"] == "success", body
    return body["data"]["result"]


def _poll(prom: str, expr: str, timeout: float = 30.0) -> list[dict]:
    """The query's result once it has a finite value (scrapes every second), else the last result."""
    deadline = time.monotonic() + timeout
    while True:
        res = _query(prom, expr)
        if any(math.isfinite(float(s["value"][1])) for s in res) or time.monotonic() > deadline:
            return res
        time.sleep(0.5)


def _chat(base: str, name: str, n: int) -> None:
    with httpx.Client(base_url=base, timeout=120) as c:
        for i in range(n):
            r = c.post("/v1/chat/completions", json={"model": name, "max_tokens": 8, "temperature": 0,
                                                     "messages": [{"role": "user", "content": f"Count to {i + 3}."}]})
            r.raise_for_status()


def _rules(prom: str, timeout: float = 30.0) -> dict[str, dict]:
    """The loaded alerting rules by name, once each has been evaluated (health no longer ``unknown``)."""
    deadline = time.monotonic() + timeout
    while True:
        r = httpx.get(f"{prom}/api/v1/rules", params={"type": "alert"}, timeout=10)
        r.raise_for_status()
        rules = {rule["name"]: rule for g in r.json()["data"]["groups"] for rule in g["rules"]}
        if (rules and all(rule["health"] != "unknown" for rule in rules.values())) or time.monotonic() > deadline:
            return rules
        time.sleep(0.5)


@pytest.mark.skipif(tool_missing(PROMETHEUS), reason="Debian prometheus is not installed (make test installs it)")
def test_prometheus_loads_the_generated_alerts_and_pages_on_a_dead_target(artifact, tmp_path):  # noqa: F811
    files = write_serve_files(tmp_path / "out", plan_serve(artifact, ServeTarget("H100-80GB", gpus=4)))
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    config = rewrite_prometheus_yml(files.prometheus_yml.read_text(), dead)
    with prometheus(config, tmp_path / "prometheus", {ALERTS_FILE: files.alerts_yml.read_text()}) as prom:
        rules = _rules(prom)
        assert list(rules) == ALERTS
        assert {n: (r["health"], r["labels"]["severity"]) for n, r in rules.items()}["VLLMServerDown"] == ("ok", "page")
        assert all(r["health"] == "ok" for r in rules.values()), {n: r.get("lastError") for n, r in rules.items()}
        deadline = time.monotonic() + 30
        while rules["VLLMServerDown"]["state"] != "pending" and time.monotonic() < deadline:
            time.sleep(0.5)
            rules = _rules(prom)
        assert rules["VLLMServerDown"]["state"] == "pending"  # up == 0; fires after 5 min
        (alert,) = rules["VLLMServerDown"]["alerts"]
        assert (alert["labels"]["instance"], alert["labels"]["job"]) == (dead, "vllm")
        assert {n: r["state"] for n, r in rules.items() if n != "VLLMServerDown"} == dict.fromkeys(ALERTS[:-1], "inactive")


@pytest.mark.vllm
@pytest.mark.skipif(tool_missing(PROMETHEUS), reason="Debian prometheus is not installed (make test installs it)")
def test_prometheus_scrapes_vllm_with_the_generated_config(vllm_server, tmp_path):
    art, server = vllm_server
    name = server.name
    generated = (art / "serve" / "prometheus.yml").read_text()
    config = rewrite_prometheus_yml(generated, server.base.removeprefix("http://"))
    alerts = {ALERTS_FILE: (art / "serve" / ALERTS_FILE).read_text()}
    with prometheus(config, tmp_path / "prometheus", alerts) as prom:
        up = _poll(prom, 'up{job="vllm"}')
        assert [(s["metric"]["instance"], s["value"][1]) for s in up] == [(server.base.removeprefix("http://"), "1")]
        running = _poll(prom, "vllm:num_requests_running")
        assert len(running) == 1 and running[0]["value"][1] == "0"  # idle between requests
        labels = running[0]["metric"]
        assert (labels["job"], labels["model_name"], labels["served_model_name"], labels["engine"]) == (
            "vllm", name, name, "0")
        assert float(_poll(prom, "vllm:kv_cache_usage_perc")[0]["value"][1]) >= 0

        # traffic between scrapes, so that the histograms' rates have data
        _chat(server.base, name, 3)
        time.sleep(2.5)
        dashboard = json.loads((art / "serve" / DASHBOARD_FILE).read_text())
        seen = {}
        for panel in dashboard["panels"]:
            for t in panel["targets"]:
                expr = t["expr"].replace("$model_name", name).replace("$__rate_interval", "1m")
                res = _poll(prom, expr, timeout=15)
                seen[(panel["title"], t["legendFormat"])] = [float(s["value"][1]) for s in res]
        assert list(seen) == [
            ("Time to first token (TTFT)", "p50"), ("Time to first token (TTFT)", "p95"),
            ("Time to first token (TTFT)", "p99"), ("Inter-token latency (ITL)", "p50"),
            ("Inter-token latency (ITL)", "p95"), ("Inter-token latency (ITL)", "p99"),
            ("Requests running / waiting", "running"), ("Requests running / waiting", "waiting"),
            ("KV-cache usage", "KV cache used"), ("Token throughput", "generated tokens/s"),
            ("Token throughput", "prompt tokens/s")]
        for key, values in seen.items():
            assert len(values) == 1 and math.isfinite(values[0]) and values[0] >= 0, (key, values)
        for key in [k for k in seen if k[0] in ("Time to first token (TTFT)", "Inter-token latency (ITL)",
                                                   "Token throughput")]:
            assert seen[key][0] > 0, key  # 3 chats: latencies and throughput are positive
        # the alerts against the live series: all evaluate, none fires for three short chats
        rules = _rules(prom)
        assert list(rules) == ALERTS
        assert {n: r["health"] for n, r in rules.items()} == dict.fromkeys(ALERTS, "ok")
        # the latency budgets (TTFT 0.5 s, end-to-end) depend on the host's speed: on a 2-core AVX2 host the three
        # chats' TTFT exceeds 0.5 s and their burn alerts go pending (condition true, not yet for their `for`
        # duration); none may fire, and every alert that does not measure latency stays inactive
        speed = [n for n in ALERTS if n.startswith(("VLLMTTFT", "VLLME2ELatency"))]
        assert {n: r["state"] for n, r in rules.items() if n not in speed} == dict.fromkeys(
            [n for n in ALERTS if n not in speed], "inactive")
        assert {n: rules[n]["state"] in ("inactive", "pending") for n in speed} == dict.fromkeys(speed, True)
