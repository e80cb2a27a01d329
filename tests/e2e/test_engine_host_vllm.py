"""The warm engine host with the real vLLM runtime (.venv-vllm): a run it forks answers exactly as a cold
interpreter does, a timeout kills the run's whole process group, and a run it refuses starts cold. A host of its
own per module (not the session's), so that what it ran and refused can be read from its log."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from modelyard.runtime import engine_host
from modelyard.runtime.process import run_script
from modelyard.runtime.scripts import SCRIPTS
from modelyard.runtime.venv import runtime_env
from modelyard.settings import Settings
from tests.fixtures import make_tiny_llama

pytestmark = [pytest.mark.vllm]
SMOKE = SCRIPTS / "vllm_smoke.py"


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    settings = Settings()
    python = settings.vllm_interpreter()
    if not python.exists():
        pytest.skip("no vLLM runtime venv (make setup)")
    tmp = tmp_path_factory.mktemp("host")
    env = runtime_env(settings, str(tmp)) | {"TORCH_COMPILE_DISABLE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    proc, sock = engine_host.start(python, env, log=tmp / "host.log")
    yield python, sock, env, tmp / "host.log"
    assert engine_host.stop(proc) == 0  # SIGTERM ends it at once: a CI host once waited past 20 s for its teardown


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny", hidden=128, intermediate=256)


def _smoke(python, env, tiny, out: Path, log: Path, timeout: float = 300):
    args = ["--model", str(tiny), "--question", "w1 w2", "--max-tokens", "6", "--max-model-len", "256", "--enforce-eager",
            "--mode", "completion", "--dtype", "auto", "--out", str(out)]
    return run_script(python, SMOKE, args, env=env, timeout=timeout, log=log)


def test_a_hosted_run_answers_as_a_cold_one(host, tiny, tmp_path, monkeypatch):
    python, sock, env, host_log = host
    monkeypatch.setenv("MODELYARD_ENGINE_HOST", sock)
    hosted = _smoke(python, env, tiny, tmp_path / "hosted.json", tmp_path / "hosted.log")
    monkeypatch.setenv("MODELYARD_ENGINE_HOST", "off")
    cold = _smoke(python, env, tiny, tmp_path / "cold.json", tmp_path / "cold.log")
    assert (hosted.returncode, cold.returncode, hosted.timed_out) == (0, 0, False)
    a, b = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("hosted", "cold"))
    assert a["ok"] is True and a["finish_reason"] == "length" and len(a["answer_ids"]) == 6
    assert (a["answer_ids"], a["text"], a["vocab_size"]) == (b["answer_ids"], b["text"], b["vocab_size"])
    assert "non-default args" in (tmp_path / "hosted.log").read_text()  # the run's output went to its own log
    assert host_log.read_text().count("engine host: run ") == 1


def test_a_timeout_kills_the_hosted_run_and_its_group(host, tiny, tmp_path, monkeypatch):
    python, sock, env, host_log = host
    monkeypatch.setenv("MODELYARD_ENGINE_HOST", sock)
    run = _smoke(python, env, tiny, tmp_path / "out.json", tmp_path / "log", timeout=0.5)
    assert (run.timed_out, run.returncode) == (True, None)
    assert not (tmp_path / "out.json").exists()
    pid = int(re.findall(r"engine host: run (\d+): vllm_smoke.py", host_log.read_text())[-1])
    assert _living_in_group(pid) == []  # the run's session (its pid is its group) is gone, what it spawned too


def _living_in_group(pgid: int) -> list[int]:
    """Processes of group ``pgid`` that are not zombies (what a run spawned is reparented to PID 1, which here may
    not reap it at once: a zombie still answers ``kill(pid, 0)``)."""
    out = []
    for d in Path("/proc").iterdir():
        try:
            rest = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if d.name.isdigit() and int(rest[2]) == pgid and rest[0] != "Z":
            out.append(int(d.name))
    return out


def test_a_refused_run_starts_cold_with_its_own_settings(host, tiny, tmp_path, monkeypatch):
    python, sock, env, host_log = host
    monkeypatch.setenv("MODELYARD_ENGINE_HOST", sock)
    before = host_log.read_text().count("engine host: run ")
    run = _smoke(python, {**env, "OMP_NUM_THREADS": "1"}, tiny, tmp_path / "out.json", tmp_path / "log")
    assert run.returncode == 0 and json.loads((tmp_path / "out.json").read_text())["ok"] is True
    log = host_log.read_text()
    assert log.count("engine host: run ") == before
    assert "engine host: refused vllm_smoke.py: variables read at import differ from the host's: OMP_NUM_THREADS" in log
