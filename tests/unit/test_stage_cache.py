"""Stage cache keys: equal inputs give equal keys; any input, the code or a library
version changes the key; the verify listing sees stray files but not times."""

from __future__ import annotations

import os

from modelyard.stages import cache as stage_cache
from modelyard.stages.verify import listing_digest


def test_stage_key_is_stable_and_input_sensitive(monkeypatch):
    a = stage_cache.stage_key("verify", tree="t1", target={"tensor_parallel_size": 1})
    assert a == stage_cache.stage_key("verify", target={"tensor_parallel_size": 1}, tree="t1")
    assert a.startswith("modelyard-verify-") and len(a) == len("modelyard-verify-") + 64
    assert a != stage_cache.stage_key("verify", tree="t2", target={"tensor_parallel_size": 1})
    assert a != stage_cache.stage_key("verify", tree="t1", target={"tensor_parallel_size": 2})
    assert a != stage_cache.stage_key("fetch", tree="t1", target={"tensor_parallel_size": 1})
    monkeypatch.setattr(stage_cache, "library_versions", lambda: {"transformers": "0.0"})
    assert a != stage_cache.stage_key("verify", tree="t1", target={"tensor_parallel_size": 1})
    monkeypatch.undo()
    monkeypatch.setattr(stage_cache, "code_digest", lambda: "0" * 64)
    assert a != stage_cache.stage_key("verify", tree="t1", target={"tensor_parallel_size": 1})


def test_code_digest_covers_the_package():
    d = stage_cache.code_digest()
    assert len(d) == 64 and d == stage_cache.code_digest()
    assert set(stage_cache.library_versions()) == set(stage_cache.LIBRARIES)


def test_listing_digest_sees_stray_files_not_times(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "sub").mkdir()
    first = listing_digest(tmp_path)
    os.utime(tmp_path / "config.json", (1, 1))
    assert listing_digest(tmp_path) == first
    (tmp_path / "pytorch_model.bin").write_bytes(b"x")
    assert listing_digest(tmp_path) != first
    (tmp_path / "pytorch_model.bin").unlink()
    assert listing_digest(tmp_path) == first
    (tmp_path / "config.json").write_text("{ }")  # size changed
    assert listing_digest(tmp_path) != first
    assert listing_digest(tmp_path / "missing") == listing_digest(tmp_path / "missing2")
