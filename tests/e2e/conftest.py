"""Session fixtures shared by the e2e tests: one demo run (GGUF conversion + vLLM smoke) per session."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_cli


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory):
    """``(store home, ingest JSON)`` of `modelyard demo` into a fresh store."""
    home = tmp_path_factory.mktemp("demo-store")
    r = run_cli("demo", "--json", "--out", str(home), timeout=1500)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return home, json.loads(r.stdout)
