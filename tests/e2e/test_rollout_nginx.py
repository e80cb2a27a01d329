"""`modelyard rollout` for real: two vLLM CPU servers (the session's, as the stable one, and a second on
the same demo artifact, as the canary) behind Debian's nginx running the canary form of serve/nginx.conf
that `serve-plan --canary` wrote. nginx's weighted round-robin is checked request by request through the
servers' own request counters; a rollout with loose targets reaches 100 %, one with an impossible TTFT
target is rolled back at its first step, and traffic is then the stable server's alone."""

from __future__ import annotations

import json
import re
import tempfile
import time
from pathlib import Path

import httpx
import pytest
import yaml

from modelyard.settings import Settings
from modelyard.stages.rollout import set_weights
from modelyard.stages.serve.canary import upstream_conf
from modelyard.stages.smoke.server import start_server
from tests.conftest import json_envelope, json_result, run_cli
from tests.e2e.serving_tools import NGINX, nginx_canary, tool_missing

pytestmark = [pytest.mark.vllm, pytest.mark.nginx, pytest.mark.e2e,
              pytest.mark.skipif(tool_missing(NGINX), reason="Debian nginx is not installed (make test installs it)")]

KEY = "rollout-key-0123456789abcdef"
LOOSE = "ttft_p95_ms=120000,itl_p95_ms=10000,error_rate=0"


def _served(base: str) -> int:
    """Requests the vLLM server at ``base`` finished (vllm:request_success_total, every finished_reason)."""
    text = httpx.get(f"{base}/metrics", timeout=30).text
    return int(sum(float(m) for m in re.findall(r'^vllm:request_success_total\{[^}]*\} (\S+)$', text, re.M)))


def _through_front(base: str, name: str, n: int) -> None:
    for _ in range(n):
        r = httpx.post(f"{base}/v1/completions", json={"model": name, "prompt": "Hello", "max_tokens": 1},
                       headers={"Authorization": f"Bearer {KEY}"}, timeout=120)
        assert r.status_code == 200, r.text


@pytest.fixture(scope="module")
def canary_setup(vllm_server):
    art, stable = vllm_server
    out = Path(tempfile.mkdtemp(prefix="modelyard-canary-"))  # nginx's user reads serve/canary/ here
    out.chmod(0o755)
    r = run_cli("serve-plan", str(art), "--gpu", "H100-80GB", "--canary", str(art), "-o", str(out), "--json")
    assert r.returncode == 0, r.stderr
    serve = out / "serve"
    config = yaml.safe_load((art / "serve" / "vllm.yaml").read_text())
    with start_server(art / "model", Settings(), config=config, max_model_len=4096) as canary:
        # the one host-specific rewrite: the compose names of the two servers become this test's addresses
        (serve / "canary" / "upstream.conf").write_text(upstream_conf(0, stable=stable.base.removeprefix("http://"),
                                                                      canary=canary.base.removeprefix("http://")))
        with nginx_canary((serve / "nginx.conf").read_text(), canary_dir=serve / "canary", keys=[KEY]) as (front, reload):
            yield art, serve, stable, canary, front, reload


def _rollout(art, serve, stable, canary, front, reload, *extra):
    return run_cli("rollout", str(art), "--serve", str(serve), "--front", front, "--canary-url", canary.base,
                   "--reload", reload, "--stable-server", stable.base.removeprefix("http://"),
                   "--canary-server", canary.base.removeprefix("http://"), "--json", *extra,
                   env={"MODELYARD_API_KEY": KEY}, timeout=1200)


def test_weights_split_requests_exactly(canary_setup):
    art, serve, stable, canary, front, reload = canary_setup
    name = stable.name
    hosts = {"stable": stable.base.removeprefix("http://"), "canary": canary.base.removeprefix("http://")}
    for percent, want in ((50, (5, 5)), (0, (10, 0)), (100, (0, 10))):
        set_weights(serve / "canary", percent, reload=reload, cwd=serve, stable=hosts["stable"], canary=hosts["canary"])
        time.sleep(2)  # `nginx -s reload` returns once signalled; the old worker stops accepting soon after
        before = _served(stable.base), _served(canary.base)
        _through_front(front, name, 10)
        after = _served(stable.base), _served(canary.base)
        assert (after[0] - before[0], after[1] - before[1]) == want, percent


def test_rollout_reaches_100_then_a_failing_canary_is_rolled_back(canary_setup):
    art, serve, stable, canary, front, reload = canary_setup
    r = _rollout(art, serve, stable, canary, front, reload, "--steps", "50,100", "--slo", LOOSE)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json_result(r.stdout, "rollout")
    assert (res["passed"], res["percent"], res["rolled_back"], res["reason"]) == (True, 100, False, None)
    assert [(s["percent"], s["passed"], s["failed"], s["front_status"]) for s in res["steps"]] == [
        (50, True, [], 200), (100, True, [], 200)]
    for s in res["steps"]:
        smoke = s["smoke"]
        assert (smoke["passed"], smoke["level"], smoke["url"], smoke["numeric"]["passed"]) == (True, "bench", canary.base, True)
        assert smoke["bench"]["completed"] == 8 and smoke["bench"]["slo"]["passed"] is True
    hosts = stable.base.removeprefix("http://"), canary.base.removeprefix("http://")
    assert (serve / "canary" / "upstream.conf").read_text() == upstream_conf(100, stable=hosts[0], canary=hosts[1])
    hist = json.loads((serve / "canary" / "rollout.json").read_text())
    assert (hist["status"], hist["percent"], [s["percent"] for s in hist["steps"]]) == ("done", 100, [50, 100])

    # an impossible TTFT target: the first step fails on it and every request goes to the stable server again
    r = _rollout(art, serve, stable, canary, front, reload, "--steps", "10,50", "--slo", "ttft_p95_ms=0.001")
    env = json_envelope(r.stdout, "rollout", 1)
    res = env["result"]
    assert (res["passed"], res["percent"], res["rolled_back"]) == (False, 0, True)
    assert res["reason"] == "step 10 % failed: slo:ttft_p95_ms"
    assert [(s["percent"], s["passed"], s["failed"]) for s in res["steps"]] == [(10, False, ["slo:ttft_p95_ms"])]
    assert env["error"]["type"] == "RolledBackError"
    assert (serve / "canary" / "upstream.conf").read_text() == upstream_conf(0, stable=hosts[0], canary=hosts[1])
    assert json.loads((serve / "canary" / "rollout.json").read_text())["status"] == "rolled back"
    before = _served(stable.base), _served(canary.base)
    _through_front(front, stable.name, 4)
    after = _served(stable.base), _served(canary.base)
    assert (after[0] - before[0], after[1] - before[1]) == (4, 0)
