"""The watch state file is read and written as a typed record: what a decision records, and what an unreadable
file reads as."""

from __future__ import annotations

import json

from modelyard.flows import watch
from modelyard.flows.watch import Decision, WatchEntry, WatchState, read_state


def test_a_missing_or_broken_state_reads_as_empty(tmp_path):
    assert read_state(tmp_path, "org/m") == WatchState()
    watch.state_path(tmp_path, "org/m").parent.mkdir(parents=True)
    watch.state_path(tmp_path, "org/m").write_text("{not json")
    assert read_state(tmp_path, "org/m") == WatchState()


def test_decisions_are_recorded_and_read_back(tmp_path, monkeypatch):
    monkeypatch.setattr(watch, "_now", lambda: "2026-12-07T12:00:00+00:00")
    entry = WatchEntry(repo="org/m", revision="main")
    files = {"model.safetensors": {"size": 8, "sha256": "ab" * 32}}
    watch._record(tmp_path, entry, read_state(tmp_path, "org/m"),
                  Decision(repo="org/m", revision="main", commit="c1", action="ingested", reason="first ingest of this repo",
                           changed=("model.safetensors",), artifact="/store/m/c1"), files=files)
    watch._record(tmp_path, entry, read_state(tmp_path, "org/m"),
                  Decision(repo="org/m", revision="main", commit=None, previous="c1", action="failed", reason="hub: gone"))
    doc = json.loads(watch.state_path(tmp_path, "org/m").read_text())
    assert doc == {
        "repo": "org/m", "revision": "main",
        "last_ingested": {"commit": "c1", "at": "2026-12-07T12:00:00+00:00", "artifact": "/store/m/c1", "files": files},
        "last_seen": {"commit": "c1", "at": "2026-12-07T12:00:00+00:00", "action": "ingested"},
        "history": [
            {"at": "2026-12-07T12:00:00+00:00", "revision": "main", "commit": "c1", "action": "ingested",
             "reason": "first ingest of this repo", "changed": ["model.safetensors"], "artifact": "/store/m/c1",
             "previous": None},
            {"at": "2026-12-07T12:00:00+00:00", "revision": "main", "commit": None, "action": "failed",
             "reason": "hub: gone", "changed": [], "artifact": None, "previous": "c1"},
        ]}
    state = read_state(tmp_path, "org/m")
    assert (state.last_ingested.files, state.last_seen.action, len(state.history)) == (files, "ingested", 2)


def test_a_first_failure_records_no_last_seen(tmp_path):
    watch._record(tmp_path, WatchEntry(repo="org/gone", revision="main"), WatchState(),
                  Decision(repo="org/gone", revision="main", commit=None, action="failed", reason="hub: not found"))
    doc = json.loads(watch.state_path(tmp_path, "org/gone").read_text())
    assert (sorted(doc), [h["action"] for h in doc["history"]]) == (["history", "repo", "revision"], ["failed"])
