"""Promotion gates: the evidence a promote run checks before it asks a human (no Prefect server: the
task's function is called directly)."""

from __future__ import annotations

import json

import pytest

from modelyard.errors import PromotionGateError
from modelyard.flows.promote import check_gates

PASSED = {"passed": True, "errors": 0, "warnings": 1, "report_sha256": "ab" * 32}


def _artifact(tmp_path, smoke):
    d = tmp_path / "a"
    d.mkdir()
    (d / "manifest.json").write_text(json.dumps({"content_digest": "sha256:" + "cd" * 32, "verification": PASSED,
                                                 "smoke": smoke}))
    return d


def test_an_artifact_without_smoke_is_refused_unless_no_smoke_is_required(tmp_path):
    art = _artifact(tmp_path, None)
    with pytest.raises(PromotionGateError) as info:
        check_gates.fn(art)
    assert info.value.message == f"{art}: no vLLM smoke evidence at level load (it was stored without a smoke test)"
    assert info.value.fix == ("Ingest it again with --smoke load, or promote with --no-smoke-required "
                              "to accept it without that evidence.")
    assert check_gates.fn(art, None).to_dict() == {"report_sha256": "ab" * 32, "content_digest": "sha256:" + "cd" * 32,
                                         "verification": {"passed": True, "errors": 0, "warnings": 1}, "smoke": None}


@pytest.mark.parametrize(("have", "need", "ok"), [
    ("load", "load", True), ("server", "load", True), ("bench", "server", True),
    ("load", "server", False), ("server", "bench", False),
])
def test_the_stored_smoke_must_reach_the_required_level(tmp_path, have, need, ok):
    art = _artifact(tmp_path, {"passed": True, "level": have, "vllm_version": "0.32.0"})
    if ok:
        assert check_gates.fn(art, need).smoke == {"passed": True, "level": have, "vllm_version": "0.32.0"}
    else:
        with pytest.raises(PromotionGateError) as info:
            check_gates.fn(art, need)
        assert info.value.message == f"{art}: no vLLM smoke evidence at level {need} (its smoke ran at level {have})"
