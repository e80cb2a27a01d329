from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# Quiet Prefect in-process (its shutdown message otherwise hits pytest's closed capture stream).
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
# ingest asks the runtime venv's vLLM during verify when it exists (10-25 s of vLLM import per verify on 2
# cores): the many ingests of the suite test other stages, so they run without it; the oracle and ingest with
# it are tested in tests/e2e/test_runtime_oracle_vllm.py, which sets MODELYARD_VERIFY_RUNTIME=auto.
os.environ.setdefault("MODELYARD_VERIFY_RUNTIME", "none")

from tests.fixtures import make_tiny_llama

ROOT = Path(__file__).resolve().parents[1]
SHARED_CASES = ROOT.parent / "shared" / "cases"


def run_cli(*args: str, env: dict | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    """Run the real `modelyard` CLI in a subprocess (as a user would)."""
    e = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "modelyard", *args], capture_output=True, text=True, env=e,
                          timeout=timeout, cwd=ROOT)


#: the keys of every ``--json`` object, in order (modelyard.cli._common.ENVELOPE_KEYS, docs/reference/json.md)
ENVELOPE_KEYS = ["ok", "command", "exit_code", "result", "error"]


def json_envelope(stdout: str, command: str, exit_code: int = 0) -> dict:
    """The one JSON object a ``--json`` command printed on ``stdout`` (nothing else there), after checking
    the envelope: its keys in order, ``command``, ``exit_code``, ``ok`` (true exactly when ``exit_code``
    is 0) and ``error`` (null exactly then, else ``{type, message, fix, ...}``)."""
    env = json.loads(stdout)
    assert list(env) == ENVELOPE_KEYS, env
    assert (env["ok"], env["command"], env["exit_code"]) == (exit_code == 0, command, exit_code), env
    if exit_code == 0:
        assert env["error"] is None, env
    else:
        assert list(env["error"])[:3] == ["type", "message", "fix"], env
    return env


def json_result(stdout: str, command: str, exit_code: int = 0):
    """The ``result`` of a ``--json`` command's envelope (:func:`json_envelope` checks the envelope)."""
    return json_envelope(stdout, command, exit_code)["result"]


def json_error(stdout: str, command: str, exit_code: int) -> dict:
    """The ``error`` of a failed ``--json`` command's envelope (:func:`json_envelope` checks the envelope)."""
    return json_envelope(stdout, command, exit_code)["error"]


def store_artifacts(home: Path) -> list[Path]:
    """Every published artifact folder under ``home`` (name/revision with a manifest)."""
    return sorted(p.parent for p in home.glob("*/*/manifest.json"))


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory) -> Path:
    d = make_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny-llama")
    for p in d.iterdir():
        p.chmod(0o444)
    return d


@pytest.fixture(scope="session")
def tiny_sharded_dir(tmp_path_factory) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp("tiny-sharded") / "tiny-sharded", shards=2)


def load_json(p: Path):
    return json.loads(Path(p).read_text())


@pytest.fixture(scope="session")
def tiny128(tmp_path_factory) -> Path:
    """The tiny Llama with hidden 128 / intermediate 256, so that quantization groups of 128 fit."""
    d = make_tiny_llama(tmp_path_factory.mktemp("tiny128") / "tiny128", hidden=128, intermediate=256)
    for p in d.iterdir():
        p.chmod(0o444)
    return d


@pytest.fixture(scope="session")
def quantized(tiny128, tmp_path_factory):
    """Every quantization scheme applied once to ``tiny128`` (8 calibration samples of 64 tokens):
    scheme -> pipeline.quantize.QuantizeResult."""
    from modelyard.stages import quantize as q

    root = tmp_path_factory.mktemp("quantized")
    return {s: q.quantize_model(tiny128, root / s, s, num_samples=8, max_seq_len=64) for s in q.SCHEMES}


@pytest.fixture(scope="session")
def legacy_quantized(tiny128, tmp_path_factory):
    """The legacy formats (gptq via gptqmodel, awq-gemm via autoawq), each made once from ``tiny128``
    in its own venv: scheme -> QuantizeResult."""
    from modelyard.stages import quantize as q

    root = tmp_path_factory.mktemp("legacy")
    return {s: q.quantize_model(tiny128, root / s, s, num_samples=8, max_seq_len=64) for s in q.LEGACY_SCHEMES}
