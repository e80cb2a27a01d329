import json
from pathlib import Path

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


def test_a_second_promotion_keeps_the_first_in_the_history(tmp_path):
    """A promotion used to replace the target's manifest with the source's plus the new promotion: the
    earlier promotion was lost (and a manifest already promoted twice listed the new one as history)."""
    from modelyard.artifact.manifest import Manifest

    src = Store(tmp_path / "staging")
    art = src.publish(_stage(src, "{}", "sha256:aa"), "m", "r1", "sha256:aa")
    prod = Store(tmp_path / "prod")
    first = prod.promote(art.path, "m", "r1", {"approved_by": "carol"})
    assert first.path == tmp_path / "prod" / "m" / "r1" and first.content_digest == "sha256:aa"
    prod.promote(art.path, "m", "r1", {"approved_by": "bob"})
    prod.promote(art.path, "m", "r1", {"approved_by": "alice"})
    m = json.loads((first.path / "manifest.json").read_text())
    assert m["promotion"] == {"approved_by": "alice"}
    assert m["promotions"] == [{"approved_by": "carol"}, {"approved_by": "bob"}]
    assert "promotion" not in json.loads((art.path / "manifest.json").read_text())  # the source is untouched
    once = Manifest.from_dict({"content_digest": "sha256:aa"}).with_promotion({"by": 1})
    assert once.to_dict() == {"content_digest": "sha256:aa", "promotion": {"by": 1}}
    other = src.publish(_stage(src, "{1}", "sha256:bb"), "m", "r2", "sha256:bb")
    with pytest.raises(ArtifactConflictError) as ei:  # other content under the promoted name and revision
        prod.promote(other.path, "m", "r1", {"approved_by": "eve"})
    assert ei.value.message == (f"the store {tmp_path / 'prod'} already holds m@r1 with different content "
                                "(sha256:aa != sha256:bb)")
    assert json.loads((first.path / "manifest.json").read_text())["promotion"] == {"approved_by": "alice"}


def test_the_store_setting_and_store_flag(tmp_path, monkeypatch):
    """MODELYARD_STORE names the canonical store; --store (Settings.for_store) wins over it, and an s3:// store
    keeps MODELYARD_HOME as the local cache."""
    from modelyard.settings import Settings

    monkeypatch.setenv("MODELYARD_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("MODELYARD_STORE", raising=False)
    assert Settings().store_spec() == str(tmp_path / "cache")
    monkeypatch.setenv("MODELYARD_STORE", "s3://models/yard")
    assert Settings().store_spec() == "s3://models/yard" and Settings().store_dir() == tmp_path / "cache"
    folder = Settings.for_store(str(tmp_path / "other"))
    assert (folder.store_spec(), folder.store_dir()) == (str(tmp_path / "other"), tmp_path / "other")
    remote = Settings.for_store("s3://models/b")
    assert (remote.store_spec(), remote.store_dir()) == ("s3://models/b", tmp_path / "cache")
    assert Settings.for_store(None).store_spec() == "s3://models/yard"


def test_folder_and_object_stores_implement_the_store_protocol_with_its_signatures():
    import inspect

    from modelyard.artifact.store import StoreProtocol
    from modelyard.transport.objectstore import S3Store

    members = [n for n in vars(StoreProtocol) if not n.startswith("_") and n != "home"]
    assert sorted(members) == ["get", "list", "load", "local", "lock", "new_staging", "promote", "publish", "read",
                               "revisions", "sweep_staging", "where"]
    for cls in (Store, S3Store):
        for n in members:
            if n == "where":
                assert isinstance(inspect.getattr_static(cls, n), property)
                continue
            want = list(inspect.signature(getattr(StoreProtocol, n)).parameters)
            assert list(inspect.signature(getattr(cls, n)).parameters) == want, (cls.__name__, n)
    assert isinstance(Store(Path("/nonexistent")), StoreProtocol)


def test_stored_files_are_read_only_and_promotion_shares_no_writable_file(tmp_path):
    """Staging and production hard-linked serve/: editing staging's compose.yaml changed production's."""
    src = Store(tmp_path / "staging")
    staged = _stage(src, "{}", "sha256:aa")
    (staged / "serve").mkdir()
    (staged / "serve" / "compose.yaml").write_text("services: {}\n")
    (staged / "model" / "config.json").chmod(0o444)
    art = src.publish(staged, "m", "r1", "sha256:aa")
    modes = {p.relative_to(art.path).as_posix(): p.stat().st_mode & 0o777 for p in art.path.rglob("*") if p.is_file()}
    assert modes == {"manifest.json": 0o444, "model/config.json": 0o444, "serve/compose.yaml": 0o444}
    prod = Store(tmp_path / "prod").promote(art.path, "m", "r1", {"approved_by": "carol"})
    assert (prod.path / "model/config.json").stat().st_ino == (art.path / "model/config.json").stat().st_ino
    assert (prod.path / "serve/compose.yaml").stat().st_ino != (art.path / "serve/compose.yaml").stat().st_ino
    (art.path / "serve/compose.yaml").chmod(0o644)
    (art.path / "serve/compose.yaml").write_text("services: {evil: {privileged: true}}\n")
    assert (prod.path / "serve/compose.yaml").read_text() == "services: {}\n"
    assert (prod.path / "serve/compose.yaml").stat().st_mode & 0o777 == 0o444
