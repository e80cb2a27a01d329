"""Machine-readable progress (MODELYARD_PROGRESS_JSONL)."""

from __future__ import annotations

import json
import threading

from modelyard import progress


def test_events_are_json_lines(tmp_path, monkeypatch):
    log = tmp_path / "p.jsonl"
    monkeypatch.setenv("MODELYARD_PROGRESS_JSONL", str(log))
    with progress.task("hashing (sha256)", total=10) as adv:
        adv(4)
        adv(6)
    ev = [json.loads(x) for x in log.read_text().splitlines()]
    assert [(e["event"], e["task"], e.get("amount")) for e in ev] == [
        ("start", "hashing (sha256)", None), ("advance", "hashing (sha256)", 4), ("advance", "hashing (sha256)", 6),
        ("finish", "hashing (sha256)", None)]
    assert ev[0]["total"] == 10 and ev[0]["unit"] == "B"


def test_reentrant_event_does_not_deadlock(tmp_path, monkeypatch):
    """Regression (found by the crash harness): huggingface_hub's tqdm, garbage-collected while a hashing
    thread was inside _event, closed its progress task from tqdm.__del__ in that same thread and waited
    forever on the non-reentrant lock. The ingest hung at "hashing (sha256)"."""
    monkeypatch.setenv("MODELYARD_PROGRESS_JSONL", str(tmp_path / "p.jsonl"))

    def reenter():
        with progress._jsonl_lock:  # what the outer _event holds when __del__ runs
            with progress.task("Fetching 3 files", total=3):
                pass

    t = threading.Thread(target=reenter, daemon=True)
    t.start()
    t.join(5)
    assert not t.is_alive()
