"""The generated nginx front for real: Debian's nginx, not as root, runs serve/nginx.conf (written by
`modelyard serve-plan --proxy` for the demo artifact) in front of the session's vLLM server. A streamed
chat passes through chunk by chunk as vLLM produces it, a request without the key gets 401,
/metrics is not exposed, and the server smoke passes through it with the key."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from typer.testing import CliRunner

from modelyard.cli import app
from tests.conftest import json_error, json_result, run_cli
from tests.e2e.serving_tools import NGINX, nginx, tool_missing

pytestmark = [pytest.mark.vllm, pytest.mark.nginx, pytest.mark.e2e,
              pytest.mark.skipif(tool_missing(NGINX), reason="Debian nginx is not installed (make test installs it)")]

KEY = "test-key-0123456789abcdef"


@pytest.fixture(scope="module")
def proxy(vllm_server, tmp_path_factory):
    art, server = vllm_server
    out = tmp_path_factory.mktemp("proxy-serve")
    r = CliRunner().invoke(app, ["serve-plan", str(art), "--gpu", "H100-80GB", "--proxy", "-o", str(out), "--json"])
    assert r.exit_code == 0, r.output
    conf = (out / "serve" / "nginx.conf").read_text()
    with nginx(conf, upstream=server.base.removeprefix("http://"), keys=[KEY]) as base:
        yield base, server, conf


def _stream(base: str, name: str, key: str | None) -> tuple[list[float], str]:
    """A streamed greedy chat of 32 tokens: (arrival time of each content chunk in s after the request
    was sent, the reassembled text)."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    times, parts = [], []
    t0 = time.perf_counter()
    with httpx.stream("POST", f"{base}/v1/chat/completions", json=BODY | {"model": name, "stream": True},
                      headers=headers, timeout=300) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            delta = json.loads(line[6:])["choices"][0]["delta"].get("content")
            if delta:
                times.append(time.perf_counter() - t0)
                parts.append(delta)
    return times, "".join(parts)


BODY = {"messages": [{"role": "user", "content": "Tell me about the city of Paris."}], "max_tokens": 32,
        "temperature": 0}


def _bursts(times: list[float], gap: float = 0.005) -> int:
    """How many separate arrivals: chunks less than ``gap`` s after the previous one join its burst."""
    return 1 + sum(1 for a, b in zip(times, times[1:]) if b - a >= gap) if times else 0


def _as_produced(times: list[float]) -> bool:
    """Chunks spread over the generation as vLLM writes them: at least 10 separate arrivals, and the
    first one arrived before the first half of the time to the last (a buffering proxy delivers them
    in one burst at the end)."""
    return len(times) >= 10 and _bursts(times) >= 10 and times[-1] - times[0] >= 0.5 * times[-1]


def test_stream_passes_through_as_produced(proxy):
    base, server, conf = proxy
    plain = httpx.post(f"{server.base}/v1/chat/completions", json=BODY | {"model": server.name},
                       timeout=300).json()["choices"][0]["message"]["content"]
    # up to three streams: vLLM's API process starved of the CPU by the suite's other engines once sent all 32
    # chunks in one burst (CI, 2 cores); a buffering proxy bursts every time (the control below)
    tries = []
    for _ in range(3):
        times, text = _stream(base, server.name, KEY)
        assert text == plain  # the proxied stream is vLLM's answer, whole
        tries.append(times)
        if _as_produced(times):
            break
    assert _as_produced(tries[-1]), tries
    # Control: the same file with buffering and gzip turned on for the stream delivers it in one burst at
    # the end; the check above tells the two apart.
    buffered = conf.replace("proxy_buffering off;", "proxy_buffering on;").replace(
        "gzip off;", "gzip on; gzip_types text/event-stream; gzip_min_length 0;")
    with nginx(buffered, upstream=server.base.removeprefix("http://"), keys=[KEY]) as control:
        c_times, c_text = _stream(control, server.name, KEY)
    assert c_text == plain and not _as_produced(c_times) and _bursts(c_times) <= 2, c_times


def test_key_is_required(proxy):
    base, server, _ = proxy
    body = {"model": server.name, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
    for headers in ({}, {"Authorization": "Bearer wrong-key"}, {"Authorization": KEY}):
        r = httpx.post(f"{base}/v1/chat/completions", json=body, headers=headers, timeout=60)
        assert r.status_code == 401, (headers, r.text)
        assert r.json()["error"]["message"] == "missing or invalid API key"
        assert r.headers["www-authenticate"] == "Bearer"
    assert httpx.get(f"{base}/v1/models", timeout=30).status_code == 401
    ok = httpx.get(f"{base}/v1/models", headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
    assert ok.status_code == 200 and [m["id"] for m in ok.json()["data"]] == [server.name]
    assert httpx.get(f"{base}/health", timeout=30).status_code == 200  # liveness needs no key


def test_metrics_are_not_public(proxy):
    base, server, _ = proxy
    direct = httpx.get(f"{server.base}/metrics", timeout=30)
    assert direct.status_code == 200 and "vllm:num_requests_running" in direct.text  # vLLM has them...
    for headers in ({}, {"Authorization": f"Bearer {KEY}"}):  # ...the front does not give them, key or not
        for path in ("/metrics", "/metrics/", "/version", "/tokenize"):
            r = httpx.get(f"{base}{path}", headers=headers, timeout=30)
            assert r.status_code == 404 and "vllm:" not in r.text, (path, headers, r.status_code)


def test_server_smoke_through_the_front(proxy, vllm_server):
    """`modelyard smoke --url` against the front: with MODELYARD_API_KEY every server check passes
    through nginx; without it the API answers 401 and the smoke says which key to set. The key is
    never printed."""
    base, _, _ = proxy
    art, _ = vllm_server
    r = run_cli("smoke", str(art), "--smoke", "server", "--url", base, "--json", env={"MODELYARD_API_KEY": KEY},
                timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    s = json_result(r.stdout, "smoke")
    assert [(c["name"], c["passed"]) for c in s["checks"]] == [
        ("models", True), ("chat.text", True), ("chat.finish_reason", True), ("chat.usage", True),
        ("stream.reassembles", True), ("stream.finish_reason", True), ("stream.usage", True), ("numeric", True)]
    # the numerical gate needs only /v1/ (the prompt's ids come back with return_token_ids): the load
    # smoke's token counts through the front too
    assert [(t["name"], t["tokens"]) for t in s["numeric"]["texts"]] == [
        ("prose-en", 188), ("code-python", 122), ("code-open", 18), ("prose-fr", 104), ("prose-de", 96), ("prose-es", 66)]
    assert s["vllm_version"] is None  # /version is not public behind the front
    r = run_cli("smoke", str(art), "--smoke", "server", "--url", base, "--json", timeout=600)
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    s = json_error(r.stdout, "smoke", 1)
    assert s["type"] == "SmokeFailedError" and "401 Unauthorized" in s["message"]
    assert s["fix"] == "Set MODELYARD_API_KEY to a key the server's front accepts."
    for out in (r.stdout, r.stderr):
        assert KEY not in out
