"""Disk full: ingest, bundle and unbundle into a real 8 MiB tmpfs made by the test fail
with a clear error (exit code, the path, "No space left on device", a fix) and leave nothing partial.

Mounting a tmpfs needs root (CAP_SYS_ADMIN), which this project's machines and CI have."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import json_error, run_cli
from tests.fixtures import make_tiny_llama
from tests.unit.test_bundle import _build_artifact

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    """About 30 MB of weights: more than the 8 MiB filesystem holds."""
    return make_tiny_llama(tmp_path_factory.mktemp("big") / "m", layers=4, hidden=512, intermediate=2048,
                           max_shard_size="8MB")


def _leftovers(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def test_ingest_into_a_full_store_fails_cleanly(model, small_fs):
    home = small_fs / "store"
    r = run_cli("ingest", f"file://{model}", "--no-smoke", "--out", str(home))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "No space left on device" in r.stderr and "Traceback" not in r.stderr
    assert "fix: Free disk space under MODELYARD_HOME." in r.stderr
    # Nothing published, no staging left; only the (small, complete) digest-cache entries may remain.
    assert [p for p in home.iterdir() if not p.name.startswith(".")] == []
    assert list((home / ".staging").iterdir()) == []
    assert [f for f in _leftovers(home) if not f.startswith((".cache/digests/", ".locks/"))] == []


def test_bundle_and_unbundle_on_a_full_disk_leave_nothing(model, small_fs, tmp_path):
    art = _build_artifact(model, tmp_path / "store", hub=False)
    out = small_fs / "bundles"
    out.mkdir()
    r = run_cli("bundle", str(art), "-o", str(out / "m.tar.zst"), "--level", "1")
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    assert "No space left on device" in r.stderr, r.stderr
    assert os.listdir(out) == []  # no half-written bundle, no temp file
    ok = tmp_path / "m.tar.zst"
    assert run_cli("bundle", str(art), "-o", str(ok), "--level", "1").returncode == 0
    r = run_cli("unbundle", str(ok), "--into", str(small_fs / "art"), "--json")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stdout + r.stderr
    err = json_error(r.stdout, "unbundle", 2)
    assert err["type"] == "StoreError" and "No space left on device" in err["message"]
    assert [n for n in os.listdir(small_fs) if "art" in n] == []  # no partial extraction, no temp folder
