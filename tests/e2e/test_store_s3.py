"""The object-store store (``MODELYARD_STORE=s3://bucket/prefix``) against a real moto_server on 127.0.0.1:
the conditional put lets one of two writers win, a publish is all or nothing, the reads (list, show,
verify, bundle) work from a fresh local cache, a tampered blob is caught, and two promoters lose no
promotion (compare-and-swap on the manifest's ETag)."""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path

import pytest

from modelyard.artifact.store import Store
from modelyard.errors import ArtifactConflictError, HashMismatchError, PublishError
from modelyard.settings import Settings
from modelyard.transport import objectstore
from modelyard.transport.objectstore import S3Store
from tests.conftest import json_error, json_result, run_cli
from tests.e2e.publish_servers import AWS_ENV
from tests.unit.test_bundle import COMMIT, _build_artifact

pytestmark = pytest.mark.publish  # moto_server comes with the test extra


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir, tmp_path_factory) -> Path:
    """An artifact ``tiny@COMMIT`` of the tiny Llama, and (``other``) another model's under the same name and
    revision: a conflicting writer."""
    return _build_artifact(tiny_llama_dir, tmp_path_factory.mktemp("src-a"), hub=True)


@pytest.fixture(scope="module")
def other(tiny_sharded_dir, tmp_path_factory) -> Path:
    return _build_artifact(tiny_sharded_dir, tmp_path_factory.mktemp("src-b"), hub=True)


def _store(uri: str, cache: Path, s3_settings: Settings) -> S3Store:
    return S3Store(uri, cache, s3_settings)


def _staged(store: S3Store, artifact: Path) -> Path:
    """A private copy of ``artifact`` in ``store``'s staging (what a Draft would commit)."""
    import shutil

    s = store.new_staging()
    shutil.copytree(artifact, s, dirs_exist_ok=True)
    return s


def _keys(client, prefix: str) -> list[str]:  # noqa: ANN001
    out, token = [], None
    while True:
        kw = {"Bucket": "models", "Prefix": prefix + "/", **({"ContinuationToken": token} if token else {})}
        r = client.list_objects_v2(**kw)
        out += [o["Key"][len(prefix) + 1:] for o in r.get("Contents", [])]
        token = r.get("NextContinuationToken")
        if not token:
            return sorted(out)


def _digest(artifact: Path) -> str:
    return json.loads((artifact / "manifest.json").read_text())["content_digest"]


def test_conditional_put_one_of_two_writers_wins(tiny, other, s3_settings, client, tmp_path, monkeypatch):
    """Two workers (two caches) publish tiny@COMMIT with different content at once: both upload their
    blobs, both reach the manifest's conditional put; S3 takes the first, answers 412 to the second,
    which refuses (different content). A third writer with the same content reuses the winner's."""
    uri = "s3://models/race"
    a, b = _store(uri, tmp_path / "cache-a", s3_settings), _store(uri, tmp_path / "cache-b", s3_settings)
    both_uploaded = threading.Barrier(2, timeout=60)
    order: list[str] = []
    real = S3Store._put_manifest

    def put_manifest(self, name, revision, data, index_sha, *, etag):  # noqa: ANN001, ANN202
        both_uploaded.wait()  # neither commits before both have uploaded everything else
        if self is b:
            done.wait(timeout=60)  # a first, deterministically: moto's check-then-put is not atomic, S3's is
        try:
            return real(self, name, revision, data, index_sha, etag=etag)
        finally:
            order.append("a" if self is a else "b")
            done.set()

    done = threading.Event()
    monkeypatch.setattr(S3Store, "_put_manifest", put_manifest)
    results: dict[str, object] = {}

    def run(store: S3Store, artifact: Path, key: str) -> None:
        try:
            results[key] = store.publish(_staged(store, artifact), "tiny", COMMIT, _digest(artifact))
        except Exception as exc:  # noqa: BLE001
            results[key] = exc

    threads = [threading.Thread(target=run, args=(a, tiny, "a")), threading.Thread(target=run, args=(b, other, "b"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert order == ["a", "b"]
    won, lost = results["a"], results["b"]
    assert not isinstance(won, Exception), won
    assert isinstance(lost, ArtifactConflictError), lost
    assert lost.exit_code == 2 and f"({_digest(tiny)} != {_digest(other)})" in lost.message
    # exactly one manifest, byte for byte the winner's; both writers' blobs are there, only the winner's are named
    body = client.get_object(Bucket="models", Key=f"race/artifacts/tiny/{COMMIT}/manifest.json")["Body"].read()
    assert body == (tiny / "manifest.json").read_bytes()
    assert [k for k in _keys(client, "race") if k.startswith("artifacts/")] == [f"artifacts/tiny/{COMMIT}/manifest.json"]
    assert won.uri == f"{uri}/artifacts/tiny/{COMMIT}" and not won.reused
    assert (won.path / "manifest.json").read_bytes() == body  # the winner keeps its copy in its cache
    assert not (tmp_path / "cache-b" / "tiny").exists() and list((tmp_path / "cache-b" / ".staging").iterdir()) == []
    monkeypatch.setattr(S3Store, "_put_manifest", real)
    # the same content again, from a third worker: the conditional put fails, the winner's artifact is reused
    c = _store(uri, tmp_path / "cache-c", s3_settings)
    again = c.publish(_staged(c, tiny), "tiny", COMMIT, _digest(tiny))
    assert again.reused and again.uri == won.uri and again.content_digest == _digest(tiny)


def test_conditional_put_is_what_s3_answers(client):
    """The rule the store relies on, asked of the server directly: a second If-None-Match: * put is refused
    (412), an If-Match with a stale ETag too; the object keeps the first writer's bytes."""
    from botocore.exceptions import ClientError

    first = client.put_object(Bucket="models", Key="cond/manifest.json", Body=b"first", IfNoneMatch="*")
    with pytest.raises(ClientError) as ei:
        client.put_object(Bucket="models", Key="cond/manifest.json", Body=b"second", IfNoneMatch="*")
    assert ei.value.response["Error"]["Code"] == "PreconditionFailed"
    client.put_object(Bucket="models", Key="cond/manifest.json", Body=b"third", IfMatch=first["ETag"])
    with pytest.raises(ClientError) as ei:
        client.put_object(Bucket="models", Key="cond/manifest.json", Body=b"fourth", IfMatch=first["ETag"])
    assert ei.value.response["Error"]["Code"] == "PreconditionFailed"
    assert client.get_object(Bucket="models", Key="cond/manifest.json")["Body"].read() == b"third"


def test_publish_is_all_or_nothing_and_a_retry_reuses_the_blobs(tiny, s3_settings, client, tmp_path, monkeypatch):
    uri = "s3://models/cut"
    store = _store(uri, tmp_path / "cache", s3_settings)
    sent: list[str] = []
    real = S3Store._put_blob

    def flaky(self, f):  # noqa: ANN001, ANN202
        if len(sent) == 3:
            raise PublishError("simulated network failure", fix="retry")
        sent.append(f.rel)
        return real(self, f)

    monkeypatch.setattr(S3Store, "_put_blob", flaky)
    with pytest.raises(PublishError, match="simulated"):
        store.publish(_staged(store, tiny), "tiny", COMMIT, _digest(tiny))
    keys = _keys(client, "cut")
    assert len(keys) == 3 and all(k.startswith("blobs/sha256/") for k in keys)  # blobs only: nothing visible
    assert store.load("tiny", COMMIT) is None and store.list() == [] and store.revisions("tiny") == []
    monkeypatch.setattr(S3Store, "_put_blob", real)
    uploaded: list[bool] = []
    monkeypatch.setattr(S3Store, "_put_blob", lambda self, f: uploaded.append(real(self, f)) or uploaded[-1])
    art = store.publish(_staged(store, tiny), "tiny", COMMIT, _digest(tiny))
    assert uploaded.count(False) == 3  # the killed attempt's blobs are not sent again
    files = {p.relative_to(tiny).as_posix(): p for p in tiny.rglob("*") if p.is_file() and p.name != "manifest.json"}
    assert len(uploaded) == len(files)
    # every file is a blob named by its sha256 (= manifest.json's for model/), carrying it as metadata
    manifest = json.loads((tiny / "manifest.json").read_text())
    for f in manifest["files"]:
        head = client.head_object(Bucket="models", Key=f"cut/blobs/sha256/{f['sha256']}")
        assert head["ContentLength"] == f["size"] and head["Metadata"]["sha256"] == f["sha256"]
    head = client.head_object(Bucket="models", Key=f"cut/artifacts/tiny/{COMMIT}/manifest.json")
    index = client.get_object(Bucket="models", Key=f"cut/blobs/sha256/{head['Metadata']['index-sha256']}")["Body"].read()
    assert json.loads(index)["manifest_sha256"] == hashlib.sha256((tiny / "manifest.json").read_bytes()).hexdigest()
    assert sorted(e["path"] for e in json.loads(index)["files"]) == sorted(p for p in files if not p.startswith("model/"))
    assert art.location == f"{uri}/artifacts/tiny/{COMMIT}"


def test_multipart_blobs(tiny, s3_settings, client, tmp_path):
    import os
    import shutil

    big = tmp_path / "big"
    shutil.copytree(tiny, big)
    (big / "serve" / "big.bin").write_bytes(os.urandom(11 * 1024 * 1024 + 17))  # 3 parts of 5 MiB
    store = S3Store("s3://models/mp", tmp_path / "cache", s3_settings, multipart_threshold=5 * 1024 * 1024)
    store.publish(_staged(store, big), "tiny", COMMIT, _digest(big))
    sha = hashlib.sha256((big / "serve" / "big.bin").read_bytes()).hexdigest()
    head = client.head_object(Bucket="models", Key=f"mp/blobs/sha256/{sha}")
    assert head["ETag"].strip('"').endswith("-3") and head["Metadata"]["sha256"] == sha
    fresh = S3Store("s3://models/mp", tmp_path / "fresh", s3_settings)
    local = fresh.local(fresh.get("tiny", COMMIT))
    assert hashlib.sha256((local / "serve" / "big.bin").read_bytes()).hexdigest() == sha


def test_an_unfinished_blob_upload_is_resumed_and_big_blobs_come_down_in_ranges(tiny, s3_settings, client, tmp_path,
                                                                                 tmp_path_factory):
    """What a killed publish leaves (a multipart upload of the blob with its first part, and a second part whose
    bytes are not the file's) is resumed: only parts 2-9 are sent, the object is whole, nothing is left unfinished;
    a 40 MiB blob comes back down in 16 MiB ranges, hashed whole."""
    import base64
    import os
    import re
    import shutil

    big = tmp_path / "big"
    shutil.copytree(tiny, big)
    data = os.urandom(40 * 1024 * 1024 + 17)
    (big / "serve" / "big.bin").write_bytes(data)
    sha, part = hashlib.sha256(data).hexdigest(), 5 * 1024 * 1024
    key = f"mp2/blobs/sha256/{sha}"
    up = client.create_multipart_upload(Bucket="models", Key=key, Metadata={"sha256": sha}, ChecksumAlgorithm="SHA256")
    for n, body in ((1, data[:part]), (2, os.urandom(part))):
        client.upload_part(Bucket="models", Key=key, UploadId=up["UploadId"], PartNumber=n, Body=body,
                           ChecksumSHA256=base64.b64encode(hashlib.sha256(body).digest()).decode())
    def logged() -> list[str]:  # the key is this test's own (random bytes): every moto log line naming it is ours
        return [line for log in Path(tmp_path_factory.getbasetemp()).rglob("moto.log")
                for line in log.read_text().splitlines() if f"/models/{key}" in line]

    store = S3Store("s3://models/mp2", tmp_path / "cache", s3_settings, multipart_threshold=part)
    store.publish(_staged(store, big), "tiny", COMMIT, _digest(big))
    sent = sorted(int(m[1]) for line in logged() if (m := re.search(r"partNumber=(\d+)", line)))
    assert sent == [1, 2, *range(2, 10)]  # the killed run's parts 1 and 2, then 2-9: part 1 was not sent again
    assert client.list_multipart_uploads(Bucket="models", Prefix=key).get("Uploads", []) == []
    assert client.head_object(Bucket="models", Key=key)["ETag"].strip('"').endswith("-9")
    fresh = S3Store("s3://models/mp2", tmp_path / "fresh", s3_settings)
    local = fresh.local(fresh.get("tiny", COMMIT))
    assert hashlib.sha256((local / "serve" / "big.bin").read_bytes()).hexdigest() == sha
    assert len([line for line in logged() if '"GET /models/' in line and '" 206 ' in line]) == 3
    # ^ ranged GETs: bytes 0-16 MiB, 16-32 MiB, 32 MiB-end


def _env(s3_endpoint: str, cache: Path, **extra: str) -> dict[str, str]:
    return {**AWS_ENV, "MODELYARD_S3_ENDPOINT_URL": s3_endpoint, "MODELYARD_HOME": str(cache), **extra}


def test_ingest_and_reads_through_the_cli(tiny_llama_dir, s3_endpoint, client, tmp_path):
    """ingest --store s3://...; list, show, verify and bundle from fresh caches (MODELYARD_STORE or
    --store); a tampered blob fails verify (exit 1, naming the file) and nothing is cached. (Reuse across
    workers: tests/e2e/test_scale_out.py.)"""
    store = "s3://models/yard"
    r = run_cli("ingest", f"file://{tiny_llama_dir}", "--no-smoke", "--store", store, "--json",
                env=_env(s3_endpoint, tmp_path / "w1"))
    assert r.returncode == 0, r.stderr[-3000:]
    first = json_result(r.stdout, "ingest")
    name, rev = first["name"], first["revision"]
    assert first["artifact"] == f"{store}/artifacts/{name}/{rev}" and first["reused"] is False
    assert (tmp_path / "w1" / name / rev / "manifest.json").is_file()  # the worker's cache keeps what it made
    ls = run_cli("list", "--store", store, "--json", env=_env(s3_endpoint, tmp_path / "reader"))
    assert ls.returncode == 0, ls.stderr
    listed = {(a["name"], a["revision"]): a for a in json_result(ls.stdout, "list")["artifacts"]}
    assert set(listed) == {(name, rev)}
    assert listed[(name, rev)]["path"] == first["artifact"]
    assert listed[(name, rev)]["content_digest"] == first["content_digest"]
    show = run_cli("show", f"{name}@{rev[:14]}", "--json", env=_env(s3_endpoint, tmp_path / "reader", MODELYARD_STORE=store))
    assert show.returncode == 0, show.stderr
    d = json_result(show.stdout, "show")
    assert (d["revision"], d["path"], d["signed"], d["verification"]["passed"]) == (rev, first["artifact"], False, True)
    assert not (tmp_path / "reader").exists() or not (tmp_path / "reader" / name).exists()  # show downloads no weights

    v = run_cli("verify", f"{name}@{rev}", "--store", store, "--json", env=_env(s3_endpoint, tmp_path / "verifier"))
    assert v.returncode == 0, v.stdout[-2000:] + v.stderr[-2000:]
    assert json_result(v.stdout, "verify")["summary"]["passed"] is True
    assert (tmp_path / "verifier" / name / rev / "model" / "model.safetensors").is_file()
    out = tmp_path / "a.tar.zst"
    b = run_cli("bundle", name, "-o", str(out), "--store", store, "--json", env=_env(s3_endpoint, tmp_path / "bundler"))
    assert b.returncode == 0, b.stderr
    assert json_result(b.stdout, "bundle")["content_digest"] == first["content_digest"]
    u = run_cli("unbundle", str(out), "-o", str(tmp_path / "unbundled"))
    assert u.returncode == 0, u.stderr
    assert (tmp_path / "unbundled" / "model" / "model.safetensors").read_bytes() == \
        (tiny_llama_dir / "model.safetensors").read_bytes()

    # the artifact URI ingest printed is what `pull` takes
    p = run_cli("pull", first["artifact"], "-o", str(tmp_path / "pulled"), "--json", env=_env(s3_endpoint, tmp_path / "puller"))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    pulled = json_result(p.stdout, "pull")
    assert (pulled["artifact"], pulled["content_digest"], pulled["signature_verified"]) == (
        str(tmp_path / "pulled"), first["content_digest"], None)
    assert sorted(q.relative_to(tmp_path / "pulled").as_posix() for q in (tmp_path / "pulled").rglob("*") if q.is_file()) \
        == sorted(q.relative_to(tmp_path / "verifier" / name / rev).as_posix()
                  for q in (tmp_path / "verifier" / name / rev).rglob("*") if q.is_file())
    assert pulled["files"] == len([q for q in (tmp_path / "pulled").rglob("*") if q.is_file()])
    keyed = run_cli("pull", first["artifact"], "-o", str(tmp_path / "keyed"), "--key", str(tmp_path / "no.pem"),
                    "--json", env=_env(s3_endpoint, tmp_path / "puller"))
    assert json_error(keyed.stdout, "pull", 1)["message"] == (f"{first['artifact']} is unsigned (no model.sig); --key "
                                                              "asks for a signed artifact, nothing was written")
    assert not (tmp_path / "keyed").exists()

    weights = next(f for f in json.loads((tmp_path / "verifier" / name / rev / "manifest.json").read_text())["files"]
                   if f["path"] == "model/model.safetensors")
    key = f"yard/blobs/sha256/{weights['sha256']}"
    body = client.get_object(Bucket="models", Key=key)["Body"].read()
    client.put_object(Bucket="models", Key=key, Body=body[:-1] + bytes([body[-1] ^ 0xFF]))
    try:
        bad = run_cli("verify", f"{name}@{rev}", "--store", store, env=_env(s3_endpoint, tmp_path / "victim"))
        assert bad.returncode == 1, bad.stdout + bad.stderr
        assert "model/model.safetensors differs from what the artifact records" in bad.stderr
        assert "Traceback" not in bad.stderr and "testing" not in bad.stderr
        assert not (tmp_path / "victim" / name).exists()
        assert list((tmp_path / "victim" / ".staging").iterdir()) == []
    finally:
        client.put_object(Bucket="models", Key=key, Body=body)
    missing = run_cli("verify", f"{name}@nope", "--store", store, env=_env(s3_endpoint, tmp_path / "victim"))
    assert missing.returncode == 2 and f"the store {store} holds no artifact {name}@nope" in missing.stderr


def test_two_promoters_lose_no_promotion(tiny, s3_settings, client, tmp_path, monkeypatch):
    """Promoter 1 reads the target's manifest; promoter 2 promotes meanwhile; promoter 1's If-Match put is
    refused (412), it re-reads and applies its promotion on top: both are in the manifest."""
    uri = "s3://models/prod"
    first = _store(uri, tmp_path / "p0", s3_settings)
    first.promote(tiny, "tiny", COMMIT, {"approved_by": "carol"})
    p1, p2 = _store(uri, tmp_path / "p1", s3_settings), _store(uri, tmp_path / "p2", s3_settings)
    real = S3Store._read_manifest
    reads: list[str] = []

    def read_manifest(self, name, revision):  # noqa: ANN001, ANN202
        got = real(self, name, revision)
        reads.append("p1" if self is p1 else "other")
        if self is p1 and reads.count("p1") == 1:
            p2.promote(tiny, "tiny", COMMIT, {"approved_by": "bob"})  # lands between p1's read and p1's put
        return got

    monkeypatch.setattr(S3Store, "_read_manifest", read_manifest)
    p1.promote(tiny, "tiny", COMMIT, {"approved_by": "alice"})
    assert reads.count("p1") == 2  # its first put was refused, so it read again
    m = json.loads(client.get_object(Bucket="models", Key=f"prod/artifacts/tiny/{COMMIT}/manifest.json")["Body"].read())
    assert m["promotion"] == {"approved_by": "alice"}
    assert m["promotions"] == [{"approved_by": "carol"}, {"approved_by": "bob"}]
    monkeypatch.setattr(S3Store, "_read_manifest", real)
    local = _store(uri, tmp_path / "reader", s3_settings)
    path = local.local(local.get("tiny", COMMIT))  # the promoted manifest is bound by a fresh index
    assert json.loads((path / "manifest.json").read_text())["promotion"] == {"approved_by": "alice"}
    with pytest.raises(ArtifactConflictError):
        _store(uri, tmp_path / "p3", s3_settings).promote(_build_other(tmp_path), "tiny", COMMIT, {"approved_by": "eve"})


def _build_other(tmp_path: Path) -> Path:
    from tests.fixtures import make_tiny_llama

    return _build_artifact(make_tiny_llama(tmp_path / "m2", seed=7), tmp_path / "src-other", hub=True)


def test_tampered_index_is_refused(tiny, s3_settings, client, tmp_path):
    uri = "s3://models/idx"
    store = _store(uri, tmp_path / "cache", s3_settings)
    store.publish(_staged(store, tiny), "tiny", COMMIT, _digest(tiny))
    head = client.head_object(Bucket="models", Key=f"idx/artifacts/tiny/{COMMIT}/manifest.json")
    key = f"idx/blobs/sha256/{head['Metadata']['index-sha256']}"
    index = json.loads(client.get_object(Bucket="models", Key=key)["Body"].read())
    index["files"][0]["sha256"] = "0" * 64
    client.put_object(Bucket="models", Key=key, Body=json.dumps(index).encode())
    fresh = _store(uri, tmp_path / "fresh", s3_settings)
    with pytest.raises(HashMismatchError, match="does not have that sha256"):
        fresh.local(fresh.get("tiny", COMMIT))


def test_open_store_picks_by_scheme(tmp_path, s3_endpoint):
    s = Settings(home=tmp_path / "cache", store="s3://models/x", s3_endpoint_url=s3_endpoint)
    store = objectstore.open_store(settings=s)
    assert isinstance(store, S3Store) and store.where == "s3://models/x" and store.home == tmp_path / "cache"
    folder = objectstore.open_store(str(tmp_path / "f"), settings=s)
    assert type(folder) is Store and folder.home == tmp_path / "f"
    with pytest.raises(PublishError, match="needs a bucket and a prefix"):
        objectstore.open_store("s3://models", settings=s)
