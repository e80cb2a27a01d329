"""The warm facts worker (modelyard/checks/facts_worker.py, the client; modelyard/runtime/facts_server.py, the process): a real worker process answers verify's
transformers questions, the command then imports neither torch nor transformers, and the answers are
the ones the command computes itself (same report, same facts cache entry)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from modelyard.checks import facts_worker
from modelyard.runtime import facts_server
from tests.conftest import ROOT


def _verify(folder: str, cache: Path, cwd: Path = ROOT, **env: str) -> tuple[subprocess.CompletedProcess, set[str]]:
    """``python -X importtime -m modelyard verify FOLDER --json``: the process and the top-level modules it imported."""
    e = {k: v for k, v in os.environ.items() if k != facts_worker.ENV}
    e.update(PYTHONPATH=str(ROOT), MODELYARD_FACTS_CACHE=str(cache), MODELYARD_VERIFY_RUNTIME="none", **env)
    p = subprocess.run([sys.executable, "-X", "importtime", "-m", "modelyard", "verify", folder, "--json"],
                       capture_output=True, text=True, cwd=cwd, env=e, timeout=300)
    mods = {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in p.stderr.splitlines()
            if line.startswith("import time:")}
    return p, mods


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    """A real worker, a child of this test process, ready to answer."""
    sock = str(tmp_path_factory.mktemp("fw") / "facts.sock")
    proc = facts_server.spawn(sock, with_parent=True)
    try:
        assert facts_worker.wait_ready(sock, 120), "the facts worker did not become ready"
        yield sock
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert not Path(sock).exists()  # it removes its socket on SIGTERM


def _entry(cache: Path) -> dict:
    (entry,) = cache.glob("*.json")
    return json.loads(entry.read_text())


def test_verify_asks_the_worker_and_says_what_it_would_have_computed(tmp_path, tiny_llama_dir, worker):
    local, mods = _verify(str(tiny_llama_dir), tmp_path / "local")
    assert local.returncode == 0, local.stderr[-2000:]
    assert {"torch", "transformers"} <= mods
    warm, mods = _verify(str(tiny_llama_dir), tmp_path / "warm", MODELYARD_FACTS_WORKER=worker)
    assert warm.returncode == 0, warm.stderr[-2000:]
    assert "torch" not in mods and "transformers" not in mods and "tokenizers" not in mods
    assert warm.stdout == local.stdout  # the same report, byte for byte
    assert _entry(tmp_path / "warm") == _entry(tmp_path / "local")  # the same answers, cached the same way


def test_paths_in_answers_are_the_callers_own_even_relative(tmp_path, tiny_llama_dir, worker):
    """An error message names the folder as the user wrote it (here relative to the command's cwd),
    although the worker, in another cwd, read it by its absolute path."""
    d = tmp_path / "m"
    d.mkdir()
    for f in tiny_llama_dir.iterdir():
        (d / f.name).write_bytes(f.read_bytes())
    (d / "tokenizer.json").unlink()
    (d / "tokenizer.model").write_bytes(b"not a sentencepiece model\n" * 10)
    local, _ = _verify("m", tmp_path / "local", cwd=tmp_path)
    warm, mods = _verify("m", tmp_path / "warm", cwd=tmp_path, MODELYARD_FACTS_WORKER=worker)
    assert "transformers" not in mods
    msg = {f["code"]: f["message"] for f in json.loads(warm.stdout)["result"]["findings"]}["tokenizer.load_failed"]
    assert msg == ("transformers cannot build the tokenizer: ValueError: Error parsing line "
                   "b'not a sentencepiece model' in m/tokenizer.model")
    assert warm.stdout == local.stdout


def _raw(sock: str, req: dict) -> dict:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(60)
        s.connect(sock)
        s.sendall(json.dumps(req).encode() + b"\n")
        return json.loads(facts_worker.read_line(s))


def test_a_worker_refuses_other_code_and_unknown_questions(tmp_path, tiny_llama_dir, worker):
    from modelyard.checks.hf import LIBRARIES
    from modelyard.version import code_digest, library_versions

    base = {"v": 1, "code": code_digest(), "libraries": library_versions(LIBRARIES), "session": "s",
            "root": str(tiny_llama_dir)}
    assert _raw(worker, {**base, "name": "model_type"}) == {"ok": True, "value": "llama"}
    assert _raw(worker, {**base, "name": "class:LlamaForCausalLM"}) == {"ok": True, "value": True}
    assert _raw(worker, {**base, "code": "0" * 64, "name": "model_type"}) == {
        "ok": False, "error": "stale: this worker runs other modelyard code or other library versions"}
    assert _raw(worker, {**base, "libraries": {**base["libraries"], "transformers": "4.0.0"}, "name": "model_type"})["ok"] is False
    assert _raw(worker, {**base, "name": "exec:rm"}) == {"ok": False, "error": "unknown question 'exec:rm'"}
    assert _raw(worker, {**base, "name": "parameters"}) == {"ok": False, "error": "unknown question 'parameters'"}
    assert _raw(worker, {**base, "v": 2, "name": "model_type"}) == {"ok": False, "error": "protocol 2, this worker speaks 1"}
    assert oct(os.stat(worker).st_mode & 0o777) == "0o600"


def test_without_a_worker_verify_computes_itself(tmp_path, tiny_llama_dir):
    """A socket nobody listens on: the command answers the questions itself."""
    p, mods = _verify(str(tiny_llama_dir), tmp_path / "c", MODELYARD_FACTS_WORKER=str(tmp_path / "none.sock"))
    assert p.returncode == 0, p.stderr[-2000:]
    assert "transformers" in mods
    assert json.loads(p.stdout)["result"]["summary"]["passed"] is True


def test_server_commands_default_to_modelyard_store_when_it_is_a_folder(tmp_path, monkeypatch):
    """The kept server (and its worker) of a store is found under MODELYARD_STORE when that is a folder, as
    ingest and verify read that store; an s3:// store keeps it in MODELYARD_HOME (its local cache)."""
    from typer.testing import CliRunner

    from modelyard.cli import app
    from modelyard.settings import Settings
    from tests.conftest import json_error

    monkeypatch.setenv("MODELYARD_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MODELYARD_STORE", str(tmp_path / "shared-store"))
    assert Settings().local_store() == tmp_path / "shared-store"
    r = CliRunner().invoke(app, ["server", "status", "--json"])
    assert json_error(r.stdout, "server status", 1)["message"] == f"no prefect server running for {tmp_path / 'shared-store'}"
    monkeypatch.setenv("MODELYARD_STORE", "s3://bucket/prefix")
    assert Settings().local_store() == tmp_path / "home"


def test_only_a_socket_folder_modelyard_made_is_removed(tmp_path):
    """``server stop`` removes the worker's socket folder; a path from a hand-edited server.json is not removed."""
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "data").write_text("x")
    facts_server.remove_socket_dir(str(keep / "facts.sock"))
    assert (keep / "data").read_text() == "x"
    sock = facts_server.private_socket()
    assert Path(sock).parent.is_dir() and oct(Path(sock).parent.stat().st_mode & 0o777) == "0o700"
    facts_server.remove_socket_dir(sock)
    assert not Path(sock).parent.exists()
