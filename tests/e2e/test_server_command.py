"""``modelyard server start|status|stop`` runs a real ``prefect server start`` on 127.0.0.1, and an ingest of
the same store finds it by itself (no PREFECT_API_URL): its flow run is recorded by that server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import json_envelope, json_result, run_cli
from tests.killing import outlived

pytestmark = [pytest.mark.e2e, pytest.mark.prefect_server]


def _env(tmp_path) -> dict[str, str]:
    """No Prefect API configured and no facts worker named (the suite's session server hands out both): the
    ingest must find the kept server, and its worker, itself."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API") and k != "MODELYARD_FACTS_WORKER"}
    env.update(PREFECT_HOME=str(tmp_path / "client-home"), MODELYARD_HOME=str(tmp_path / "elsewhere"))
    return env


#: ``python -c`` program: run the CLI with ARGV[2:], writing ARGV[1] when torch or transformers is imported
#: (an audit hook: the CLI drops library output on stderr, so ``-X importtime`` cannot tell)
_RECORD_IMPORTS = """\
import sys
out = sys.argv[1]
def hook(event, args):
    if event == "import" and args[0] in ("torch", "transformers"):
        with open(out, "a") as fh:
            fh.write(args[0] + "\\n")
sys.addaudithook(hook)
sys.argv = ["modelyard", *sys.argv[2:]]
from modelyard.cli import main
main()
"""


def _flow_runs(api_url: str) -> list[dict]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    req = urllib.request.Request(f"{api_url}/flow_runs/filter", data=b"{}", method="POST",
                                 headers={"Content-Type": "application/json"})
    with opener.open(req, timeout=30) as r:
        return json.loads(r.read())


def test_server_start_status_stop_and_an_ingest_that_finds_it(tmp_path, tiny_llama_dir, monkeypatch):
    store = tmp_path / "store"
    for k in [k for k in os.environ if k.startswith("PREFECT_API")]:
        monkeypatch.delenv(k)
    env = _env(tmp_path)

    r = run_cli("server", "status", "--store", str(store), "--json", env=env)
    assert json_envelope(r.stdout, "server status", 1)["result"] == {"running": False}

    r = run_cli("server", "start", "--store", str(store), "--json", env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    st = json_result(r.stdout, "server start")
    try:
        assert st["started"] is True and st["api_url"] == f"http://127.0.0.1:{st['port']}/api"
        assert st["prefect_home"] == str(store / ".prefect-server" / "home")
        assert json.loads((store / ".prefect-server" / "server.json").read_text())["pid"] == st["pid"]

        again = json_result(run_cli("server", "start", "--store", str(store), "--json", env=env).stdout, "server start")
        assert (again["started"], again["pid"]) == (False, st["pid"])
        status = run_cli("server", "status", "--store", str(store), "--json", env=env)
        assert json_result(status.stdout, "server status")["running"] is True

        # the warm facts worker beside it: a verify of the store imports neither torch nor transformers
        assert Path(st["facts_socket"]).exists()
        os.kill(st["facts_pid"], 0)
        seen = tmp_path / "imported-verify.txt"
        v = subprocess.run([sys.executable, "-c", _RECORD_IMPORTS, str(seen), "verify", str(tiny_llama_dir), "--json"],
                           capture_output=True, text=True, timeout=300,
                           env={**env, "MODELYARD_HOME": str(store), "MODELYARD_FACTS_CACHE": str(tmp_path / "facts")})
        assert v.returncode == 0, v.stdout[-2000:] + v.stderr[-2000:]
        assert json.loads(v.stdout)["result"]["summary"]["passed"] is True
        assert not seen.exists(), seen.read_text()

        assert _flow_runs(st["api_url"]) == []
        # the ingest asks the same worker: it imports neither torch nor transformers either (its flow once
        # started the warm-up thread's imports beside the worker)
        seen = tmp_path / "imported.txt"
        ing = subprocess.run([sys.executable, "-c", _RECORD_IMPORTS, str(seen), "ingest", f"file://{tiny_llama_dir}",
                              "--no-smoke", "--store", str(store), "--json"], capture_output=True, text=True, timeout=600,
                             env={**env, "MODELYARD_FACTS_CACHE": str(tmp_path / "facts-ingest")})
        assert ing.returncode == 0, ing.stdout + ing.stderr
        assert json_result(ing.stdout, "ingest")["verification"]["passed"] is True
        assert not seen.exists(), seen.read_text()
        runs = _flow_runs(st["api_url"])
        assert [(r["flow_id"] is not None, r["state_type"]) for r in runs] == [(True, "COMPLETED")]
    finally:
        r = run_cli("server", "stop", "--store", str(store), "--json", env=env, timeout=120)
    assert json_result(r.stdout, "server stop")["stopped"] is True
    with pytest.raises(ProcessLookupError):
        os.kill(st["pid"], 0)
    with pytest.raises(ProcessLookupError):
        os.kill(st["facts_pid"], 0)
    assert not Path(st["facts_socket"]).exists()
    assert not (store / ".prefect-server" / "server.json").exists()
    r = run_cli("server", "status", "--store", str(store), env=env)
    assert r.returncode == 1 and "no prefect server running" in r.stdout
    r = run_cli("server", "stop", "--store", str(store), "--json", env=env)
    assert json_result(r.stdout, "server stop") == {"stopped": False}


def test_the_private_api_server_dies_with_a_killed_command(tmp_path):
    """Without a server, an ingest boots Prefect's ephemeral API itself; SIGKILL the command and the API
    server goes too (Linux parent-death signal), instead of running on, orphaned, on its database."""
    import signal
    import subprocess
    import sys

    code = ("import os, signal, sys\n"
            "from modelyard.runtime.prefect_server import PrivateAPI\n"
            "api = PrivateAPI(300)\n"
            "api.wait()\n"
            "print(api._proc.pid, flush=True)\n"
            "os.kill(os.getpid(), signal.SIGKILL)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=320,
                       env={**_env(tmp_path), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"})
    assert p.returncode == -signal.SIGKILL, p.stderr
    child = int(p.stdout.split()[0])
    assert not outlived(child), f"the API server {child} outlived its parent"


def test_a_dead_worker_is_started_again_and_a_stale_pid_is_never_signalled(tmp_path):
    """``server start`` starts the facts worker again when it died, stops the worker a dead server left, and
    ``server stop`` signals only processes that are the server or the worker (a pid from a stale server.json
    may belong to another program)."""
    import signal
    import time

    store = tmp_path / "store"
    env = _env(tmp_path)
    st = json_result(run_cli("server", "start", "--store", str(store), "--json", env=env, timeout=300).stdout,
                     "server start")
    try:
        assert st["facts_running"] is True
        os.kill(st["facts_pid"], signal.SIGKILL)
        assert not outlived(st["facts_pid"])
        status = json_result(run_cli("server", "status", "--store", str(store), "--json", env=env).stdout, "server status")
        assert (status["running"], status["facts_running"]) == (True, False)
        again = json_result(run_cli("server", "start", "--store", str(store), "--json", env=env).stdout, "server start")
        assert (again["started"], again["pid"], again["facts_running"]) == (False, st["pid"], True)
        assert again["facts_pid"] != st["facts_pid"]

        os.kill(st["pid"], signal.SIGKILL)  # the server dies; its worker lives on until the next start
        assert not outlived(st["pid"])
        third = json_result(run_cli("server", "start", "--store", str(store), "--json", env=env, timeout=300).stdout,
                            "server start")
        assert third["started"] is True and third["facts_pid"] != again["facts_pid"]
        assert not outlived(again["facts_pid"]) and not Path(again["facts_socket"]).exists()
    finally:
        run_cli("server", "stop", "--store", str(store), env=env, timeout=120)

    stranger = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        state = store / ".prefect-server" / "server.json"
        state.write_text(json.dumps({"pid": stranger.pid, "port": 9, "api_url": "http://127.0.0.1:9/api",
                                     "prefect_home": str(tmp_path), "log": str(tmp_path / "log"), "since": time.time(),
                                     "facts_pid": stranger.pid, "facts_socket": None}))
        r = run_cli("server", "stop", "--store", str(store), "--json", env=env)
        assert json_result(r.stdout, "server stop") == {"stopped": False}
        assert stranger.poll() is None  # not signalled
        assert not state.exists()
    finally:
        stranger.kill()
        stranger.wait()
