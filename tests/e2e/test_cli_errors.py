"""Issue #2 point 11: bad inputs give one clear line, exit code 2, no traceback, nothing published."""

from __future__ import annotations

import socket

import pytest

from tests.conftest import json_error, json_result, run_cli, store_artifacts

pytestmark = pytest.mark.e2e


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _assert_clean(r, tmp_path, line: str):
    assert r.returncode == 2, r.stdout + r.stderr
    assert line in r.stderr
    assert "Traceback" not in r.stdout + r.stderr
    assert store_artifacts(tmp_path / "store") == []


def test_missing_source(tmp_path):
    r = run_cli("ingest", f"file://{tmp_path}/nope", "--out", str(tmp_path / "store"))
    _assert_clean(r, tmp_path, f"error[source_not_found]: source folder {tmp_path}/nope does not exist")


def test_folder_without_config(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    (d / "model.safetensors").write_bytes(b"\0" * 16)
    r = run_cli("ingest", f"file://{d}", "--out", str(tmp_path / "store"))
    _assert_clean(r, tmp_path, f"error[missing_config]: folder {d} has no config.json")


def test_pickle_only_folder(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text("{}")
    (d / "pytorch_model.bin").write_bytes(b"\x80\x02}q\x00.")
    r = run_cli("ingest", f"file://{d}", "--out", str(tmp_path / "store"))
    _assert_clean(r, tmp_path, "has only pickle weights (pytorch_model.bin); modelyard never unpickles")


def test_unreachable_endpoint_json(tmp_path):
    port = _closed_port()
    r = run_cli("ingest", "hf://org/tiny@main", "--json", "--out", str(tmp_path / "store"),
                env={"HF_ENDPOINT": f"http://127.0.0.1:{port}", "HF_TOKEN": "hf_canary_never_print_me"})
    assert r.returncode == 2
    assert json_error(r.stdout, "ingest", 2) == {
        "type": "EndpointUnreachableError", "code": "endpoint_unreachable",
        "message": f"cannot reach the hub endpoint http://127.0.0.1:{port} (ConnectError)",
        "fix": "Check HF_ENDPOINT / MODELYARD_HF_ENDPOINT and the network."}
    assert "hf_canary_never_print_me" not in r.stdout + r.stderr
    assert store_artifacts(tmp_path / "store") == []


def test_verify_exit_codes(tmp_path, tiny_llama_dir):
    assert run_cli("verify", str(tmp_path / "nope")).returncode == 2
    ok = run_cli("verify", str(tiny_llama_dir), "--json")
    assert ok.returncode == 0
    assert json_result(ok.stdout, "verify")["summary"] == {"errors": 0, "warnings": 0, "infos": 0, "not_judged": 0, "passed": True}


def test_ingest_local_folder_without_smoke(tmp_path, tiny_llama_dir):
    r = run_cli("ingest", f"file://{tiny_llama_dir}", "--no-smoke", "--json", "--out", str(tmp_path / "store"))
    assert r.returncode == 0, r.stderr
    out = json_result(r.stdout, "ingest")
    assert out["name"] == "tiny-llama" and out["revision"] == "sha256-" + out["content_digest"][7:19]
    assert [p.name for p in store_artifacts(tmp_path / "store")] == [out["revision"]]
    assert sorted(p.name for p in tiny_llama_dir.iterdir()) == ["chat_template.jinja", "config.json",
                                                               "generation_config.json", "model.safetensors",
                                                               "tokenizer.json", "tokenizer_config.json"]
