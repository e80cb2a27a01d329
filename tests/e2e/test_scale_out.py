"""Scale out, for real: a Prefect server on PostgreSQL 15, moto's S3 as the one store, and two process
workers as separate processes, each with its own local cache (MODELYARD_HOME) and working folder.

Eight ingest runs (four of one source, four of another) are submitted to the ``ingest`` deployment
(``modelyard deploy-ingest``). The first worker to start uploading an artifact is killed with SIGKILL
(the worker and its flow-run processes: the host is lost) while the blobs go up. Then:

- nothing of the killed upload is visible: no manifest for it at the moment of the kill;
- Prefect's zombie detection marks the lost run Crashed, the retry automation schedules it again, and it
  completes on the other worker (its logs show attempt 1 on one cache and a later attempt on the other);
- every run completes; the bucket holds exactly two artifacts, each verifiable from a fresh cache,
  listed by ``list --store s3://...``, and bundled by ``bundle``;
- the GPU pool's global concurrency limit (1 slot) held across the workers: the slot-holding intervals
  the runs logged never overlap.

Random-weight models cannot chat, so the runs ingest with ``smoke: false``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import json_result, run_cli
from tests.e2e.prefect_server import Postgres15, PrefectServer, postgres_available
from tests.e2e.publish_servers import AWS_ENV
from tests.fixtures import make_tiny_llama
from tests.killing import events

pytestmark = [pytest.mark.e2e, pytest.mark.prefect_server, pytest.mark.publish, pytest.mark.scale_out]

STORE = "s3://models/fleet"
POOL = "fleet"


def _worker(name: str, tmp: Path, env: dict[str, str]) -> tuple[subprocess.Popen, Path, Path]:
    """``prefect worker start`` in its own folder and session, with its own cache; (process, cache, progress log)."""
    home = tmp / name
    (home / "work").mkdir(parents=True)
    cache, log = home / "cache", home / "progress.jsonl"
    wenv = {**env, "MODELYARD_HOME": str(cache), "MODELYARD_PROGRESS_JSONL": str(log)}
    with open(home / "worker.log", "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "prefect", "worker", "start", "--pool", POOL, "--name", name,
                                 "--limit", "2"], cwd=home / "work", env=wenv, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    return proc, cache, log


def _kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the worker and every process under it (its flow runs run in sessions of their own)."""
    import psutil

    try:
        procs = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        procs = []
    for p in procs:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    proc.wait(timeout=30)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            _kill_tree(proc)


def _manifests(client) -> list[str]:  # noqa: ANN001
    r = client.list_objects_v2(Bucket="models", Prefix="fleet/artifacts/")
    return sorted(o["Key"] for o in r.get("Contents", []))


def _uploading(log: Path) -> str | None:
    """The artifact (``name@revision``) whose upload is under way in this worker (its second blob is up, the
    upload has not finished), or None."""
    advances: dict[tuple, int] = {}
    finished = set()
    for e in events(log):
        if e["task"].startswith("uploading "):
            key = (e["pid"], e["task"])
            if e["event"] == "advance":
                advances[key] = advances.get(key, 0) + 1
            elif e["event"] == "finish":
                finished.add(key)
    return next((task.split()[1] for (pid, task), n in advances.items() if n >= 2 and (pid, task) not in finished), None)


def _states(http: httpx.Client, runs: list[str]) -> list[dict]:
    return http.post("/flow_runs/filter", json={"flow_runs": {"id": {"any_": runs}}}).json()


def _flow_logs(http: httpx.Client, runs: list[str]) -> list[dict]:
    """The flow-level log records (not the tasks') of ``runs``, oldest first, every page."""
    out: list[dict] = []
    while True:
        page = http.post("/logs/filter", json={"logs": {"flow_run_id": {"any_": runs}, "task_run_id": {"is_null_": True}},
                                               "sort": "TIMESTAMP_ASC", "limit": 200, "offset": len(out)}).json()
        out += page
        if len(page) < 200:
            return out


def _slot_intervals(logs: list[dict], kill_time: float) -> list[tuple[float, float, str]]:
    """(start, end, flow run id) of every ``holds a slot`` … ``released its slot`` pair in the runs' logs;
    a hold without a release (the killed attempt) ends at the kill."""
    from datetime import datetime

    out, open_ = [], {}
    for lg in logs:
        t = datetime.fromisoformat(lg["timestamp"].replace("Z", "+00:00")).timestamp()
        run = lg["flow_run_id"]
        if lg["message"].startswith("holds a slot of gpu-"):
            if run in open_:  # the attempt that held it was killed; this is the retry's hold
                out.append((open_.pop(run), kill_time, run))
            open_[run] = t
        elif lg["message"].startswith("released its slot of gpu-"):
            out.append((open_.pop(run), t, run))
    out += [(t, kill_time, run) for run, t in open_.items()]
    return sorted(out)


@pytest.mark.skipif(not postgres_available(), reason="PostgreSQL 15 is not installed")
def test_two_workers_share_one_store_and_survive_a_killed_worker(tmp_path, tmp_path_factory, s3_endpoint, client):
    # 35 MB in 5 shards each: an upload takes long enough (about 0.5 s into moto) to be killed in the middle
    models = {src: make_tiny_llama(tmp_path / "src" / src, seed=seed, hidden=768, intermediate=3072, max_shard_size="8MB")
              for src, seed in (("alpha", 3), ("beta", 4))}
    with Postgres15() as pg, PrefectServer(tmp_path_factory.mktemp("prefect-fleet"), database_url=pg.url,
                                           server_env={"PREFECT_SERVER_SERVICES_REPOSSESSOR_LOOP_SECONDS": "5"}) as server:
        api = server.api_url
        env = {**os.environ, **server.env, **AWS_ENV, "MODELYARD_S3_ENDPOINT_URL": s3_endpoint, "MODELYARD_STORE": STORE,
               "PREFECT_LOGGING_LEVEL": "INFO", "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": "30",  # the runs log at INFO
               "PREFECT_WORKER_QUERY_SECONDS": "1", "MODELYARD_GPU_SLOT_LEASE_SECONDS": "60"}
        pool = subprocess.run([sys.executable, "-m", "prefect", "work-pool", "create", POOL, "--type", "process"],
                              capture_output=True, text=True, env=env, timeout=120)
        assert pool.returncode == 0, pool.stdout + pool.stderr
        http = httpx.Client(base_url=api, timeout=30)
        http.post("/v2/concurrency_limits/", json={"name": "gpu-test", "limit": 1}).raise_for_status()
        d = run_cli("deploy-ingest", "--pool", POOL, "--crash-after", "90", "--json", env=server.env)
        assert d.returncode == 0, d.stdout + d.stderr
        dep = json_result(d.stdout, "deploy-ingest")
        assert dep["name"] == "ingest/ingest" and len(dep["automations"]) == 2, dep

        workers = {n: _worker(n, tmp_path, env) for n in ("w1", "w2")}
        try:
            runs = []
            for i in range(4):
                for src, path in models.items():
                    r = http.post(f"/deployments/{dep['deployment_id']}/create_flow_run",
                                  json={"parameters": {"source": f"file://{path}", "options": {"smoke": False},
                                                       "gpu_pool": "test"}, "name": f"{src}-{i}"})
                    r.raise_for_status()
                    runs.append(r.json()["id"])

            # kill the first worker that is uploading an artifact, while its blobs go up
            deadline, victim, polled = time.monotonic() + 300, None, time.monotonic()
            while victim is None and time.monotonic() < deadline:
                for n, (proc, _, log) in workers.items():
                    assert proc.poll() is None, (tmp_path / n / "worker.log").read_text()[-3000:]
                    art = _uploading(log)
                    if art:
                        _kill_tree(proc)
                        victim, killed_art, kill_time = n, art, time.time()
                        break
                if victim is None and time.monotonic() - polled > 5:  # a run that failed early fails the test now
                    polled = time.monotonic()
                    failed = [s for s in _states(http, runs) if s["state_type"] in ("FAILED", "CRASHED")]
                    assert not failed, [(s["name"], s["state"]["message"]) for s in failed]
                time.sleep(0.01)
            assert victim, "no worker started an upload"
            name, rev = killed_art.split("@")
            visible_at_kill = _manifests(client)
            assert f"fleet/artifacts/{name}/{rev}/manifest.json" not in visible_at_kill, (killed_art, visible_at_kill)
            survivor = next(n for n in workers if n != victim)

            # every run completes, the lost ones on the surviving worker
            deadline = time.monotonic() + 420
            while time.monotonic() < deadline:
                states = _states(http, runs)
                if all(s["state_type"] in ("COMPLETED", "FAILED", "CANCELLED") for s in states):
                    break
                assert workers[survivor][0].poll() is None, (tmp_path / survivor / "worker.log").read_text()[-3000:]
                time.sleep(2)
            by_id = {s["id"]: s for s in states}
            assert sorted(s["state_type"] for s in states) == ["COMPLETED"] * 8, \
                [(s["name"], s["state_type"], s["state"]["message"]) for s in states]
            logs = _flow_logs(http, runs)
        finally:
            for proc, _, _ in workers.values():
                _stop(proc)
            http.close()

    caches = {n: str(c) for n, (_, c, _) in workers.items()}
    attempts: dict[str, list[str]] = {}
    for lg in logs:
        if lg["message"].startswith("attempt "):
            attempts.setdefault(lg["flow_run_id"], []).append(next(n for n, c in caches.items() if f"local cache {c}," in lg["message"]))
    retried = {r: w for r, w in attempts.items() if len(w) > 1}
    assert retried, attempts  # the killed worker's run(s) started again ...
    for run, ws in retried.items():
        assert ws[0] == victim and ws[-1] == survivor, (by_id[run]["name"], ws)  # ... and finished on the other worker
        assert by_id[run]["run_count"] == len(ws)

    # the GPU limit (1 slot) held across the two workers: no two holds overlap; both workers held it
    intervals = _slot_intervals(logs, kill_time)
    assert len(intervals) >= 2, intervals
    held_until, holder = intervals[0][1], intervals[0][2]
    for start, end, run in intervals[1:]:
        assert start >= held_until, f"runs {holder} and {run} held the single GPU slot at once: {intervals}"
        held_until, holder = end, run

    # exactly two artifacts, complete and verifiable; nothing of the killed attempt left in its cache
    final = _manifests(client)
    assert len(final) == 2 and all(k.endswith("/manifest.json") for k in final), final
    assert not (Path(caches[victim]) / name / rev / "manifest.json").exists()
    cli_env = {**AWS_ENV, "MODELYARD_S3_ENDPOINT_URL": s3_endpoint}
    ls = run_cli("list", "--store", STORE, "--json", env={**cli_env, "MODELYARD_HOME": str(tmp_path / "reader")})
    assert ls.returncode == 0, ls.stderr
    listed = sorted((a["name"], a["revision"]) for a in json_result(ls.stdout, "list")["artifacts"])
    assert [n for n, _ in listed] == ["alpha", "beta"] and (name, rev) in listed
    for n, r in listed:
        v = run_cli("verify", f"{n}@{r}", "--store", STORE, env={**cli_env, "MODELYARD_HOME": str(tmp_path / f"check-{n}")})
        assert v.returncode == 0, v.stdout[-2000:] + v.stderr[-2000:]
        files = json.loads((tmp_path / f"check-{n}" / n / r / "manifest.json").read_text())["files"]
        assert {f["path"].removeprefix("model/") for f in files} == {p.name for p in models[n].iterdir()}
    b = run_cli("bundle", f"{name}@{rev}", "-o", str(tmp_path / "a.tar.zst"), "--store", STORE, "--json",
                env={**cli_env, "MODELYARD_HOME": str(tmp_path / f"check-{name}")})
    assert b.returncode == 0, b.stderr
