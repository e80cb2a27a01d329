"""`modelyard rollout` for real: two vLLM CPU servers (the session's, as the stable one, and a second on
the same demo artifact, as the canary) behind Debian's nginx running the canary form of serve/nginx.conf
that `serve-plan --canary` wrote. nginx's weighted round-robin is checked request by request through the
servers' own request counters; a rollout with loose targets reaches 100 %, one with an impossible TTFT
target is rolled back at its first step, and traffic is then the stable server's alone.

The canary is reached (by nginx and by the rollout) through a fault injector
(:mod:`tests.e2e.fault_relay`): a canary that dies mid-step, one that answers 500, one that answers
garbage, one that dies while its step bakes, and rollouts stopped by SIGTERM and SIGKILL are each rolled
back, with the state file right, while a client sends requests through the front the whole time and gets
no error."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import yaml

from modelyard.settings import Settings
from modelyard.stages.rollout import set_weights
from modelyard.stages.serve.canary import upstream_conf
from modelyard.stages.smoke.server import start_server
from tests.conftest import json_envelope, json_result, run_cli
from tests.e2e.fault_relay import FaultRelay
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
    with start_server(art / "model", Settings(), config=config, max_model_len=4096) as canary, \
            FaultRelay(canary.base) as relay:
        # the one host-specific rewrite: the compose names of the two servers become this test's addresses
        (serve / "canary" / "upstream.conf").write_text(upstream_conf(0, stable=stable.base.removeprefix("http://"),
                                                                      canary=relay.base.removeprefix("http://")))
        with nginx_canary((serve / "nginx.conf").read_text(), canary_dir=serve / "canary", keys=[KEY]) as (front, reload):
            yield art, serve, stable, canary, front, reload, relay


@pytest.fixture
def setup(canary_setup):
    """The module's servers with the relay passing requests again and no rollout left unfinished."""
    *_, relay = canary_setup
    relay.mode = "pass"
    if relay._server is None:
        relay.start()
    yield canary_setup
    relay.mode = "pass"


def _args(art, serve, stable, relay, front, reload, *extra):
    return ["rollout", str(art), "--serve", str(serve), "--front", front, "--canary-url", relay.base,
            "--reload", reload, "--stable-server", stable.base.removeprefix("http://"),
            "--canary-server", relay.base.removeprefix("http://"), "--json", *extra]


def _rollout(art, serve, stable, relay, front, reload, *extra):
    return run_cli(*_args(art, serve, stable, relay, front, reload, *extra), env={"MODELYARD_API_KEY": KEY},
                   timeout=1200)


@contextmanager
def _clients(front: str, name: str):
    """A client sending one short completion at a time through the front until the block ends; yields the list
    of what went wrong (non-200 statuses, connection errors) and counts the requests in ``[0]`` of a list."""
    errors: list[str] = []
    sent = [0]
    stop = threading.Event()

    def loop() -> None:
        with httpx.Client(timeout=120, headers={"Authorization": f"Bearer {KEY}"}) as c:
            while not stop.is_set():
                try:
                    r = c.post(f"{front}/v1/completions", json={"model": name, "prompt": "Hello", "max_tokens": 2})
                    if r.status_code != 200:
                        errors.append(f"{r.status_code}: {r.text[:200]}")
                except httpx.HTTPError as exc:
                    errors.append(repr(exc))
                sent[0] += 1
                time.sleep(1.0)

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        yield errors, sent
    finally:
        stop.set()
        t.join(timeout=150)


def _history(serve: Path) -> dict:
    return json.loads((serve / "canary" / "rollout.json").read_text())


def _wait_status(serve: Path, status: str, proc: subprocess.Popen | None = None, timeout: float = 600) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            hist = _history(serve)
        except (FileNotFoundError, ValueError):
            hist = {}
        if hist.get("status") == status:
            return hist
        assert proc is None or proc.poll() is None, f"the rollout exited {proc.returncode} before {status!r}"
        time.sleep(0.1)
    raise AssertionError(f"rollout.json never said {status!r}")


def test_weights_split_requests_exactly(setup):
    art, serve, stable, canary, front, reload, relay = setup
    name = stable.name
    hosts = {"stable": stable.base.removeprefix("http://"), "canary": relay.base.removeprefix("http://")}
    for percent, want in ((50, (5, 5)), (0, (10, 0)), (100, (0, 10))):
        set_weights(serve / "canary", percent, reload=reload, cwd=serve, stable=hosts["stable"], canary=hosts["canary"])
        time.sleep(2)  # `nginx -s reload` returns once signalled; the old worker stops accepting soon after
        before = _served(stable.base), _served(canary.base)
        _through_front(front, name, 10)
        after = _served(stable.base), _served(canary.base)
        assert (after[0] - before[0], after[1] - before[1]) == want, percent


def test_rollout_reaches_100_then_a_failing_canary_is_rolled_back(setup):
    art, serve, stable, canary, front, reload, relay = setup
    with _clients(front, stable.name) as (client_errors, sent):
        r = _rollout(art, serve, stable, relay, front, reload, "--steps", "50,100", "--slo", LOOSE, "--bake", "6")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert (client_errors, sent[0] > 0) == ([], True)
    res = json_result(r.stdout, "rollout")
    assert (res["passed"], res["percent"], res["rolled_back"], res["reason"]) == (True, 100, False, None)
    assert [(s["percent"], s["passed"], s["failed"], s["front_status"]) for s in res["steps"]] == [
        (50, True, [], 200), (100, True, [], 200)]
    for s in res["steps"]:
        smoke = s["smoke"]
        assert (smoke["passed"], smoke["level"], smoke["url"], smoke["numeric"]["passed"]) == (True, "bench", relay.base, True)
        assert smoke["bench"]["completed"] == 8 and smoke["bench"]["slo"]["passed"] is True
        # the bake watched the canary under the client's traffic: its own counter saw requests and no 5xx
        bake = s["bake"]
        assert (bake["unhealthy"], bake["errors"], bake["failed"], bake["polls"] >= 2, bake["seconds"] >= 6) == (
            0, 0, [], True, True)
    bake = res["steps"][1]["bake"]  # at 100 % every client request went to the canary
    assert bake["requests"] > 0
    # the quantiles of that real traffic, from the canary's own histograms: reported ones and those of --slo
    assert sorted(bake["latency"]) == ["e2el_p50_ms", "e2el_p95_ms", "itl_p95_ms", "ttft_p50_ms", "ttft_p95_ms"]
    assert 0 < bake["latency"]["ttft_p50_ms"] <= bake["latency"]["ttft_p95_ms"] <= 120000, bake["latency"]
    assert 0 < bake["latency"]["e2el_p50_ms"] <= bake["latency"]["e2el_p95_ms"], bake["latency"]
    hosts = stable.base.removeprefix("http://"), relay.base.removeprefix("http://")
    assert (serve / "canary" / "upstream.conf").read_text() == upstream_conf(100, stable=hosts[0], canary=hosts[1])
    hist = _history(serve)
    assert (hist["status"], hist["percent"], [s["percent"] for s in hist["steps"]]) == ("done", 100, [50, 100])

    # an impossible TTFT target: the first step fails on it and every request goes to the stable server again
    r = _rollout(art, serve, stable, relay, front, reload, "--steps", "10,50", "--slo", "ttft_p95_ms=0.001")
    env = json_envelope(r.stdout, "rollout", 1)
    res = env["result"]
    assert (res["passed"], res["percent"], res["rolled_back"]) == (False, 0, True)
    assert res["reason"] == "step 10 % failed: slo:ttft_p95_ms"
    assert [(s["percent"], s["passed"], s["failed"], s["bake"]) for s in res["steps"]] == [
        (10, False, ["slo:ttft_p95_ms"], None)]
    assert env["error"]["type"] == "RolledBackError"
    assert (serve / "canary" / "upstream.conf").read_text() == upstream_conf(0, stable=hosts[0], canary=hosts[1])
    assert _history(serve)["status"] == "rolled back"
    before = _served(stable.base), _served(canary.base)
    _through_front(front, stable.name, 4)
    after = _served(stable.base), _served(canary.base)
    assert (after[0] - before[0], after[1] - before[1]) == (4, 0)


def _rolled_back(serve: Path, stable, relay, r_stdout: str) -> dict:
    """The result of a rollout that must have been rolled back: exit 1 with RolledBackError, the weights at 0 %,
    rollout.json saying so with the same reason."""
    env = json_envelope(r_stdout, "rollout", 1)
    res = env["result"]
    assert (res["passed"], res["percent"], res["rolled_back"], env["error"]["type"]) == (False, 0, True, "RolledBackError")
    hosts = stable.base.removeprefix("http://"), relay.base.removeprefix("http://")
    assert (serve / "canary" / "upstream.conf").read_text() == upstream_conf(0, stable=hosts[0], canary=hosts[1])
    hist = _history(serve)
    assert (hist["status"], hist["percent"], hist["reason"]) == ("rolled back", 0, res["reason"])
    return res


@pytest.mark.parametrize("fault", ["dies mid-step", "answers 500", "answers garbage"])
def test_a_failing_canary_is_rolled_back_with_no_client_error(setup, fault):
    """A canary that raises out of its step (connection refused mid-smoke, HTTP 500) used to leave the weights at
    the step's and rollout.json at "started"; each fault now rolls back, and nginx sends every client request the
    canary fails to the stable server."""
    art, serve, stable, canary, front, reload, relay = setup
    if fault == "dies mid-step":
        relay.die(after=2)
    else:
        relay.mode = "500" if fault == "answers 500" else "garbage"
    with _clients(front, stable.name) as (client_errors, sent):
        r = _rollout(art, serve, stable, relay, front, reload, "--steps", "50,100", "--slo", LOOSE, "--bake", "2")
    assert (client_errors, sent[0] > 0) == ([], True)
    res = _rolled_back(serve, stable, relay, r.stdout)
    (step,) = res["steps"]
    assert (step["percent"], step["passed"], step["bake"]) == (50, False, None)
    if fault == "dies mid-step":
        assert res["reason"].startswith("step 50 % failed: the canary's smoke raised SmokeFailedError: the vLLM server "
                                        "failed a request: "), res["reason"]
        assert step["smoke"] is None
    elif fault == "answers 500":
        assert res["reason"].startswith("step 50 % failed: the canary's smoke raised SmokeFailedError: the vLLM server "
                                        "failed a request: Server error '500 Internal Server Error'"), res["reason"]
        assert relay.errors > 0  # the canary did answer 500s, the client saw none of them
    else:
        assert step["smoke"]["passed"] is False and "golden:capital-of-france" in step["failed"], step["failed"]


def test_a_canary_that_dies_while_baking_and_rollouts_stopped_by_signals(setup):
    """SIGTERM in a step rolls back before the process ends; SIGKILL leaves rollout.json unfinished (the weights
    at the step's), a new rollout refuses to start over it, and --resume continues it: here into a bake in which
    the canary dies, which the bake's /health watch catches."""
    art, serve, stable, canary, front, reload, relay = setup
    env = {**os.environ, "MODELYARD_API_KEY": KEY}
    cmd = [sys.executable, "-m", "modelyard", *_args(art, serve, stable, relay, front, reload, "--steps", "10,50",
                                                     "--slo", LOOSE, "--bake", "60")]
    with _clients(front, stable.name) as (client_errors, _sent):
        # SIGTERM while the step is judged: rolled back first, exit 1
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        _wait_status(serve, "stepping", proc)
        time.sleep(4)  # past the reload and its settling: the front check or the smoke runs
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 1, stderr[-2000:]
        res = _rolled_back(serve, stable, relay, stdout)
        assert res["reason"].startswith("step 10 % interrupted by SIGTERM (in the "), res["reason"]
        assert [(s["percent"], s["failed"]) for s in res["steps"]] == [(10, ["interrupted by SIGTERM"])]

        # SIGKILL while the step is judged: nothing can roll back, the state file says where it was
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        _wait_status(serve, "stepping", proc)
        time.sleep(4)
        proc.kill()
        proc.communicate(timeout=60)
        hist = _history(serve)
        assert (hist["status"], hist["percent"], hist["steps"]) == ("stepping", 10, [])
        hosts = stable.base.removeprefix("http://"), relay.base.removeprefix("http://")
        assert (serve / "canary" / "upstream.conf").read_text() == upstream_conf(10, stable=hosts[0], canary=hosts[1])
        r = _rollout(art, serve, stable, relay, front, reload, "--steps", "10,50")
        assert json_envelope(r.stdout, "rollout", 2)["error"]["message"].endswith(
            "did not finish: it says 'stepping' at 10 %; nothing was changed")

        # --resume: step 10 again (it had not passed); the canary dies while it bakes
        # it dies a second into the bake: after the bake's first look, before its next one
        killer = threading.Thread(target=lambda: (_wait_status(serve, "baking"), time.sleep(1), relay.die()),
                                  daemon=True)
        killer.start()
        r = _rollout(art, serve, stable, relay, front, reload, "--steps", "10,50", "--slo", LOOSE, "--bake", "60",
                     "--resume")
        killer.join(timeout=5)
    assert client_errors == []
    res = _rolled_back(serve, stable, relay, r.stdout)
    assert res["reason"] == "step 10 % failed: bake: the canary's /health did not answer 200", res["reason"]
    (step,) = res["steps"]
    assert (step["bake"]["unhealthy"], step["bake"]["seconds"] < 60) == (1, True)
