"""Orchestration against real servers on 127.0.0.1: a real Prefect server (SQLite, or the
installed PostgreSQL 15) and olah serving a git+LFS repo that gains commits during the test.

watch: commit 1 is ingested; commit 2 (README only) is skipped and recorded; commit 3 (a weight file)
is ingested. promote: a run pauses, is approved headlessly and the manifest records it; an unapproved
run times out into a failed state with nothing promoted. Smoke is off (random weights cannot chat).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, json_error, json_result, run_cli, store_artifacts
from tests.e2e.olah_hub import OlahServer, _git, make_lfs_repo, repo_path
from tests.e2e.prefect_server import Postgres15, PrefectServer, postgres_available, prefect_server  # noqa: F401
from tests.fixtures import make_tiny_llama

pytestmark = [pytest.mark.hub, pytest.mark.e2e, pytest.mark.prefect_server]


def _model_files(tmp: Path, seed: int) -> dict[str, bytes]:
    d = make_tiny_llama(tmp / f"tiny-{seed}", seed=seed)
    return {p.name: p.read_bytes() for p in d.iterdir()}


def _commit(repo: Path, files: dict[str, bytes], i: int) -> str:
    for rel, data in files.items():
        (repo / rel).write_bytes(data)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "--no-verify", "-m", f"commit {i}", date_epoch=1_700_000_000 + 60 * i)
    return _git(repo, "rev-parse", "HEAD").strip()


def _watch_scenario(tmp_path: Path, prefect_env: dict[str, str]) -> None:
    mirrors = tmp_path / "mirrors"
    first = _model_files(tmp_path, seed=0)
    shas = make_lfs_repo(mirrors, "org", "watched", [{**first, "README.md": b"# watched\n"}])
    repo = repo_path(mirrors, "org", "watched")
    home = tmp_path / "store"
    config = tmp_path / "watch.yaml"
    config.write_text("repos:\n  - repo: org/watched\n    branch: main\n    name: watched\n    no_smoke: true\n")
    with OlahServer(mirrors) as hub:
        env = {**prefect_env, "HF_ENDPOINT": hub.endpoint, "MODELYARD_HOME": str(home)}

        def watch_once() -> dict:
            r = run_cli("watch", "--config", str(config), "--once", "--json", env=env)
            assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
            (d,) = json_result(r.stdout, "watch")["decisions"]
            return d

        d1 = watch_once()
        assert d1["action"] == "ingested" and d1["commit"] == shas[0], d1
        assert store_artifacts(home) == [home / "watched" / shas[0]]

        sha2 = _commit(repo, {"README.md": b"# watched\n\nNow with a model card.\n"}, 2)
        d2 = watch_once()
        assert (d2["action"], d2["commit"], d2["changed"], d2["previous"]) == ("skipped", sha2, ["README.md"], shas[0]), d2
        assert store_artifacts(home) == [home / "watched" / shas[0]]
        state = json.loads((home / ".watch" / "org--watched.json").read_text())
        assert state["last_ingested"]["commit"] == shas[0]
        assert state["history"][-1]["action"] == "skipped" and state["history"][-1]["commit"] == sha2
        assert state["history"][-1]["changed"] == ["README.md"]

        assert watch_once()["action"] == "unchanged"  # nothing new: no run of ingest

        second = _model_files(tmp_path, seed=1)
        sha3 = _commit(repo, {"model.safetensors": second["model.safetensors"]}, 3)
        d3 = watch_once()
        assert d3["action"] == "ingested" and d3["commit"] == sha3 and d3["previous"] == shas[0], d3
        assert "model.safetensors" in d3["changed"] and "README.md" in d3["changed"]
        assert store_artifacts(home) == sorted([home / "watched" / shas[0], home / "watched" / sha3])
        state = json.loads((home / ".watch" / "org--watched.json").read_text())
        assert state["last_ingested"]["commit"] == sha3
        assert [h["action"] for h in state["history"]] == ["ingested", "skipped", "ingested"]
    return None


def _flow_runs(env: dict[str, str], name: str) -> list:
    """Flow runs of flow ``name`` on the server (read in a subprocess: this process has no API URL)."""
    code = ("import asyncio, json\nfrom prefect.client.orchestration import get_client\n"
            "from prefect.client.schemas.filters import FlowFilter, FlowFilterName\n"
            "async def main():\n  async with get_client() as c:\n"
            f"    rs = await c.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=[{name!r}])))\n"
            "    print(json.dumps([{'id': str(r.id), 'name': r.name, 'state': r.state.type.value, "
            "'message': r.state.message} for r in rs]))\nasyncio.run(main())\n")
    import os

    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **env}, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_watch_ingests_model_changes_and_skips_readme(prefect_server, tmp_path):  # noqa: F811
    _watch_scenario(tmp_path, prefect_server.env)
    runs = _flow_runs(prefect_server.env, "ingest")
    assert any(r["name"].startswith("org/watched@") and r["state"] == "COMPLETED" for r in runs), runs


def test_a_missing_repository_fails_alone_and_the_round_goes_on(prefect_server, tmp_path):  # noqa: F811
    """One repository the hub does not have is a failed decision of its own (exit 1, named in the error); the
    other repository of the same round is still ingested (it used to abort the whole round)."""
    mirrors = tmp_path / "mirrors"
    shas = make_lfs_repo(mirrors, "org", "watched", [_model_files(tmp_path, seed=0)])
    home = tmp_path / "store"
    config = tmp_path / "watch.yaml"
    config.write_text("repos:\n  - repo: org/gone\n    no_smoke: true\n"
                      "  - repo: org/watched\n    name: watched\n    no_smoke: true\n")
    with OlahServer(mirrors) as hub:
        env = {**prefect_server.env, "HF_ENDPOINT": hub.endpoint, "MODELYARD_HOME": str(home)}
        r = run_cli("watch", "--config", str(config), "--once", "--json", env=env)
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    gone, watched = json.loads(r.stdout)["result"]["decisions"]
    assert (gone["repo"], gone["action"], gone["commit"]) == ("org/gone", "failed", None)
    assert gone["reason"] == f"hub: repository org/gone at revision 'main' was not found on {hub.endpoint}"
    assert (watched["action"], watched["commit"]) == ("ingested", shas[0])
    assert store_artifacts(home) == [home / "watched" / shas[0]]
    assert json_error(r.stdout, "watch", 1)["message"] == f"org/gone@main: {gone['reason']}"
    state = json.loads((home / ".watch" / "org--gone.json").read_text())
    assert [h["action"] for h in state["history"]] == ["failed"] and "last_seen" not in state


@pytest.fixture
def staged_artifact(tmp_path, tiny_llama_dir):
    home = tmp_path / "staging"
    r = run_cli("ingest", f"file://{tiny_llama_dir}", "--no-smoke", "--json", "--out", str(home))
    assert r.returncode == 0, r.stderr
    out = json_result(r.stdout, "ingest")
    return home, f"{out['name']}@{out['revision']}", Path(out["artifact"])


def _start_promote(env, *args: str) -> subprocess.Popen:
    import os

    # the staged artifact was ingested with --no-smoke (random weights cannot chat): promote it without that evidence
    return subprocess.Popen([sys.executable, "-m", "modelyard", "promote", *args, "--no-smoke-required", "--json"],
                            cwd=ROOT, text=True,
                            env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_promote_pauses_and_is_approved_headlessly(prefect_server, staged_artifact, tmp_path):  # noqa: F811
    home, ref, art = staged_artifact
    prod = tmp_path / "prod"
    p = _start_promote(prefect_server.env, ref, "--from", str(home), "--to", str(prod), "--timeout", "300")
    try:
        run_id = None
        deadline = time.monotonic() + 180
        lines = []
        while run_id is None and time.monotonic() < deadline:
            line = p.stderr.readline()
            if not line:
                break
            lines.append(line)
            if "waits for approval" in line:
                run_id = line.rsplit("flow run ", 1)[1].strip()
        assert run_id, "".join(lines)
        assert not prod.exists() or store_artifacts(prod) == []  # nothing before the approval
        a = run_cli("approve", run_id, "--by", "alice", "--note", "looks good", env=prefect_server.env)
        assert a.returncode == 0, a.stdout + a.stderr
        out, rest = p.communicate(timeout=180)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, out + rest
    res = json_result(out, "promote")
    name, rev = ref.split("@")
    dst = prod / name / rev
    assert res["placed"] == [str(dst)]
    m = json.loads((dst / "manifest.json").read_text())
    src = json.loads((art / "manifest.json").read_text())
    promo = m["promotion"]
    assert promo["approved_by"] == "alice" and promo["note"] == "looks good" and promo["flow_run_id"] == run_id
    assert promo["approved_at"].endswith("+00:00")
    assert promo["evidence"]["report_sha256"] == src["verification"]["report_sha256"]
    assert promo["evidence"]["smoke"] is None  # ingested with --no-smoke
    assert promo["from"] == str(home) and promo["to"] == [str(prod)]
    assert "promotion" not in src  # the staging artifact is untouched
    assert (dst / "model" / "model.safetensors").read_bytes() == (art / "model" / "model.safetensors").read_bytes()
    v = run_cli("verify", str(dst))
    assert v.returncode == 0, v.stdout + v.stderr


def test_rejected_promotion_fails_and_promotes_nothing(prefect_server, staged_artifact, tmp_path):  # noqa: F811
    home, ref, _ = staged_artifact
    prod = tmp_path / "prod"
    p = _start_promote(prefect_server.env, ref, "--from", str(home), "--to", str(prod), "--timeout", "300")
    try:
        line = ""
        while "waits for approval" not in line:
            line = p.stderr.readline()
            assert line, "promote exited before pausing"
        run_id = line.rsplit("flow run ", 1)[1].strip()
        a = run_cli("approve", run_id, "--by", "bob", "--reject", "--note", "smoke too slow", env=prefect_server.env)
        assert a.returncode == 0, a.stdout + a.stderr
        out, _ = p.communicate(timeout=180)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 1, out
    assert "rejected by bob: smoke too slow" in json_error(out, "promote", 1)["message"]
    assert not prod.exists() or store_artifacts(prod) == []
    again = run_cli("approve", run_id, "--by", "alice", env=prefect_server.env)
    assert again.returncode == 1 and "is not waiting for approval" in again.stderr, again.stderr
    bad = run_cli("approve", "not-a-run-id", "--by", "alice", env=prefect_server.env)
    assert bad.returncode == 2 and "is not a flow run id" in bad.stderr


def test_unapproved_promotion_times_out_and_promotes_nothing(prefect_server, staged_artifact, tmp_path):  # noqa: F811
    home, ref, _ = staged_artifact
    prod = tmp_path / "prod"
    p = _start_promote(prefect_server.env, ref, "--from", str(home), "--to", str(prod), "--timeout", "5")
    out, errs = p.communicate(timeout=300)
    assert p.returncode == 1, out + errs
    assert "nobody approved the promotion" in json_error(out, "promote", 1)["message"]
    assert "Traceback" not in errs
    assert not prod.exists() or store_artifacts(prod) == []
    run_id = errs.split("flow run ", 1)[1].split()[0]
    runs = {r["id"]: r for r in _flow_runs(prefect_server.env, "promote")}
    assert runs[run_id]["state"] == "FAILED", runs[run_id]


@pytest.mark.skipif(not postgres_available(), reason="PostgreSQL 15 is not installed")
def test_watch_on_prefect_server_backed_by_postgres(tmp_path_factory, tmp_path):
    with Postgres15() as pg, \
            PrefectServer(tmp_path_factory.mktemp("prefect-pg"), database_url=pg.url) as server:
        _watch_scenario(tmp_path, server.env)
        runs = _flow_runs(server.env, "watch")
        assert len(runs) == 4 and all(r["state"] == "COMPLETED" for r in runs), runs


def test_deploy_watch_on_cron_runs_on_a_process_worker(prefect_server, tmp_path):  # noqa: F811
    import os

    mirrors = tmp_path / "mirrors"
    shas = make_lfs_repo(mirrors, "org", "deployed", [_model_files(tmp_path, seed=0)])
    home = tmp_path / "store"
    config = tmp_path / "watch.yaml"
    config.write_text("repos:\n  - repo: org/deployed\n    no_smoke: true\n    gpu_pool: cpu-test\n")
    env = {**os.environ, **prefect_server.env}
    pool = subprocess.run([sys.executable, "-m", "prefect", "work-pool", "create", "modelyard-test", "--type", "process"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert pool.returncode == 0, pool.stdout + pool.stderr
    bad = run_cli("deploy", "--config", str(config), "--pool", "modelyard-test", "--cron", "not a cron", env=prefect_server.env)
    assert bad.returncode == 2 and "is not a valid cron expression" in bad.stderr, bad.stderr
    r = run_cli("deploy", "--config", str(config), "--pool", "modelyard-test", "--cron", "*/15 * * * *",
                "--out", str(home), "--json", env=prefect_server.env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert json_result(r.stdout, "deploy")["name"] == "watch/watch"
    code = ("import asyncio, json\nfrom prefect.client.orchestration import get_client\n"
            "async def main():\n  async with get_client() as c:\n"
            "    d = await c.read_deployment_by_name('watch/watch')\n"
            "    print(json.dumps({'entrypoint': d.entrypoint, 'parameters': d.parameters, 'pool': d.work_pool_name,"
            " 'crons': [s.schedule.cron for s in d.schedules], 'limit': d.global_concurrency_limit.limit"
            " if d.global_concurrency_limit else None}))\nasyncio.run(main())\n")
    d = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert d.returncode == 0, d.stderr
    dep = json.loads(d.stdout.strip().splitlines()[-1])
    assert dep == {"entrypoint": "modelyard.flows.watch.watch_flow", "pool": "modelyard-test", "crons": ["*/15 * * * *"],
                   "parameters": {"config": str(config), "home": str(home)}, "limit": 1}, dep
    # one run now, picked up by a real process worker (as the cron would)
    with OlahServer(mirrors) as hub:
        wenv = {**env, "HF_ENDPOINT": hub.endpoint, "PREFECT_LOGGING_LEVEL": "WARNING"}
        run = subprocess.run([sys.executable, "-m", "prefect", "deployment", "run", "watch/watch"], capture_output=True,
                             text=True, env=wenv, timeout=120)
        assert run.returncode == 0, run.stdout + run.stderr
        w = subprocess.run([sys.executable, "-m", "prefect", "worker", "start", "--pool", "modelyard-test", "--run-once"],
                           capture_output=True, text=True, env=wenv, timeout=600, cwd=tmp_path)
        assert w.returncode == 0, w.stdout[-3000:] + w.stderr[-3000:]
    assert store_artifacts(home) == [home / "deployed" / shas[0]]
    state = json.loads((home / ".watch" / "org--deployed.json").read_text())
    assert state["last_ingested"]["commit"] == shas[0]
