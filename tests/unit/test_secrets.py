"""Secrets: a canary hub token must never reach stdout, stderr, the store (manifest,
reports, serve files), Prefect's own database and logs, or exception text."""

from __future__ import annotations

import base64
import secrets
from pathlib import Path

import pytest

from modelyard.errors import SECRET_ENV, PublishError, redact
from tests.conftest import run_cli

CANARY = f"hf_CANARY{secrets.token_hex(12)}"


def _env(tmp_path: Path, **extra: str) -> dict[str, str | None]:
    """The canary token, and a Prefect of the command's own: no session server (``PREFECT_API_URL`` dropped),
    so that Prefect's database and logs land under ``tmp_path/prefect`` where the test reads them."""
    return {"HF_TOKEN": CANARY, "MODELYARD_HF_TOKEN": CANARY, "PREFECT_HOME": str(tmp_path / "prefect"),
            "PREFECT_API_URL": None, "MODELYARD_HOME": str(tmp_path / "store"), **extra}


def _assert_nowhere(tmp_path: Path, *outputs: str) -> int:
    for text in outputs:
        assert CANARY not in text
    seen = 0
    for f in tmp_path.rglob("*"):
        if f.is_file() and not f.is_symlink():
            seen += 1
            assert CANARY.encode() not in f.read_bytes(), f
    return seen


def test_canary_token_not_in_ingest_outputs_store_or_prefect_db(tiny_llama_dir, tmp_path):
    r = run_cli("ingest", f"file://{tiny_llama_dir}", "--no-smoke", "--json", "-v", env=_env(tmp_path))
    assert r.returncode == 0, r.stderr[-2000:]
    files = _assert_nowhere(tmp_path, r.stdout, r.stderr)
    assert (tmp_path / "store").is_dir() and files >= 8  # manifest, reports, serve/, model/, Prefect's database
    assert list((tmp_path / "prefect").rglob("*.db")), "Prefect's database was searched"


def test_canary_token_not_in_endpoint_errors(tmp_path):
    r = run_cli("ingest", "hf://org/name@main", "--no-smoke", "-v",
                env=_env(tmp_path, MODELYARD_HF_ENDPOINT="http://127.0.0.1:9"))
    assert r.returncode != 0 and "127.0.0.1:9" in r.stderr
    _assert_nowhere(tmp_path, r.stdout, r.stderr)


def test_canary_token_not_in_verify_output(tiny_llama_dir, tmp_path):
    r = run_cli("verify", str(tiny_llama_dir), "--json", "-v", env=_env(tmp_path))
    assert r.returncode == 0, r.stderr[-2000:]
    _assert_nowhere(tmp_path, r.stdout, r.stderr)


def test_endpoint_error_text_has_no_token(monkeypatch, tmp_path):
    from modelyard.errors import ModelyardError
    from modelyard.model.source import parse_source
    from modelyard.settings import Settings
    from modelyard.stages.fetch import fetch

    monkeypatch.setenv("MODELYARD_HF_TOKEN", CANARY)
    settings = Settings(home=tmp_path, hf_endpoint="http://127.0.0.1:9")
    assert CANARY not in repr(settings) and CANARY not in str(settings.model_dump())
    with pytest.raises(ModelyardError) as e:
        fetch(parse_source("hf://org/name@main"), settings)
    assert CANARY not in str(e.value) and CANARY not in repr(e.value) and CANARY not in str(e.value.fix)


@pytest.mark.parametrize(("text", "expected"), [
    ('HTTP 401 ({"Authorization": ["Basic YWxpY2U6czNjcjN0LXB3"]})', 'HTTP 401 ({"Authorization": ["[redacted]"]})'),
    ("proxy-authorization=Bearer abc.def.ghi, next", "proxy-authorization=[redacted], next"),
    ("sent Bearer eyJhbGciOiJIUzI1NiJ9.e30 twice", "sent Bearer [redacted] twice"),
    ("token hf_abcdefghijklmnopqrstuvwxyz123 refused", "token hf_[redacted] refused"),
    ("GET https://bob:pa55@host/v2/ failed", "GET https://bob:[redacted]@host/v2/ failed"),
    # what must stay: ports and digests, prose that names the schemes, a failed authorization
    ("oci://127.0.0.1:5000/org/m@sha256:abc", "oci://127.0.0.1:5000/org/m@sha256:abc"),
    ("requires a login (HTTP basic auth)", "requires a login (HTTP basic auth)"),
    ("Authorization failed: check the login", "Authorization failed: check the login"),
    ("basic integrity checks", "basic integrity checks"),
])
def test_redact_patterns(text, expected, monkeypatch):
    for name in (*SECRET_ENV, "MODELYARD_REGISTRY_USER"):
        monkeypatch.delenv(name, raising=False)
    assert redact(text) == expected


def test_redact_the_process_secrets_and_every_error_message(monkeypatch):
    monkeypatch.setenv("MODELYARD_REGISTRY_USER", "alice")
    monkeypatch.setenv("MODELYARD_REGISTRY_PASSWORD", "s3cr3t-pw")
    monkeypatch.setenv("HF_TOKEN", "tok-0123456789")
    basic = base64.b64encode(b"alice:s3cr3t-pw").decode()
    assert redact(f"the pw s3cr3t-pw, token tok-0123456789, credential {basic}.") == (
        "the pw [redacted], token [redacted], credential [redacted].")
    err = PublishError(f"registry said: s3cr3t-pw {basic}", fix="not tok-0123456789")
    assert (err.message, err.fix, str(err)) == ("registry said: [redacted] [redacted]", "not [redacted]",
                                                "registry said: [redacted] [redacted] Fix: not [redacted]")
