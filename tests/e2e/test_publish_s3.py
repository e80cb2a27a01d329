"""S3 publish against a real moto_server on 127.0.0.1: put → get bit-identical,
manifest.json last (an interrupted publish leaves no manifest.json and cannot be pulled), sha256
metadata on every object, multipart for big files, a tampered object fails the pull naming the file."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from modelyard.errors import HashMismatchError, PublishError
from modelyard.settings import Settings
from modelyard.transport import s3 as s3mod
from modelyard.transport.s3 import publish_s3, pull_s3
from tests.conftest import json_result, run_cli
from tests.e2e.publish_servers import AWS_ENV
from tests.unit.test_bundle import _build_artifact

pytestmark = pytest.mark.publish  # needs Debian docker-registry and moto_server: `make test` installs both


@pytest.fixture(scope="module")
def settings(s3_endpoint) -> Settings:
    return Settings(s3_endpoint_url=s3_endpoint)


@pytest.fixture(scope="module")
def artifact(tiny_llama_dir, tmp_path_factory) -> Path:
    return _build_artifact(tiny_llama_dir, tmp_path_factory.mktemp("store"), hub=True)


def _tree(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _keys(client, prefix: str) -> list[str]:  # noqa: ANN001
    r = client.list_objects_v2(Bucket="models", Prefix=prefix + "/")
    return sorted(o["Key"][len(prefix) + 1:] for o in r.get("Contents", []))


def test_round_trip_bit_identical(artifact, settings, client, tmp_path):
    res = publish_s3(artifact, "s3://models/tiny/v1", settings=settings)
    assert res.uri == "s3://models/tiny/v1"
    assert _keys(client, "tiny/v1") == sorted([*_tree(artifact), "bundle.json"])
    pulled = pull_s3("s3://models/tiny/v1", tmp_path / "pulled", settings=settings)
    assert _tree(pulled.path) == _tree(artifact)  # bundle.json stays remote
    assert pulled.content_digest == json.loads((artifact / "manifest.json").read_text())["content_digest"]
    # every object carries its sha256 (= manifest.json's for model/ files)
    manifest = json.loads((artifact / "manifest.json").read_text())
    for f in manifest["files"]:
        head = client.head_object(Bucket="models", Key=f"tiny/v1/{f['path']}")
        assert head["Metadata"]["sha256"] == f["sha256"]


def test_manifest_written_last(artifact, settings, client, tmp_path, monkeypatch):
    """Interrupt the publish after 3 files: those 3 are there, manifest.json is not, and pull refuses."""
    calls = []
    real = s3mod._put_one

    def flaky(*a, **kw):  # noqa: ANN002, ANN003, ANN202
        if len(calls) == 3:
            raise PublishError("simulated network failure", fix="retry")
        calls.append(a[2])
        return real(*a, **kw)

    monkeypatch.setattr(s3mod, "_put_one", flaky)
    with pytest.raises(PublishError, match="simulated"):
        publish_s3(artifact, "s3://models/tiny/interrupted", settings=settings)
    keys = _keys(client, "tiny/interrupted")
    assert len(keys) == 3 and "manifest.json" not in keys and "bundle.json" not in keys
    with pytest.raises(PublishError, match="has no manifest.json"):
        pull_s3("s3://models/tiny/interrupted", tmp_path / "out", settings=settings)
    assert not (tmp_path / "out").exists()
    monkeypatch.setattr(s3mod, "_put_one", real)
    publish_s3(artifact, "s3://models/tiny/interrupted", settings=settings)  # a retry completes it
    assert _tree(pull_s3("s3://models/tiny/interrupted", tmp_path / "out", settings=settings).path) == _tree(artifact)


def test_tampered_object_fails_pull_naming_file(artifact, settings, client, tmp_path):
    publish_s3(artifact, "s3://models/tiny/tamper", settings=settings)
    body = client.get_object(Bucket="models", Key="tiny/tamper/model/model.safetensors")["Body"].read()
    evil = bytearray(body)
    evil[-1] ^= 0xFF  # same size, one byte flipped
    client.put_object(Bucket="models", Key="tiny/tamper/model/model.safetensors", Body=bytes(evil))
    with pytest.raises(HashMismatchError, match="model/model.safetensors") as ei:
        pull_s3("s3://models/tiny/tamper", tmp_path / "out", settings=settings)
    assert ei.value.exit_code == 1 and "sha256" in ei.value.message
    assert list(tmp_path.iterdir()) == []
    r = run_cli("pull", "s3://models/tiny/tamper", "--into", str(tmp_path / "cli"),
                env={"MODELYARD_S3_ENDPOINT_URL": settings.s3_endpoint_url, **AWS_ENV})
    assert r.returncode == 1 and "model/model.safetensors" in r.stderr and "Traceback" not in r.stderr


def test_tampered_report_fails_too(artifact, settings, client, tmp_path):
    """Files outside manifest.json are checked against bundle.json, which manifest.json's sha256 binds."""
    publish_s3(artifact, "s3://models/tiny/tamper2", settings=settings)
    client.put_object(Bucket="models", Key="tiny/tamper2/report.md", Body=b"# all good, trust me\n")
    with pytest.raises(HashMismatchError, match="report.md"):
        pull_s3("s3://models/tiny/tamper2", tmp_path / "out", settings=settings)


def test_multipart_upload_for_big_files(artifact, settings, client, tmp_path):
    copy = tmp_path / "art"
    shutil.copytree(artifact, copy)
    (copy / "serve" / "big.bin").write_bytes(os.urandom(11 * 1024 * 1024 + 17))  # 3 parts of 5 MiB
    # what a killed publish of another version of the file left: two unfinished uploads of its key
    stale = [client.create_multipart_upload(Bucket="models", Key="tiny/big/serve/big.bin")["UploadId"] for _ in range(2)]
    client.upload_part(Bucket="models", Key="tiny/big/serve/big.bin", UploadId=stale[0], PartNumber=1,
                       Body=os.urandom(5 * 1024 * 1024))
    res = publish_s3(copy, "s3://models/tiny/big", settings=settings, multipart_threshold=5 * 1024 * 1024)
    assert client.list_multipart_uploads(Bucket="models", Prefix="tiny/big/").get("Uploads", []) == []
    head = client.head_object(Bucket="models", Key="tiny/big/serve/big.bin")
    assert head["ETag"].strip('"').endswith("-3")  # a multipart object
    assert head["Metadata"]["sha256"] == hashlib.sha256((copy / "serve" / "big.bin").read_bytes()).hexdigest()
    assert _tree(pull_s3(res.uri, tmp_path / "out", settings=settings).path) == _tree(copy)


def test_refuses_overwriting_another_artifact(artifact, settings, tmp_path, tiny_sharded_dir):
    other = _build_artifact(tiny_sharded_dir, tmp_path / "store2", hub=False)
    publish_s3(artifact, "s3://models/tiny/taken", settings=settings)
    with pytest.raises(PublishError, match="already holds another artifact"):
        publish_s3(other, "s3://models/tiny/taken", settings=settings)
    publish_s3(artifact, "s3://models/tiny/taken", settings=settings)  # the same one again: fine


def test_cli_publish_pull(artifact, settings, tmp_path):
    env = {"MODELYARD_S3_ENDPOINT_URL": settings.s3_endpoint_url, **AWS_ENV}
    r = run_cli("publish", str(artifact), "--to", "s3://models/tiny/cli", "--json", env=env)
    assert r.returncode == 0, r.stderr
    assert json_result(r.stdout, "publish")["uri"] == "s3://models/tiny/cli"
    r = run_cli("pull", "s3://models/tiny/cli", "--into", str(tmp_path / "p"), env=env)
    assert r.returncode == 0, r.stderr
    assert _tree(tmp_path / "p") == _tree(artifact)
    r = run_cli("pull", "s3://models/nothing/here", "--into", str(tmp_path / "q"), env=env)
    assert r.returncode == 2 and "has no manifest.json" in r.stderr
    r = run_cli("publish", str(artifact), "--to", "s3://no-such-bucket/x", env=env)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "testing" not in r.stderr
