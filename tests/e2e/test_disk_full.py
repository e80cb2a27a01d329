"""Disk full: ingest into a real 8 MiB tmpfs made by the test fails with a clear error before writing
(exit code 2, the folder, the bytes free and needed, a fix) and leaves nothing partial (bundle, unbundle and
pull: ``tests/e2e/test_pull_resume.py``).

Mounting a tmpfs needs root (CAP_SYS_ADMIN), which this project's machines and CI have."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import json_error, run_cli
from tests.fixtures import make_tiny_llama

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
    r = run_cli("ingest", f"file://{model}", "--no-smoke", "--out", str(home), "--json")
    # refused before the first byte is copied: the folder's copy does not fit the store's filesystem
    err = json_error(r.stdout, "ingest", 2)
    need = sum(p.stat().st_size for p in model.iterdir() if p.is_file())
    m = re.fullmatch(rf"{re.escape(str(home / '.staging'))} has ([0-9,]+) bytes free; this run needs ([0-9,]+) there "
                     r"\(the copy of model/ ([0-9,]+) bytes\)", err["message"])
    assert m is not None, err["message"]
    free, total, copy = (int(g.replace(",", "")) for g in m.groups())
    assert (err["type"], total, copy) == ("InsufficientResourcesError", need, need) and free < need
    assert err["fix"] == (f"Free {need - free:,} bytes on that filesystem, or point MODELYARD_HOME (or --out) at a "
                          "larger one.")
    assert not home.exists()  # nothing was written at all
