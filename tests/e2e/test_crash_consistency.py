"""Crash consistency and concurrency, for real: `modelyard ingest` runs as a subprocess and
is SIGKILLed (its whole process group, Prefect's server included) at 20+ points: during start-up, while
hashing, while packaging, while writing the metadata, right after the store rename, and while
publishing to a real OCI registry and a real S3 endpoint. After every kill the store must hold only
complete artifacts, a re-run must complete, and it must leave no temporary files; a remote never
shows a half-published artifact. Kill points are chosen from the run's own progress events
(``MODELYARD_PROGRESS_JSONL``) and from the files it creates, not from timings.

Concurrency: four ingests of the same source and options at once produce one artifact; one builds
it, the three others wait on the store's lock and reuse it.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from modelyard.errors import ModelyardError
from modelyard.settings import Settings
from modelyard.transport.publish import pull
from tests.conftest import ROOT, json_result, run_cli
from tests.e2e.publish_servers import docker_registry, moto_s3
from tests.fixtures import make_tiny_llama
from tests.killing import first_of as _first_of
from tests.killing import kill_at as _kill_at
from tests.killing import nth as _nth

pytestmark = [pytest.mark.e2e, pytest.mark.publish]


@pytest.fixture(autouse=True)
def _no_runtime_oracle(monkeypatch):
    """The kill points are in fetch, hashing, packaging and publishing; the runtime oracle would add ~10 s of
    vLLM import to each of the many ingests here without touching what is tested."""
    monkeypatch.setenv("MODELYARD_VERIFY_RUNTIME", "none")
AWS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    """A ~30 MB tiny Llama in four shards, so hashing and packaging take several progress events."""
    d = make_tiny_llama(tmp_path_factory.mktemp("crash") / "m", layers=4, hidden=512, intermediate=2048,
                        max_shard_size="8MB")
    assert len(list(d.glob("*.safetensors"))) >= 4
    return d


@pytest.fixture(scope="module")
def remotes(tmp_path_factory):
    with docker_registry(tmp_path_factory.mktemp("reg")) as reg, moto_s3(tmp_path_factory.mktemp("moto")) as s3:
        import boto3

        boto3.client("s3", endpoint_url=s3, **{k.lower(): v for k, v in AWS.items() if k != "AWS_DEFAULT_REGION"},
                     region_name="us-east-1").create_bucket(Bucket="models")
        yield reg, s3


def _tree(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _store_is_consistent(home: Path) -> list[Path]:
    """Every artifact folder is complete: its manifest lists model/ files that all exist with their
    sha256. Returns the artifacts."""
    arts = []
    for name in (p for p in home.iterdir() if p.is_dir() and not p.name.startswith(".")) if home.exists() else []:
        for art in name.iterdir():
            m = json.loads((art / "manifest.json").read_text())  # no manifest = a partial artifact: fails here
            for f in m["files"]:
                assert hashlib.sha256((art / f["path"]).read_bytes()).hexdigest() == f["sha256"], (art, f["path"])
            assert (art / "report.json").is_file() and (art / "serve" / "vllm.yaml").is_file()
            arts.append(art)
    return arts


def _during_startup(seconds: float):
    """A kill ``seconds`` after the start, or at the first hashing event when start-up is over sooner (with the
    suite's shared Prefect server an ingest of this model reaches the store rename within 3 s; a kill after it
    would make every later point a reuse)."""
    def hit(events, t):  # noqa: ANN001, ANN202
        if t >= seconds:
            return f"{seconds} s after start"
        if any(e["task"].startswith("hashing") for e in events):
            return f"start-up over before {seconds} s: at the first hashing event"
        return None
    return hit


def _exists(home: Path, pattern: str, label: str):
    return lambda events, t: label if list(home.glob(pattern)) else None


def test_sigkill_at_20_points_leaves_no_partial_artifact(model, remotes, tmp_path, monkeypatch):
    reg, s3 = remotes
    for k, v in AWS.items():  # this process pulls from moto too
        monkeypatch.setenv(k, v)
    home = tmp_path / "store"
    log = tmp_path / "progress.jsonl"
    oci = f"oci://{reg}/crash/m:v1"
    s3uri = "s3://models/crash/m"
    env = {**os.environ, **AWS, "MODELYARD_HOME": str(home), "MODELYARD_PROGRESS_JSONL": str(log),
           "MODELYARD_S3_ENDPOINT_URL": s3}
    cmd = [sys.executable, "-m", "modelyard", "ingest", f"file://{model}", "--no-smoke", "--json",
           "--publish", oci, "--publish", s3uri]
    points = [_during_startup(s) for s in (0.5, 1.5, 3.0)]
    points += [_nth("hashing (sha256)", "start", 1)] + [_nth("hashing (sha256)", "advance", n) for n in (1, 3, 5, 7)]
    points += [_nth("packaging model/", "start", 1)] + [_nth("packaging model/", "advance", n) for n in (1, 2, 4, 6)]
    points += [_nth("writing report and manifest", "start", 1), _nth("writing report and manifest", "advance", 1),
               _nth("writing report and manifest", "advance", 2),
               _exists(home, "m/*/manifest.json", "right after the store rename")]
    points += [_nth("pushing to", "start", 1), _nth("pushing to", "advance", 2), _nth("pushing to", "finish", 1)]
    points += [_nth("uploading to", "start", 1), _nth("uploading to", "advance", 2), _nth("uploading to", "finish", 1)]
    assert len(points) >= 20
    hits = []
    for i, point in enumerate(points):
        label = _kill_at(cmd, env, log, point)
        hits.append(label)
        _store_is_consistent(home)
        # A remote never shows a half-published artifact: pulling either fails cleanly or gives all of it.
        for ref in (oci, s3uri):
            into = tmp_path / f"pull-{i}-{ref[:3]}"
            try:
                r = pull(ref, into, settings=Settings(s3_endpoint_url=s3))
                assert r.path == into and (into / "manifest.json").is_file()
            except ModelyardError as exc:
                assert "Unable to locate credentials" not in str(exc)
                assert not into.exists()
    killed = [h for h in hits if h != "finished"]
    assert len(killed) >= 20, "\n".join(hits)
    # A kill lands a few ms after the event it waited for; the metadata writes can finish inside that
    # window, so "writing" is not required, the other stages always are.
    assert {"hashing", "packaging", "rename", "pushing", "uploading"} <= {
        w for h in killed for w in ("hashing", "packaging", "writing", "rename", "pushing", "uploading") if w in h}, \
        "\n".join(hits)
    # The re-run completes, publishes everywhere, and leaves no temporary files.
    r = run_cli("ingest", f"file://{model}", "--no-smoke", "--json", "--publish", oci, "--publish", s3uri,
                env={**AWS, "MODELYARD_HOME": str(home), "MODELYARD_S3_ENDPOINT_URL": s3})
    assert r.returncode == 0, r.stderr[-2000:]
    (art,) = _store_is_consistent(home)
    assert list((home / ".staging").iterdir()) == []
    assert list((home / ".cache" / "digests").glob(".tmp-*")) == []
    for ref in (oci, s3uri):
        got = pull(ref, tmp_path / f"final-{ref[:3]}", settings=Settings(s3_endpoint_url=s3))
        assert _tree(got.path) == _tree(art)


def test_four_concurrent_ingests_make_one_artifact(model, tmp_path):
    home = tmp_path / "store"
    env = {**os.environ, "MODELYARD_HOME": str(home)}
    cmd = [sys.executable, "-m", "modelyard", "ingest", f"file://{model}", "--no-smoke", "--json"]
    procs = [subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(4)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], [o[1][-1000:] for o in outs]
    results = [json_result(o[0], "ingest") for o in outs]
    assert len({r["artifact"] for r in results}) == 1 and len({r["content_digest"] for r in results}) == 1
    assert sorted(r["reused"] for r in results) == [False, True, True, True]
    assert len(_store_is_consistent(home)) == 1
    assert list((home / ".staging").iterdir()) == []


@pytest.mark.hub
def test_sigkill_while_downloading_and_patching(model, tmp_path_factory, tmp_path):
    """The same guarantees for `hf://` (download from a real olah endpoint into the hub cache, resumed
    after a kill) and for a run that patches (generation_config lacks the turn terminator)."""
    from tests.e2e.olah_hub import OlahServer, make_lfs_repo

    files = {p.name: p.read_bytes() for p in model.iterdir()}
    for name in ("generation_config.json", "config.json"):  # fixable: the turn terminator is not a stop id
        files[name] = json.dumps({**json.loads(files[name]), "eos_token_id": 1}).encode()
    files["tokenizer_config.json"] = json.dumps({**json.loads(files["tokenizer_config.json"]), "eos_token": "<s>"}).encode()
    mirrors = tmp_path_factory.mktemp("crash-mirrors")
    make_lfs_repo(mirrors, "org", "crash", [files])
    home = tmp_path / "store"
    log = tmp_path / "progress.jsonl"
    with OlahServer(mirrors) as server:
        env = {**os.environ, "HF_ENDPOINT": server.endpoint, "MODELYARD_HOME": str(home),
               "MODELYARD_PROGRESS_JSONL": str(log)}
        cmd = [sys.executable, "-m", "modelyard", "ingest", "hf://org/crash@main", "--no-smoke", "--json"]
        # Each run resumes what the killed one left (the hub cache's .incomplete files): a download point may then
        # come after fewer advances than it waits for, so each point falls back to the next stage's start, and no run
        # finishes (a finished run stores the artifact, and the runs after it would only reuse it).
        writing = _nth("writing report and manifest", "start", 1)
        points = [_nth("downloading config and tokenizer", "start", 1), _nth("downloading config and tokenizer", "advance", 1),
                  _nth("downloading weights", "start", 1)]
        points += [_first_of(_nth("downloading weights", "advance", n), _nth("hashing (sha256)", "start", 1), writing)
                   for n in (1, 2)]
        points += [_first_of(_nth("hashing (sha256)", "advance", 2), writing),
                   _first_of(_exists(home, ".staging/*/patches.json", "patches.json written in staging"), writing),
                   _first_of(_exists(home, ".staging/*/patch.diff", "patch.diff written in staging"), writing),
                   writing]
        hits = []
        for point in points:
            hits.append(_kill_at(cmd, env, log, point))
            _store_is_consistent(home)
        assert sum(h != "finished" for h in hits) >= 8, "\n".join(hits)
        r = run_cli("ingest", "hf://org/crash@main", "--no-smoke", "--json",
                    env={"HF_ENDPOINT": server.endpoint, "MODELYARD_HOME": str(home)})
    assert r.returncode == 0, r.stderr[-2000:]
    out = json_result(r.stdout, "ingest")
    (art,) = _store_is_consistent(home)
    assert out["patches"] == 1 and (art / "patches.json").is_file() and (art / "patch.diff").is_file()
    assert json.loads((art / "model" / "generation_config.json").read_text())["eos_token_id"] == [1, 2]
    assert list((home / ".staging").iterdir()) == []
    assert list((home / ".cache").rglob("*.incomplete")) == []
