"""The metrics files of serve/ (prometheus.yml, grafana-dashboard.json, the compose service) and the
nginx front's routes, as files: promtool (Debian prometheus) validates the scrape config, the dashboard
uses metric names the installed vLLM defines. The real runs are tests/e2e/test_metrics_prometheus.py
and tests/e2e/test_proxy_nginx.py."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
import yaml

from modelyard.settings import Settings
from modelyard.stages.serve import ServeTarget, plan_serve
from modelyard.stages.serve.files import write_serve_files
from modelyard.stages.serve.monitoring import DASHBOARD_FILE, PROMETHEUS_IMAGE, grafana_dashboard
from tests.unit.test_serve_plan import artifact, llamas  # noqa: F401 - fixtures

#: the series the dashboard reads, by their exposed names (a counter gets ``_total``, a histogram ``_bucket``)
DASHBOARD_SERIES = ["vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket",
                    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                    "vllm:generation_tokens_total", "vllm:prompt_tokens_total"]


@pytest.fixture()
def files(artifact):  # noqa: F811 - the fixture imported above
    return write_serve_files(artifact, plan_serve(artifact, ServeTarget("H100-80GB", gpus=4)), proxy=True)


def test_prometheus_yml(files):
    cfg = yaml.safe_load(files.prometheus_yml.read_text())
    assert cfg == {"global": {"scrape_interval": "15s", "evaluation_interval": "15s"},
                   "scrape_configs": [{"job_name": "vllm", "metrics_path": "/metrics", "scheme": "http",
                                       "static_configs": [{"targets": ["vllm:8000"],
                                                           "labels": {"served_model_name": "llama-3.1-70b"}}]}]}


def test_promtool_accepts_the_scrape_config(files, tmp_path):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool (Debian prometheus) is not installed (make test installs it)")
    r = subprocess.run([promtool, "check", "config", str(files.prometheus_yml)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    bad = tmp_path / "bad.yml"  # the checker is real: a typo in a key is refused
    bad.write_text(files.prometheus_yml.read_text().replace("metrics_path:", "metric_path:"))
    r = subprocess.run([promtool, "check", "config", str(bad)], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "metric_path" in r.stdout + r.stderr


def test_compose_runs_prometheus_beside_vllm(files):
    doc = yaml.safe_load(files.compose_yaml.read_text())
    assert list(doc["services"]) == ["vllm", "nginx", "prometheus"]
    assert doc["services"]["prometheus"] == {
        "image": PROMETHEUS_IMAGE,
        "command": ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus",
                    "--storage.tsdb.retention.time=15d"],
        "volumes": ["./prometheus.yml:/etc/prometheus/prometheus.yml:ro", "prometheus-data:/prometheus"],
        "ports": ["127.0.0.1:9090:9090"], "depends_on": ["vllm"], "restart": "unless-stopped"}
    assert doc["volumes"] == {"prometheus-data": {}}
    readme = files.readme.read_text()
    assert "## Metrics (Prometheus, Grafana)" in readme and DASHBOARD_FILE in readme


def test_grafana_dashboard(files):
    d = json.loads(files.grafana_dashboard.read_text())
    assert d == grafana_dashboard("llama-3.1-70b")
    assert (d["uid"], d["title"], d["schemaVersion"]) == ("modelyard-vllm", "vLLM: llama-3.1-70b", 39)
    assert [(p["title"], p["fieldConfig"]["defaults"]["unit"], len(p["targets"])) for p in d["panels"]] == [
        ("Time to first token (TTFT)", "ms", 3), ("Inter-token latency (ITL)", "ms", 3),
        ("Requests running / waiting", "short", 2), ("KV-cache usage", "percentunit", 1), ("Token throughput", "short", 2)]
    assert [v["name"] for v in d["templating"]["list"]] == ["datasource", "model_name"]
    assert d["templating"]["list"][1]["current"] == {"text": "llama-3.1-70b", "value": "llama-3.1-70b"}
    exprs = [t["expr"] for p in d["panels"] for t in p["targets"]]
    assert sorted({m for e in exprs for m in re.findall(r"vllm:\w+", e)}) == sorted(DASHBOARD_SERIES)
    assert all('model_name="$model_name"' in e for e in exprs)
    ids = [p["id"] for p in d["panels"]]
    assert len(set(ids)) == len(ids)


def test_dashboard_metrics_are_the_installed_vllms():
    """Each series the dashboard reads is declared by the runtime venv's vLLM (its Prometheus logger)."""
    python = Settings().vllm_interpreter()
    found = sorted(python.parent.parent.glob("lib/python3*/site-packages/vllm/v1/metrics/loggers.py"))
    if not found:
        pytest.skip("the vLLM runtime venv is not built (make setup builds it)")
    declared = set(re.findall(r'name="(vllm:\w+)"', found[0].read_text()))
    exposed = {re.sub(r"_(bucket|total)$", "", s) for s in DASHBOARD_SERIES}
    assert exposed <= declared, exposed - declared


def test_nginx_routes(files):
    conf = files.nginx_conf.read_text()
    locations = re.findall(r"^    location ([^{]+) \{", conf, re.M)
    assert locations == ["= /health", "/v1/", "/"]
    api = conf.split("location /v1/ {")[1].split("\n    }")[0]
    for directive in ("if ($modelyard_key_ok = 0)", "return 401", "proxy_buffering off;", "proxy_pass http://vllm;"):
        assert directive in api
    rest = conf.split("    location / {")[1].split("\n    }")[0]
    assert "return 404" in rest and "proxy_pass" not in rest  # /metrics and the rest never reach vLLM
