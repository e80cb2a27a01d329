"""The metrics files of serve/ (prometheus.yml, alerts.yml, grafana-dashboard.json, the compose service)
and the nginx front's routes, as files: promtool (Debian prometheus) validates the scrape config and the
rules and runs the rules against synthetic series (each alert fires on a bad series and stays silent on
its healthy twin); the dashboard and the alerts use metric names and bucket bounds the installed vLLM
defines. The real runs are tests/e2e/test_metrics_prometheus.py
and tests/e2e/test_proxy_nginx.py."""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess

import pytest
import yaml

from modelyard.settings import Settings
from modelyard.stages.serve import ServeTarget, plan_serve
from modelyard.stages.serve import alerts as al
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
                   "rule_files": ["alerts.yml"],
                   "scrape_configs": [{"job_name": "vllm", "metrics_path": "/metrics", "scheme": "http",
                                       "static_configs": [{"targets": ["vllm:8000"],
                                                           "labels": {"served_model_name": "llama-3.1-70b"}}]}]}


def test_promtool_accepts_the_scrape_config(files, tmp_path):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool (Debian prometheus) is not installed (make test installs it)")
    r = subprocess.run([promtool, "check", "config", str(files.prometheus_yml)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    # rule_files resolves beside prometheus.yml: the written alerts.yml is found and checked too
    assert f"Checking {files.alerts_yml}\n  SUCCESS: 9 rules found" in r.stdout, r.stdout
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
        "volumes": ["./prometheus.yml:/etc/prometheus/prometheus.yml:ro", "./alerts.yml:/etc/prometheus/alerts.yml:ro",
                    "prometheus-data:/prometheus"],
        "ports": ["127.0.0.1:9090:9090"], "depends_on": ["vllm"], "restart": "unless-stopped"}
    assert doc["volumes"] == {"prometheus-data": {}}
    readme = files.readme.read_text()
    assert "## Metrics (Prometheus, Grafana)" in readme and DASHBOARD_FILE in readme
    assert ("`alerts.yml` holds the alerting rules Prometheus evaluates for `llama-3.1-70b`" in readme
            and "promtool check rules alerts.yml" in readme and "(95% within 0.5 s)" in readme
            and "(95% within 20 s)" in readme and "KV cache above 90%" in readme)


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


# -- alerts.yml ----------------------------------------------------------------------------------------

NAME = "llama-3.1-70b"
#: (alert, for, severity): the rules of alerts.yml, in order
ALERTS = [("VLLMTTFTBudgetBurnFast", "2m", "page"), ("VLLMTTFTBudgetBurnSlow", "15m", "ticket"),
          ("VLLME2ELatencyBudgetBurnFast", "2m", "page"), ("VLLME2ELatencyBudgetBurnSlow", "15m", "ticket"),
          ("VLLMRequestsWaiting", "15m", "ticket"), ("VLLMQueueGrowing", "10m", "page"),
          ("VLLMKVCacheNearlyFull", "15m", "ticket"), ("VLLMPreemptions", "10m", "ticket"),
          ("VLLMServerDown", "5m", "page")]
#: the series the alerts read, by their exposed names
ALERT_SERIES = ["vllm:e2e_request_latency_seconds_bucket", "vllm:e2e_request_latency_seconds_count",
                "vllm:kv_cache_usage_perc", "vllm:num_preemptions_total", "vllm:num_requests_waiting",
                "vllm:time_to_first_token_seconds_bucket", "vllm:time_to_first_token_seconds_count"]


def _promtool() -> str:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool (Debian prometheus) is not installed (make test installs it)")
    return promtool


def test_alert_rules(files):
    doc = yaml.safe_load(files.alerts_yml.read_text())
    assert doc == al.alert_rules(NAME) and list(doc) == ["groups"]
    (group,) = doc["groups"]
    assert group["name"] == "vllm"
    rules = group["rules"]
    assert [(r["alert"], r["for"], r["labels"]["severity"]) for r in rules] == ALERTS
    assert all(list(r) == ["alert", "expr", "for", "labels", "annotations"] and list(r["labels"]) == ["severity"]
               and list(r["annotations"]) == ["summary", "description"] for r in rules)
    assert all(r["annotations"]["summary"].startswith(f"{NAME}: ") and NAME in r["annotations"]["description"]
               for r in rules)
    exprs = {r["alert"]: r["expr"] for r in rules}
    assert sorted({m for e in exprs.values() for m in re.findall(r"vllm:\w+", e)}) == ALERT_SERIES
    # every vllm: series is the served model's; up is the scrape config's job and static label
    assert all(sel.startswith(f'model_name="{NAME}"') for e in exprs.values() for sel in re.findall(r"vllm:\w+\{([^}]*)\}", e))
    assert exprs["VLLMServerDown"] == f'up{{job="vllm", served_model_name="{NAME}"}} == 0'
    ttft = ('(1 - sum by (model_name) (rate(vllm:time_to_first_token_seconds_bucket{{model_name="{n}", le="0.5"}}[{w}]))'
            ' / sum by (model_name) (rate(vllm:time_to_first_token_seconds_count{{model_name="{n}"}}[{w}]))) > {x}')
    assert exprs["VLLMTTFTBudgetBurnFast"] == (ttft.format(n=NAME, w="1h", x="0.72") + "\nand\n"
                                               + ttft.format(n=NAME, w="5m", x="0.72"))
    assert exprs["VLLMTTFTBudgetBurnSlow"] == (ttft.format(n=NAME, w="6h", x="0.3") + "\nand\n"
                                               + ttft.format(n=NAME, w="30m", x="0.3"))
    assert 'vllm:e2e_request_latency_seconds_bucket{model_name="llama-3.1-70b", le=~"20(\\\\.0)?"}[1h]' in exprs[
        "VLLME2ELatencyBudgetBurnFast"]
    assert exprs["VLLMRequestsWaiting"] == f'sum by (model_name) (vllm:num_requests_waiting{{model_name="{NAME}"}}) > 0'
    assert exprs["VLLMKVCacheNearlyFull"] == f'max by (model_name) (vllm:kv_cache_usage_perc{{model_name="{NAME}"}}) > 0.9'
    assert exprs["VLLMPreemptions"] == (
        f'sum by (model_name) (increase(vllm:num_preemptions_total{{model_name="{NAME}"}}[5m])) > 0')
    assert exprs["VLLMQueueGrowing"] == (
        f'sum by (model_name) (deriv(vllm:num_requests_waiting{{model_name="{NAME}"}}[10m])) * 60 > 1\nand\n'
        f'sum by (model_name) (vllm:num_requests_waiting{{model_name="{NAME}"}}) > 0')
    # a served name with a quote stays one PromQL string
    assert 'model_name="a\\"b"' in al.alerts('a"b')[0].expr


def test_le_matcher_takes_both_spellings_of_a_whole_bound():
    assert al.le_matcher(0.5) == 'le="0.5"'
    assert al.le_matcher(20.0) == 'le=~"20(\\\\.0)?"'  # vLLM writes 20.0, Prometheus 3 stores 20
    assert al.le_matcher(2.5) == 'le="2.5"'


def _vllm_metrics_dir():
    python = Settings().vllm_interpreter()
    found = sorted(python.parent.parent.glob("lib/python3*/site-packages/vllm/v1/metrics"))
    if not found:
        pytest.skip("the vLLM runtime venv is not built (make setup builds it)")
    return found[0]


def _bucket_bounds(source: str, name: str) -> tuple[float, ...]:
    (node,) = [n for n in ast.parse(source).body if isinstance(n, ast.AnnAssign) and getattr(n.target, "id", "") == name]
    return ast.literal_eval(node.value)


def test_alert_metrics_and_thresholds_are_the_installed_vllms():
    """The alerts' series are declared by the runtime venv's vLLM, and each latency target is one of
    its default histogram bounds (read from its source, not imported)."""
    d = _vllm_metrics_dir()
    declared = set(re.findall(r'name="(vllm:\w+)"', (d / "loggers.py").read_text()))
    assert {re.sub(r"_(bucket|count|total)$", "", s) for s in ALERT_SERIES} <= declared
    buckets = (d / "buckets.py").read_text()
    assert "time_to_first_token_buckets" in (d / "loggers.py").read_text()
    assert al.TTFT_TARGET_S in _bucket_bounds(buckets, "TIME_TO_FIRST_TOKEN_BUCKETS")
    assert al.E2E_TARGET_S in _bucket_bounds(buckets, "REQUEST_LATENCY_BUCKETS")
    assert 0.6 not in _bucket_bounds(buckets, "TIME_TO_FIRST_TOKEN_BUCKETS")  # the reader is real


def test_promtool_checks_the_rules(files, tmp_path):
    promtool = _promtool()
    r = subprocess.run([promtool, "check", "rules", str(files.alerts_yml)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "SUCCESS: 9 rules found" in r.stdout, r.stdout + r.stderr
    bad = tmp_path / "bad.yml"  # the checker is real: a broken template is refused
    bad.write_text(files.alerts_yml.read_text().replace("{{ $labels.instance }}", "{{ $labels.instance"))
    r = subprocess.run([promtool, "check", "rules", str(bad)], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "VLLMServerDown" in r.stdout + r.stderr


def _series(metric: str, values: str, name: str = NAME, **labels: str) -> dict[str, str]:
    sel = ", ".join(f'{k}="{v}"' for k, v in {"model_name": name, "engine": "0", **labels}.items())
    return {"series": f"{metric}{{{sel}}}", "values": values}


def _latency(metric: str, le: str, good_per_min: int, name: str = NAME) -> list[dict[str, str]]:
    """A histogram's ``le`` bucket and count over 7 h, 60 requests a minute, ``good_per_min`` within ``le``."""
    return [_series(f"{metric}_bucket", f"0+{good_per_min}x420", name, le=le),
            _series(f"{metric}_count", "0+60x420", name)]


def _fires(rule: dict, at: str, labels: dict[str, str], **values: str) -> dict:
    """An ``alert_rule_test`` expecting ``rule`` to fire at ``at`` with ``labels``; its annotations are the
    rule's templates with ``$value`` / ``$labels.instance`` rendered as ``values`` say."""
    ann = {k: re.sub(r"\{\{ \$value[^}]*\}\}", values.get("value", ""),
                     v.replace("{{ $labels.instance }}", values.get("instance", ""))) for k, v in rule["annotations"].items()}
    return {"eval_time": at, "alertname": rule["alert"],
            "exp_alerts": [{"exp_labels": {"severity": rule["labels"]["severity"], **labels}, "exp_annotations": ann}]}


def _silent(rule: dict, at: str) -> dict:
    return {"eval_time": at, "alertname": rule["alert"], "exp_alerts": []}


def _rule_tests(rules: dict[str, dict]) -> list[dict]:
    """The promtool test groups: per alert, a bad series (fires, exact labels and annotations) and its
    healthy twin (silent); then every series bad but for another model (all silent)."""
    ttft, e2e, m = "vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds", {"model_name": NAME}
    up = {"job": "vllm", "instance": "vllm:8000", "served_model_name": NAME}
    r = rules
    groups = [
        # 90 % of requests over 0.5 s: fast burn (> 72 %) fires
        (_latency(ttft, "0.5", 6), [_fires(r["VLLMTTFTBudgetBurnFast"], "70m", m, value="90%")]),
        # 40 %: the slow burn (> 30 % over 6 h and 30 m) fires, the fast one does not
        (_latency(ttft, "0.5", 36), [_fires(r["VLLMTTFTBudgetBurnSlow"], "60m", m, value="40%"),
                                     _silent(r["VLLMTTFTBudgetBurnFast"], "70m")]),
        # healthy twin: 2 of 60 slow (3.3 %, within the 5 % budget)
        (_latency(ttft, "0.5", 58), [_silent(r["VLLMTTFTBudgetBurnFast"], "70m"),
                                     _silent(r["VLLMTTFTBudgetBurnSlow"], "400m")]),
        (_latency(e2e, "20.0", 6), [_fires(r["VLLME2ELatencyBudgetBurnFast"], "70m", m, value="90%")]),
        (_latency(e2e, "20.0", 36), [_fires(r["VLLME2ELatencyBudgetBurnSlow"], "60m", m, value="40%"),
                                     _silent(r["VLLME2ELatencyBudgetBurnFast"], "70m")]),
        (_latency(e2e, "20.0", 58), [_silent(r["VLLME2ELatencyBudgetBurnFast"], "70m"),
                                     _silent(r["VLLME2ELatencyBudgetBurnSlow"], "400m")]),
        # the bad series with the bound as Prometheus 3 spells it ("20"): still matched, still fires (a
        # bucket the selector misses would leave the ratio empty, and the alert silent)
        (_latency(e2e, "20", 6), [_fires(r["VLLME2ELatencyBudgetBurnFast"], "70m", m, value="90%")]),
        # 5 waiting for 30 min: fires after 15 min, not before
        ([_series("vllm:num_requests_waiting", "5x30")],
         [_silent(r["VLLMRequestsWaiting"], "10m"), _fires(r["VLLMRequestsWaiting"], "20m", m, value="5")]),
        # a burst each other minute that drains: silent
        ([_series("vllm:num_requests_waiting", " ".join(["3", "0"] * 15))], [_silent(r["VLLMRequestsWaiting"], "20m")]),
        # +2 a minute for 30 min: growing
        ([_series("vllm:num_requests_waiting", "0+2x30")], [_fires(r["VLLMQueueGrowing"], "25m", m, value="2")]),
        # a steady queue of 5 (no growth) and one that drains: silent
        ([_series("vllm:num_requests_waiting", "5x30")], [_silent(r["VLLMQueueGrowing"], "25m")]),
        ([_series("vllm:num_requests_waiting", "30-1x30")], [_silent(r["VLLMQueueGrowing"], "25m")]),
        ([_series("vllm:kv_cache_usage_perc", "0.97x30")], [_fires(r["VLLMKVCacheNearlyFull"], "20m", m, value="97%")]),
        ([_series("vllm:kv_cache_usage_perc", "0.6x30")], [_silent(r["VLLMKVCacheNearlyFull"], "20m")]),
        # 30 preemptions a minute: 150 in 5 min
        ([_series("vllm:num_preemptions_total", "0+30x30")], [_fires(r["VLLMPreemptions"], "20m", m, value="150")]),
        ([_series("vllm:num_preemptions_total", "7x30")], [_silent(r["VLLMPreemptions"], "20m")]),
        # scrapes fail from minute 6: pending at 9, firing at 13
        ([{"series": 'up{job="vllm", instance="vllm:8000", served_model_name="%s"}' % NAME, "values": "1x5 0x15"}],
         [_silent(r["VLLMServerDown"], "9m"), _fires(r["VLLMServerDown"], "13m", up, instance="vllm:8000")]),
        ([{"series": 'up{job="vllm", instance="vllm:8000", served_model_name="%s"}' % NAME, "values": "1x20"}],
         [_silent(r["VLLMServerDown"], "13m")]),
        # everything bad, but for another served model: none of this model's alerts fire
        ([*_latency(ttft, "0.5", 0, "other"), *_latency(e2e, "20.0", 0, "other"),
          _series("vllm:num_requests_waiting", "0+2x30", "other"), _series("vllm:kv_cache_usage_perc", "1x30", "other"),
          _series("vllm:num_preemptions_total", "0+30x30", "other"),
          {"series": 'up{job="vllm", instance="other:8000", served_model_name="other"}', "values": "0x30"}],
         [_silent(rule, "25m") for rule in rules.values()]),
    ]
    return [{"interval": "1m", "input_series": series, "alert_rule_test": tests} for series, tests in groups]


def test_promtool_test_rules_each_alert_fires_on_a_bad_series_and_not_on_its_healthy_twin(files, tmp_path):
    promtool = _promtool()
    rules = {r["alert"]: r for r in yaml.safe_load(files.alerts_yml.read_text())["groups"][0]["rules"]}
    tests = _rule_tests(rules)
    fired = {t["alertname"] for g in tests for t in g["alert_rule_test"] if t["exp_alerts"]}
    assert fired == set(rules)  # every alert has a firing case (and a silent one below)
    spec = tmp_path / "alerts_test.yml"
    spec.write_text(yaml.safe_dump({"rule_files": [str(files.alerts_yml)], "evaluation_interval": "1m",
                                    "tests": tests}, sort_keys=False))
    r = subprocess.run([promtool, "test", "rules", str(spec)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr
    # the test is real: the healthy TTFT twin with the fast threshold at 3 % instead of 72 % fires
    mutant = tmp_path / "mutant.yml"
    mutant.write_text(files.alerts_yml.read_text().replace("> 0.72", "> 0.03"))
    spec.write_text(yaml.safe_dump({"rule_files": [str(mutant)], "evaluation_interval": "1m",
                                    "tests": tests[2:3]}, sort_keys=False))
    r = subprocess.run([promtool, "test", "rules", str(spec)], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "VLLMTTFTBudgetBurnFast" in r.stdout + r.stderr, r.stdout + r.stderr
