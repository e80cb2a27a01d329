import json

import pytest

from modelyard.artifact.store import Store
from modelyard.errors import ArtifactConflictError


def _stage(store, content: str, digest: str):
    s = store.new_staging()
    (s / "model").mkdir()
    (s / "model" / "config.json").write_text(content)
    (s / "manifest.json").write_text(json.dumps({"content_digest": digest}))
    return s


def test_publish_is_atomic_idempotent_and_refuses_conflicts(tmp_path):
    store = Store(tmp_path)
    a = store.publish(_stage(store, "{}", "sha256:aa"), "m", "r1", "sha256:aa")
    assert a.path == tmp_path / "m" / "r1" and not a.reused
    assert (a.path / "model" / "config.json").read_text() == "{}"
    again = store.publish(_stage(store, "{}", "sha256:aa"), "m", "r1", "sha256:aa")
    assert again.reused and again.path == a.path
    with pytest.raises(ArtifactConflictError) as ei:
        store.publish(_stage(store, "{1}", "sha256:bb"), "m", "r1", "sha256:bb")
    assert "already holds m@r1 with different content (sha256:aa != sha256:bb)" in str(ei.value)
    assert (a.path / "model" / "config.json").read_text() == "{}"
    assert list((tmp_path / ".staging").iterdir()) == []
