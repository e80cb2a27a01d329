"""Ingest overhead: ``modelyard ingest`` against its essential parts run by hand.

    .venv/bin/python benchmarks/ingest_overhead.py [--model DIR] [--keep]

Takes the demo model (SmolLM2-135M-Instruct as a safetensors folder: ``--model``, else the
``model/`` of an artifact under ``/tmp/demo-store``, else one made with ``modelyard demo``; the
GGUF conversion is never part of it: the source is ``file://<that folder>``) and times, in one run,
on a warm page cache (every file read once first, and vLLM imported once, untimed):

- **hand-run parts**: ``sha256sum`` of every file of the folder (one process), then the vLLM smoke
  runner (``modelyard/runtime/scripts/vllm_smoke.py``) in the vLLM runtime's interpreter, with the
  exact arguments and environment that ``smoke.smoke_load`` uses (``runtime_env``, ``--enforce-eager``,
  ``--max-model-len min(max_position_embeddings, 4096)``, 64 tokens, the default question): load + one chat;
- **modelyard ingest** with the smoke (``--smoke load``, the default), fresh store: the ratio
  ``ingest / (sha256sum + vLLM)`` (target <= 1.2);
- **modelyard ingest --no-smoke**, fresh store, against ``sha256sum`` alone;
- **modelyard ingest --no-smoke** again with ``MODELYARD_NO_WARMUP=1``: what the warm-up thread saves;
- the overhead that does not depend on the model: ``import modelyard.flows.ingest`` in a fresh
  interpreter, and an ingest --no-smoke of a tiny model (1 layer, hidden size 8, same tokenizer).

The four ingests run twice, against two Prefect APIs:

- **ephemeral API** (no ``PREFECT_API_URL``, what a plain ``modelyard ingest`` does): each ingest
  starts Prefect's ephemeral API server (a uvicorn subprocess) on a private ``PREFECT_HOME`` and
  SQLite database, and stops it at exit;
- **running server** (``PREFECT_API_URL`` set, how scheduled deployments run): a
  ``prefect server start --host 127.0.0.1 --port <free>`` on SQLite in its own ``PREFECT_HOME``
  (``tests.e2e.prefect_server.PrefectServer``), started before these ingests and stopped at the end,
  also on error. Its start is not timed.

Each mode is warmed by one untimed ingest of the tiny model first (database migrations, pyc files).
Both ratios ``ingest / (sha256sum + vLLM)`` are taken against the same hand-run parts. vLLM's load
time on CPU varies by several seconds from one process to the next, so each ratio is also printed with
the ingest's own smoke stage replaced by the hand-run vLLM time: ``(ingest - smoke stage + vLLM by hand)
/ (sha256sum + vLLM by hand)``, what modelyard adds around the smoke.

Prefect's share comes from Prefect itself: afterwards the flow run and task runs are read back
through Prefect's API client, from the ephemeral database (``PREFECT_HOME``) or from the running
server (``PREFECT_API_URL``). For each ingest the script prints: process start to flow-run start
(interpreter, imports, ephemeral API server start or server connection, flow-run creation), the flow
run's own time, the sum of its task runs, the flow time outside any task (flow-body code such as
checks of the store plus per-task orchestration), and flow end to process exit (teardown, with the
ephemeral API the server's shutdown).

verify's transformers imports run in a warm-up thread (``modelyard.stages.smoke.warmup``) from CLI start,
beside Prefect's start and the hash; the ingest with ``MODELYARD_NO_WARMUP=1`` shows what that saves in
each mode (with a running server there is little start-up left for the imports to overlap).

A fresh store for each ingest, so nothing is reused (the digest cache and the stage cache live in
the store); the script checks that each timed ingest reports no ``cached_stages``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.ingest_io import find_model, make_tiny
from modelyard.flows.options import IngestOptions
from modelyard.runtime.venv import runtime_env
from modelyard.settings import Settings
from modelyard.stages.smoke import RUNNER, SMOKE_LEN_CAP
from tests.e2e.prefect_server import PrefectServer

ROOT = Path(__file__).resolve().parents[1]
PY = ROOT / ".venv" / "bin" / "python"
MODELYARD = ROOT / ".venv" / "bin" / "modelyard"

QUERY = r"""
import asyncio, json, sys
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
async def main():
    async with get_client() as c:
        runs = await c.read_flow_runs()
        out = []
        for r in runs:
            trs = await c.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[r.id])))
            out.append({"start": r.start_time.timestamp() if r.start_time else None,
                        "end": r.end_time.timestamp() if r.end_time else None,
                        "tasks": [{"name": t.name, "start": t.start_time.timestamp() if t.start_time else None,
                                   "end": t.end_time.timestamp() if t.end_time else None} for t in trs]})
        print(json.dumps(out))
asyncio.run(main())
"""


def timed(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, float, str]:
    """(epoch start, wall seconds, stdout) of ``cmd``; exits on failure."""
    t_epoch, t0 = time.time(), time.perf_counter()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}):\n{(p.stdout + p.stderr)[-3000:]}")
    return t_epoch, wall, p.stdout


def prefect_runs(env: dict[str, str]) -> list[dict]:
    _, _, out = timed([str(PY), "-c", QUERY], env)
    return json.loads(out.strip().splitlines()[-1])


def split(run: dict, t_start: float, wall: float) -> dict[str, float]:
    tasks = [t for t in run["tasks"] if t["start"] and t["end"]]
    task_s = sum(t["end"] - t["start"] for t in tasks)
    flow_s = run["end"] - run["start"]
    by_name: dict[str, float] = {}
    for t in tasks:
        by_name[t["name"].rsplit("-", 1)[0]] = by_name.get(t["name"].rsplit("-", 1)[0], 0) + t["end"] - t["start"]
    return {"to_flow_start": run["start"] - t_start, "flow": flow_s, "tasks": task_s, "outside_tasks": flow_s - task_s,
            "after_flow": t_start + wall - run["end"], "n_tasks": len(tasks), "by_name": by_name}


def time_ingests(ing, model: Path, tiny: Path, env: dict[str, str], tag: str) -> dict:
    """Time ``--smoke load`` and ``--no-smoke`` of the model, ``--no-smoke`` of the tiny model and
    ``--no-smoke`` of the model without the warm-up thread, each into a fresh store, under ``env``;
    then read their flow and task runs back from Prefect."""
    t_smoke, ing_s, o1 = timed(ing(model, f"store-{tag}-smoke", "--smoke", "load"), env)
    t_nos, nos_s, o2 = timed(ing(model, f"store-{tag}-nosmoke", "--no-smoke"), env)
    t_tiny, tiny_s, o3 = timed(ing(tiny, f"store-{tag}-tiny", "--no-smoke"), env)
    t_now, now_s, o4 = timed(ing(model, f"store-{tag}-nowarmup", "--no-smoke"), {**env, "MODELYARD_NO_WARMUP": "1"})
    res = [json.loads(o)["result"] for o in (o1, o2, o3, o4)]  # the --json envelope's result
    for r in res:
        if r.get("cached_stages"):
            sys.exit(f"{tag}: a fresh-store ingest reused cached stages {r['cached_stages']}: not a cold run")
    runs = sorted(prefect_runs(env), key=lambda r: r["start"] or 0)

    def near(t0: float) -> dict:
        return min((r for r in runs if r["start"] and r["end"] and r["start"] >= t0), key=lambda r: r["start"])

    return {"smoke_s": ing_s, "nosmoke_s": nos_s, "tiny_s": tiny_s, "nowarmup_s": now_s,
            "smoke_stage": res[0]["smoke"]["wall_seconds"],
            "hashed_bytes": res[1].get("hashed_bytes"),
            "sp": {"smoke": split(near(t_smoke), t_smoke, ing_s), "nosmoke": split(near(t_nos), t_nos, nos_s),
                   "tiny": split(near(t_tiny), t_tiny, tiny_s), "nowarmup": split(near(t_now), t_now, now_s)}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", help="a safetensors model folder (default: the demo model)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folders")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="ingest-overhead-"))
    server: PrefectServer | None = None
    loads: list[float] = []
    try:
        model = find_model(args.model, tmp)
        tiny = tmp / "tiny"
        make_tiny(model, tiny)
        files = sorted(str(f) for f in model.rglob("*") if f.is_file())
        m_bytes = sum(os.path.getsize(f) for f in files)
        base_env = {k: v for k, v in os.environ.items()
                    if k not in ("MODELYARD_HOME", "PREFECT_API_URL", "PREFECT_HOME", "PREFECT_API_DATABASE_CONNECTION_URL")}
        env = {**base_env, "PREFECT_HOME": str(tmp / "prefect")}
        ing = lambda src, store, *extra: [str(MODELYARD), "ingest", f"file://{src}", "--out", str(tmp / store), "--json", *extra]  # noqa: E731
        for f in files:  # warm the page cache
            with open(f, "rb") as fh:
                while fh.read(8 << 20):
                    pass
        timed(ing(tiny, "store-warmup", "--no-smoke"), env)  # untimed: Prefect DB migrations, pyc

        # hand-run parts
        _, sha_s, _ = timed(["sha256sum", *files])
        settings = Settings()
        timed([str(settings.vllm_interpreter()), "-c", "import vllm"])  # untimed: vLLM's own files into the page cache
        cfg = json.loads((model / "config.json").read_text())
        mpe = cfg.get("max_position_embeddings")
        mml = min(int(mpe), SMOKE_LEN_CAP) if isinstance(mpe, int) else SMOKE_LEN_CAP
        opts = IngestOptions()
        with tempfile.TemporaryDirectory(prefix="modelyard-smoke-") as st:
            out = Path(st) / "result.json"
            cmd = [str(settings.vllm_interpreter()), str(RUNNER), "--model", str(model), "--question", opts.smoke_prompt(),
                   "--max-tokens", str(opts.smoke_max_tokens), "--max-model-len", str(mml), "--enforce-eager", "--out", str(out)]
            # as smoke_load does: own session, log to a file, and the group killed afterwards (the runner
            # leaves through os._exit; vLLM's engine process and resource tracker would outlive it)
            t0 = time.perf_counter()
            with open(Path(st) / "vllm.log", "wb") as lf:
                proc = subprocess.Popen(cmd, stdout=lf, stderr=subprocess.STDOUT, env=runtime_env(settings, st),
                                        start_new_session=True)
                try:
                    proc.wait(settings.smoke_timeout)
                finally:
                    try:
                        os.killpg(proc.pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
            vllm_s = time.perf_counter() - t0
            if not out.is_file():
                sys.exit(f"hand-run vLLM smoke wrote no result:\n{(Path(st) / 'vllm.log').read_text()[-3000:]}")
            hand = json.loads(out.read_text())
        if not hand.get("ok"):
            sys.exit(f"hand-run vLLM smoke failed: {hand.get('error')}")
        _, imp_s, _ = timed([str(PY), "-c", "import modelyard.flows.ingest"], env)

        # modelyard, ephemeral API (no PREFECT_API_URL)
        eph = time_ingests(ing, model, tiny, env, "ephemeral")
        loads.append(os.getloadavg()[0])

        # modelyard, against a running Prefect server (SQLite), as a scheduled deployment runs
        t0 = time.perf_counter()
        server = PrefectServer(tmp / "prefect-server").start()
        server_start_s = time.perf_counter() - t0
        srv_env = {**base_env, **server.env}
        timed(ing(tiny, "store-server-warmup", "--no-smoke"), srv_env)  # untimed: first client run, pyc
        srv = time_ingests(ing, model, tiny, srv_env, "server")
        loads.append(os.getloadavg()[0])
        server.stop()
        server = None

        modes = (("ephemeral API", eph), ("running server", srv))
        hand_sum = sha_s + vllm_s
        print(f"model: {model} ({len(files)} files, {m_bytes / 1e6:.1f} MB)")
        print(f"load average after the ephemeral-API ingests: {loads[0]:.1f}, after the server ingests: {loads[1]:.1f}, "
              f"on {os.cpu_count()} CPUs")
        print(f"prefect server start (not timed in the ingests): {server_start_s:.1f} s\n")
        print("| | wall s |")
        print("|---|---|")
        print(f"| `sha256sum` of every file | {sha_s:.2f} |")
        print(f"| vLLM load + chat, runner by hand (vLLM's own: load {hand['load_seconds']:.1f} s, "
              f"generate {hand['generate_seconds']:.1f} s) | {vllm_s:.1f} |")
        print(f"| **hand-run sum** | **{hand_sum:.1f}** |")
        for name, m in modes:
            print(f"| `modelyard ingest --smoke load`, fresh store, {name} (its smoke stage: {m['smoke_stage']:.1f} s) "
                  f"| {m['smoke_s']:.1f} |")
            print(f"| ratio ingest / hand-run sum, {name} (target <= 1.2) | **{m['smoke_s'] / hand_sum:.2f}** |")
            print(f"| same, with its smoke stage replaced by the hand-run vLLM time, {name} "
                  f"| {(m['smoke_s'] - m['smoke_stage'] + vllm_s) / hand_sum:.2f} |")
        for name, m in modes:
            print(f"| `modelyard ingest --no-smoke`, fresh store, {name} | {m['nosmoke_s']:.1f} |")
            print(f"| ratio ingest --no-smoke / sha256sum, {name} | {m['nosmoke_s'] / sha_s:.1f} |")
        for name, m in modes:
            print(f"| `modelyard ingest --no-smoke`, fresh store, `MODELYARD_NO_WARMUP=1`, {name} | {m['nowarmup_s']:.1f} |")
        for name, m in modes:
            print(f"| `modelyard ingest --no-smoke` of a tiny model (fixed cost), {name} | {m['tiny_s']:.1f} |")
        print(f"| `python -c 'import modelyard.flows.ingest'` | {imp_s:.1f} |")
        print("\nPrefect's share, from its own flow and task runs (s):\n")
        print("| ingest | Prefect API | process start to flow start | flow run | in tasks | in flow, outside tasks "
              "| flow end to exit |")
        print("|---|---|---|---|---|---|---|")
        for label, k in (("--smoke load", "smoke"), ("--no-smoke", "nosmoke"), ("--no-smoke, no warm-up", "nowarmup"),
                         ("--no-smoke, tiny model", "tiny")):
            for name, m in modes:
                s = m["sp"][k]
                print(f"| {label} | {name} | {s['to_flow_start']:.1f} | {s['flow']:.1f} | {s['tasks']:.1f} "
                      f"({s['n_tasks']} tasks) | {s['outside_tasks']:.1f} | {s['after_flow']:.1f} |")
        print("\ntask times (s):")
        for name, m in modes:
            for label, k in (("--smoke load", "smoke"), ("--no-smoke", "nosmoke"), ("--no-smoke, no warm-up", "nowarmup"),
                             ("--no-smoke, tiny model", "tiny")):
                print(f"  {name}, {label}: " + ", ".join(f"{n} {v:.2f}" for n, v in m["sp"][k]["by_name"].items()))
        print()
        for name, m in modes:
            sp = m["sp"]["smoke"]
            fixed = sp["to_flow_start"] + sp["after_flow"] + sp["outside_tasks"]
            print(f"not model work in ingest --smoke load, {name} (start + outside tasks + exit): {fixed:.1f} s "
                  f"= {fixed / m['smoke_s']:.0%} of its wall time")
        print(f"hashed bytes reported by ingest --no-smoke: ephemeral {eph['hashed_bytes']}, server {srv['hashed_bytes']} "
              f"(model {m_bytes})")
    finally:
        if server is not None:
            server.stop()
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
