"""The canary form of serve/ and the rollout's weights and refusals (no server: the real rollout with two
vLLM servers behind nginx is tests/e2e/test_rollout_nginx.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
import yaml
from typer.testing import CliRunner

from modelyard.cli import app
from modelyard.errors import InvalidTargetError
from modelyard.stages.serve import ServeTarget, plan_serve
from modelyard.stages.serve.canary import parse_steps, upstream_conf
from modelyard.stages.serve.files import vllm_config
from modelyard.stages.serve.k8s import manifests
from tests.conftest import json_error, json_result
from tests.k8s_schemas import check_kserve
from tests.unit.test_serve_plan import llama_dir


@pytest.mark.parametrize(("percent", "lines"), [
    (0, ["server vllm:8000 weight=1;"]),
    (10, ["server vllm:8000 weight=9;", "server vllm-canary:8000 weight=1;"]),
    (25, ["server vllm:8000 weight=3;", "server vllm-canary:8000 weight=1;"]),
    (50, ["server vllm:8000 weight=1;", "server vllm-canary:8000 weight=1;"]),
    (100, ["server vllm-canary:8000 weight=1;"]),
])
def test_upstream_weights(percent, lines):
    text = upstream_conf(percent)
    assert text.splitlines() == [f"# written by `modelyard rollout`: {percent} % of requests to the canary", *lines]


def test_steps_are_increasing_percentages():
    assert parse_steps("10,50,100") == (10, 50, 100)
    assert parse_steps("100") == (100,)
    for bad in ("50,10", "0,50", "10,10", "10,101", "ten", ""):
        with pytest.raises(InvalidTargetError):
            parse_steps(bad)


@pytest.fixture
def canary_form(tmp_path):
    stable = llama_dir(tmp_path, "8b")
    canary = llama_dir(tmp_path / "next", "8b")
    out = tmp_path / "plan"
    r = CliRunner().invoke(app, ["serve-plan", str(stable), "--gpu", "H100-80GB", "--canary", str(canary),
                                 "-o", str(out), "--json"])
    assert r.exit_code == 0, r.output
    return out / "serve", json_result(r.stdout, "serve-plan")


def test_serve_plan_canary_form(canary_form):
    serve, plan = canary_form
    assert sorted(p.name for p in serve.iterdir()) == [
        "README.md", "alerts.yml", "canary", "compose.yaml", "grafana-dashboard.json", "nginx.conf", "prometheus.yml",
        "vllm-canary.yaml", "vllm.yaml"]
    assert [p.name for p in (serve / "canary").iterdir()] == ["upstream.conf"]
    assert (serve / "canary" / "upstream.conf").read_text() == upstream_conf(0)
    conf = (serve / "nginx.conf").read_text()
    assert "    include /etc/nginx/canary/upstream.conf;  # weights: `modelyard rollout`\n" in conf
    assert "server vllm:8000;" not in conf
    canary_cfg = yaml.safe_load((serve / "vllm-canary.yaml").read_text())
    assert (canary_cfg["model"], canary_cfg["served-model-name"]) == ("model", plan["served_model_name"])
    compose = yaml.safe_load((serve / "compose.yaml").read_text())
    assert list(compose["services"]) == ["vllm", "vllm-canary", "nginx", "prometheus"]
    c = compose["services"]["vllm-canary"]
    assert c["volumes"] == ["${CANARY_MODEL_DIR:-../canary-model}:/artifact/model:ro",
                            "./vllm-canary.yaml:/artifact/serve/vllm-canary.yaml:ro"]
    assert c["ports"] == ["127.0.0.1:8001:8000"]
    assert c["command"][:3] == ["/artifact/model", "--config", "/artifact/serve/vllm-canary.yaml"]
    n = compose["services"]["nginx"]
    assert n["volumes"][-1] == "./canary:/etc/nginx/canary:ro"
    assert n["depends_on"] == {"vllm": {"condition": "service_healthy"}, "vllm-canary": {"condition": "service_healthy"}}
    assert "## Canary rollout" in (serve / "README.md").read_text()
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.skip("docker-compose is not installed (make test installs it)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DOCKER_", "MODEL_DIR", "CANARY_"))}
    (serve.parent / "api_keys.map").write_text("")
    (serve / "api_keys.map").write_text("")
    r = subprocess.run([exe, "-f", "compose.yaml", "config"], capture_output=True, text=True, env=env, timeout=120,
                       cwd=serve)
    assert r.returncode == 0, r.stderr
    svc = yaml.safe_load(r.stdout)["services"]
    assert f"{serve.parent / 'canary-model'}:/artifact/model:ro" in svc["vllm-canary"]["volumes"]
    assert f"{serve / 'canary'}:/etc/nginx/canary:ro" in svc["nginx"]["volumes"]


def test_canary_refusals(tmp_path, canary_form):
    d = llama_dir(tmp_path, "8b")
    r = CliRunner().invoke(app, ["serve-plan", str(d), "--gpu", "H100-80GB", "--canary", str(d), "--json"])
    assert json_error(r.stdout, "serve-plan", 2)["message"] == ("--canary writes the canary form of serve/, which "
                                                                "needs --output DIR")
    r = CliRunner().invoke(app, ["serve-plan", str(d), "--gpu", "H100-80GB", "--canary-percent", "10", "--json"])
    assert json_error(r.stdout, "serve-plan", 2)["message"] == ("--canary-percent splits the traffic of a KServe "
                                                                "InferenceService, which needs --storage-uri")
    # a serve/ that is not the canary form
    plain = tmp_path / "plain"
    assert CliRunner().invoke(app, ["serve-plan", str(d), "--gpu", "H100-80GB", "-o", str(plain)]).exit_code == 0
    r = CliRunner().invoke(app, ["rollout", str(d), "--serve", str(plain / "serve"), "--json"])
    assert json_error(r.stdout, "rollout", 2)["message"] == (f"{plain / 'serve'} is not the canary form of serve/ "
                                                             "(no vllm-canary.yaml and canary/)")
    r = CliRunner().invoke(app, ["rollout", str(d), "--serve", str(plain / "serve"), "--steps", "50,10", "--json"])
    assert json_error(r.stdout, "rollout", 2)["message"] == ("--steps '50,10': each step must be a percentage in "
                                                             "1..100, strictly increasing")


def test_a_failed_reload_is_exit_2_and_restores_zero(tmp_path, canary_form):
    """nginx that cannot be reloaded: exit 2 naming the command; upstream.conf says 0 % again and the
    history says the restore was not applied (no server is asked: the reload fails first)."""
    serve, _ = canary_form
    d = llama_dir(tmp_path, "8b")
    r = CliRunner().invoke(app, ["rollout", str(d), "--serve", str(serve), "--reload", "false", "--steps", "10",
                                 "--json"])
    err = json_error(r.stdout, "rollout", 2)
    assert (err["type"], err["message"]) == ("RolloutError", "rolling back: upstream.conf says 0 % canary but nginx "
                                             "was not reloaded: the reload command 'false' exited 1: ")
    assert (serve / "canary" / "upstream.conf").read_text() == upstream_conf(0)
    hist = json.loads((serve / "canary" / "rollout.json").read_text())
    assert (hist["status"], hist["percent"], hist["steps"], hist["reload"]) == ("rolling back", 0, [], "false")
    assert (hist["stable_server"], hist["canary_server"], hist["steps_planned"]) == ("vllm:8000", "vllm-canary:8000", [10])
    # an unfinished rollout on record: a new one refuses to start and changes nothing
    (serve / "canary" / "upstream.conf").write_text(upstream_conf(10))
    r = CliRunner().invoke(app, ["rollout", str(d), "--serve", str(serve), "--reload", "true", "--json"])
    err = json_error(r.stdout, "rollout", 2)
    assert (err["message"], err["fix"]) == (
        f"{serve / 'canary' / 'rollout.json'}: a rollout of {d} did not finish: it says 'rolling back' at "
        "0 %; nothing was changed", "Pass --resume to continue it from the last step that passed, or --rollback to "
                                    "send all traffic to the stable server.")
    assert (serve / "canary" / "upstream.conf").read_text() == upstream_conf(10)
    # --rollback from the file alone: a reload that cannot run is still exit 2, then one that can finishes it
    r = CliRunner().invoke(app, ["rollout", str(d), "--serve", str(serve), "--rollback", "--reload",
                                 "no-such-reload-cmd", "--json"])
    assert json_error(r.stdout, "rollout", 2)["message"].startswith(
        "rolling back: upstream.conf says 0 % canary but nginx was not reloaded: the reload command "
        "'no-such-reload-cmd' was not found")
    r = CliRunner().invoke(app, ["rollout", str(d), "--serve", str(serve), "--rollback", "--reload", "true", "--json"])
    res = json_result(r.stdout, "rollout")
    assert (res["passed"], res["percent"], res["rolled_back"], res["reason"]) == (
        False, 0, True, "rolled back by the operator from 'rolling back' at 0 %")
    assert (serve / "canary" / "upstream.conf").read_text() == upstream_conf(0)
    hist = json.loads((serve / "canary" / "rollout.json").read_text())
    assert (hist["status"], hist["percent"], hist["reason"]) == ("rolled back", 0, res["reason"])
    r = CliRunner().invoke(app, ["rollout", str(d), "--serve", str(serve), "--resume", "--reload", "true", "--json"])
    assert json_error(r.stdout, "rollout", 2)["message"] == (
        f"{serve / 'canary' / 'rollout.json'}: no unfinished rollout to resume (it says 'rolled back')")


def test_rollback_needs_a_rollout_on_record(tmp_path, canary_form):
    serve, _ = canary_form
    d = llama_dir(tmp_path, "8b")
    r = CliRunner().invoke(app, ["rollout", str(d), "--serve", str(serve), "--rollback", "--json"])
    err = json_error(r.stdout, "rollout", 2)
    assert (err["message"], err["fix"]) == (f"{serve / 'canary' / 'rollout.json'} does not exist: no rollout is on "
                                            "record there", "Pass --serve the canary form of serve/ the rollout ran in.")


def test_canary_form_retries_on_the_other_server_and_scrapes_both(canary_form):
    """nginx sends a request the canary fails (refused, reset, timed out, 5xx) once to the stable server, body
    kept for that; Prometheus scrapes the canary beside the stable server, told apart by ``role``."""
    serve, plan = canary_form
    conf = (serve / "nginx.conf").read_text()
    assert "proxy_request_buffering off;" not in conf
    assert ("        proxy_request_buffering on;          # the canary form: kept, so that a request can be retried\n"
            "        proxy_next_upstream error timeout http_500 http_502 http_503 http_504 non_idempotent;\n"
            "        proxy_next_upstream_tries 2;         # a request the canary fails goes to the stable server\n") in conf
    prom = yaml.safe_load((serve / "prometheus.yml").read_text())
    name = plan["served_model_name"]
    assert prom["scrape_configs"][0]["static_configs"] == [
        {"targets": ["vllm:8000"], "labels": {"served_model_name": name, "role": "stable"}},
        {"targets": ["vllm-canary:8000"], "labels": {"served_model_name": name, "role": "canary"}}]
    assert (serve / "prometheus.yml").read_text().startswith("# Prometheus scrape config for vLLM's /metrics")
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (make test installs it)")
    r = subprocess.run([promtool, "check", "config", "prometheus.yml"], cwd=serve, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_kserve_canary_traffic_percent(tmp_path):
    d = llama_dir(tmp_path, "8b")
    plan = plan_serve(d, ServeTarget("H100-80GB", gpus=2))
    docs = manifests(plan, vllm_config(plan), model_bytes=1, storage="s3://bucket/models/llama", canary_percent=10)
    isvc = docs["inferenceservice.yaml"]
    assert isvc["spec"]["predictor"]["canaryTrafficPercent"] == 10
    assert isvc["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == "Serverless"
    assert check_kserve(isvc) == []
    plain = manifests(plan, vllm_config(plan), model_bytes=1, storage="s3://bucket/models/llama")["inferenceservice.yaml"]
    assert "canaryTrafficPercent" not in plain["spec"]["predictor"]
    assert plain["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == "RawDeployment"
    with pytest.raises(InvalidTargetError):
        manifests(plan, vllm_config(plan), model_bytes=1, storage="s3://bucket/models/llama", canary_percent=100)
