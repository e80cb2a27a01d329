"""The warm engine host's rules (modelyard/runtime/scripts/engine_host.py, read here without vLLM): which runs it
takes, which it refuses and why; and the client's side when no host answers. The host itself, forking real vLLM
runs, is tested in tests/e2e/test_engine_host_vllm.py."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

from modelyard.runtime import engine_host
from modelyard.runtime.scripts import SCRIPTS

HOST = runpy.run_path(str(engine_host.SCRIPT))
PREFIX = str(Path(sys.prefix).absolute())
SMOKE = str(SCRIPTS / "vllm_smoke.py")
BASE = {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "2", "TORCH_COMPILE_DISABLE": "1", "HF_HOME": "/tmp/a/hf"}


def _req(**kw):
    return {"python": f"{PREFIX}/bin/python", "script": SMOKE, "args": ["--out", "x"], "env": dict(BASE), "cwd": None,
            "log": "/tmp/log", **kw}


def test_a_run_of_this_venv_and_a_runner_script_is_taken():
    assert HOST["refusal"](_req(), BASE, PREFIX) is None
    # per-run values: the compile switch (set in the run), the hub's home, the tmp folders
    env = {**BASE, "TORCH_COMPILE_DISABLE": "0", "HF_HOME": "/tmp/b/hf", "TMPDIR": "/tmp/b", "VLLM_CPU_KVCACHE_SPACE": "4",
           # what the CLI sets to quiet the libraries: set again in the run
           "TOKENIZERS_PARALLELISM": "false", "TRANSFORMERS_VERBOSITY": "error", "HF_HUB_DISABLE_PROGRESS_BARS": "1",
           "HF_HUB_DISABLE_TELEMETRY": "1"}
    assert HOST["refusal"](_req(env=env), BASE, PREFIX) is None


def test_what_the_host_refuses():
    refusal = HOST["refusal"]
    other = "/opt/venv-candidate"
    assert refusal(_req(python=f"{other}/bin/python"), BASE, PREFIX) == \
        f"interpreter '{other}/bin/python' is not this host's ({PREFIX})"
    assert refusal(_req(script="/tmp/evil.py"), BASE, PREFIX) == \
        f"script '/tmp/evil.py' is not one of the runners in {SCRIPTS}"
    env = {**BASE, "OMP_NUM_THREADS": "1", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    assert refusal(_req(env=env), BASE, PREFIX) == \
        "variables read at import differ from the host's: OMP_NUM_THREADS, ONEDNN_MAX_CPU_ISA"
    assert refusal(_req(env={**BASE, "HF_HUB_OFFLINE": "0"}), BASE, PREFIX) == \
        "variables read at import differ from the host's: HF_HUB_OFFLINE"
    assert refusal(_req(args=[1]), BASE, PREFIX) == "args must be strings"
    assert refusal(_req(env={"A": 1}), BASE, PREFIX) == "env must map names to strings"


def test_without_a_host_the_client_starts_the_interpreter_itself(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELYARD_ENGINE_HOST", "off")
    assert engine_host.host_socket() is None
    monkeypatch.setenv("MODELYARD_ENGINE_HOST", str(tmp_path / "none.sock"))
    assert engine_host.submit(sys.executable, SMOKE, [], env={}, log=tmp_path / "log") is None
    assert engine_host.host_socket() is None  # a host that failed is not asked again by this process
    # a host of another venv is not even asked: its prefix file says whose it is
    (tmp_path / "h").mkdir()
    (tmp_path / "h" / engine_host.PREFIX_FILE).write_text("/opt/other-venv")
    assert engine_host.submit(sys.executable, SMOKE, [], env={}, log=tmp_path / "log", path=str(tmp_path / "h" / "s")) is None
    assert str(tmp_path / "h" / "s") not in engine_host._dead
