"""A killed `modelyard pull` continues where it stopped, for real: the pull (a CLI subprocess) is SIGKILLed in the
middle of a 100 MiB file, from S3 (moto_server) and from an OCI registry (Debian docker-registry); the next pull of
the same artifact into the same folder hashes what the first one left, asks the server only for the rest (ranged
GETs from the partial file's end, read back from the server's own request log) and still checks the whole file's
sha256. Nothing appears at -o/--output until the end."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from modelyard.settings import Settings
from modelyard.transport._streams import RANGE_PART
from modelyard.transport.oci import publish_oci
from modelyard.transport.s3 import publish_s3
from tests.conftest import json_error, json_result, run_cli
from tests.e2e.gate_relay import GateRelay
from tests.e2e.publish_servers import AWS_ENV
from tests.killing import kill_at
from tests.unit.test_bundle import _build_artifact

pytestmark = [pytest.mark.e2e, pytest.mark.publish]

BIG = 200 * 1024 * 1024 + 7  # bytes: 13 ranged GETs (or parts) of 16 MiB, the last one short: more than go at once


@pytest.fixture(scope="module")
def big_artifact(tiny_llama_dir, tmp_path_factory) -> Path:
    art = _build_artifact(tiny_llama_dir, tmp_path_factory.mktemp("resume-store"), hub=True)
    big = tmp_path_factory.mktemp("resume") / "big"
    shutil.copytree(art, big)
    (big / "serve" / "shard.bin").write_bytes(os.urandom(BIG))
    return big


def _tree(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _kill_mid_file(args: list[str], env: dict, into: Path, tmp_path: Path) -> int:
    """Run ``modelyard pull ARGS -o INTO``; SIGKILL it once its partial shard.bin holds 32 MiB. Returns the bytes
    the partial file holds after the kill."""
    def partial(_events, _seconds):  # noqa: ANN001, ANN202
        parts = list(into.parent.glob(f".{into.name}.pull-*/serve/shard.bin"))
        return "partial" if parts and parts[0].stat().st_size >= 2 * RANGE_PART else None

    label = kill_at([sys.executable, "-m", "modelyard", "pull", *args, "-o", str(into)], {**os.environ, **env},
                    tmp_path / "events.jsonl", partial)
    assert label == "partial"
    assert not into.exists()  # all or nothing: the folder appears only at the end
    (left,) = into.parent.glob(f".{into.name}.pull-*/serve/shard.bin")
    return left.stat().st_size


def _settled(count) -> int:  # noqa: ANN001
    """``count()`` once it has not changed for 2 s: the killed pull's GETs still in flight are logged by the
    server when it has answered them, after the kill."""
    last, since = count(), time.monotonic()
    while time.monotonic() - since < 2.0:
        time.sleep(0.1)
        if (n := count()) != last:
            last, since = n, time.monotonic()
    return last


@contextlib.contextmanager
def _recording(endpoint: str):  # noqa: ANN202
    """moto's own request recorder, on while the block runs: yields the list it fills at the end with every request
    that arrived meanwhile (method, URL, headers), as moto recorded it when it arrived."""
    def call(verb: str) -> bytes:
        method = "GET" if verb == "download-recording" else "POST"
        with urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/recorder/{verb}", method=method)) as r:
            return r.read()

    out: list[dict] = []
    call("reset-recording")
    call("start-recording")
    try:
        yield out
    finally:
        call("stop-recording")
    out += [{k: v for k, v in json.loads(line).items() if k != "body"} for line in
            call("download-recording").decode().splitlines()]
    call("reset-recording")


def _resumed_pull(args: list[str], env: dict, into: Path, big: Path) -> None:
    r = run_cli("pull", *args, "-o", str(into), "--json", env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert json_result(r.stdout, "pull")["artifact"] == str(into)
    assert _tree(into) == _tree(big)
    assert sorted(p.name for p in into.parent.iterdir()) == [into.name]  # no partial folder, no lock file left


def test_a_killed_s3_pull_asks_only_for_the_rest(big_artifact, s3_endpoint, tmp_path):
    prefix = f"resume-{uuid.uuid4().hex[:8]}/v1"
    publish_s3(big_artifact, f"s3://models/{prefix}", settings=Settings(s3_endpoint_url=s3_endpoint))
    env = {**AWS_ENV, "MODELYARD_S3_ENDPOINT_URL": s3_endpoint}
    into = tmp_path / "out" / "pulled"
    have = _kill_mid_file([f"s3://models/{prefix}"], env, into, tmp_path)
    assert 2 * RANGE_PART <= have < BIG

    with _recording(s3_endpoint) as recorded:  # after the kill: the killed pull's GETs arrived before it
        _resumed_pull([f"s3://models/{prefix}"], env, into, big_artifact)
    asked = [e["headers"].get("Range") for e in recorded if e["method"] == "GET" and
             f"/{prefix}/serve/shard.bin" in e["url"]]
    starts = range(have, BIG, RANGE_PART)
    asked.sort(key=lambda r: int(r.removeprefix("bytes=").split("-")[0]))  # several are in flight at once
    assert asked == [f"bytes={a}-{min(a + RANGE_PART, BIG) - 1}" for a in starts]  # only the rest, in 16 MiB parts


def test_a_killed_oci_pull_asks_only_for_the_rest(big_artifact, registry, tmp_path, tmp_path_factory):
    ref = f"oci://{registry}/models/resume-{uuid.uuid4().hex[:8]}:v1"
    publish_oci(big_artifact, ref, settings=Settings())
    into = tmp_path / "out" / "pulled"
    have = _kill_mid_file([ref], {}, into, tmp_path)
    assert 2 * RANGE_PART <= have < BIG
    sha = hashlib.sha256((big_artifact / "serve" / "shard.bin").read_bytes()).hexdigest()
    log = Path(tmp_path_factory.getbasetemp()) / "registry0" / "registry.log"
    before = _settled(lambda: len(log.read_text().splitlines()))
    _resumed_pull([ref], {}, into, big_artifact)
    sent = [line for line in log.read_text().splitlines()[before:] if f"/blobs/sha256:{sha} " in line]
    sizes = [int(m.group(1)) for line in sent if (m := re.search(r'" 206 (\d+) ', line))]
    assert len(sizes) == len(sent) and sum(sizes) == BIG - have, sent  # the registry sent only the missing bytes


def test_a_killed_s3_publish_sends_only_what_is_missing(big_artifact, s3_endpoint, client, tmp_path, tmp_path_factory):
    """`modelyard publish --to s3://` SIGKILLed while the parts of the 200 MiB file go up (13 parts of 16 MiB, 10 in
    flight): the next publish sends no file that is already there (same size and sha256 metadata) and continues the
    multipart upload it left (recorded in its journal under MODELYARD_HOME), sending only the parts the server does
    not hold; the result pulls whole."""
    prefix = f"republish-{uuid.uuid4().hex[:8]}/v1"
    key = f"{prefix}/serve/shard.bin"
    env = {**AWS_ENV, "MODELYARD_S3_ENDPOINT_URL": s3_endpoint, "MODELYARD_HOME": str(tmp_path / "home")}
    checked = [0.0]

    def held() -> list[int]:
        ups = [u for u in client.list_multipart_uploads(Bucket="models", Prefix=key).get("Uploads", [])
               if u["Key"] == key]
        return sorted(p["PartNumber"] for u in ups
                      for p in client.list_parts(Bucket="models", Key=key, UploadId=u["UploadId"]).get("Parts", []))

    def parts_up(_events, seconds):  # noqa: ANN001, ANN202 - asks the server at most every 0.1 s
        if seconds - checked[0] < 0.1:
            return None
        checked[0] = seconds
        return "parts up" if len(held()) >= 2 else None

    label = kill_at([sys.executable, "-m", "modelyard", "publish", str(big_artifact), "--to", f"s3://models/{prefix}"],
                    {**os.environ, **env}, tmp_path / "events.jsonl", parts_up)
    assert label == "parts up"

    have = _settled(lambda: len(held())) and held()  # the killed run's parts in flight may still land
    assert len(have) >= 2 and list((tmp_path / "home" / ".cache" / "s3-uploads").glob("*.json"))
    r = run_cli("publish", str(big_artifact), "--to", f"s3://models/{prefix}", "--json", env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]

    def puts() -> list[str]:  # both runs' PUTs of this test's own keys (a random prefix), in every moto log
        logs = Path(tmp_path_factory.getbasetemp()).glob("moto[0-9]*/moto.log")  # not motocurrent: a link to the newest
        return [m[1] for log in logs for line in log.read_text().splitlines()
                if (m := re.search(rf'"PUT /models/{prefix}/(\S+) HTTP', line))]

    out = json_result(r.stdout, "publish")
    later = [rel for rel in _tree(big_artifact) if rel > "serve/shard.bin"]  # files go up in path order
    assert later == ["serve/vllm.yaml"]
    small = sum(client.head_object(Bucket="models", Key=f"{prefix}/{rel}")["ContentLength"]
                for rel in (*later, "bundle.json", "manifest.json"))
    assert out["skipped"] == len([rel for rel in _tree(big_artifact) if rel < "serve/shard.bin" and rel != "manifest.json"])
    assert out["sent"] == BIG - len(have) * RANGE_PART + small  # the parts the server held were not sent again
    _settled(lambda: len(puts()))
    files = [p.split("?")[0] for p in puts() if "partNumber=" not in p and "uploads" not in p and "uploadId=" not in p]
    # every file once: those before it by the killed run only, the rest (and bundle.json, manifest.json) by the next
    assert sorted(files) == sorted([rel for rel in _tree(big_artifact) if rel != "serve/shard.bin"] + ["bundle.json"])
    assert client.list_multipart_uploads(Bucket="models", Prefix=key).get("Uploads", []) == []
    assert list((tmp_path / "home" / ".cache" / "s3-uploads").glob("*")) == []
    r = run_cli("pull", f"s3://models/{prefix}", "-o", str(tmp_path / "pulled"), "--json", env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert _tree(tmp_path / "pulled") == _tree(big_artifact)


def test_bundle_unbundle_and_pull_refuse_a_disk_too_small_before_writing(big_artifact, s3_endpoint, small_fs, tmp_path):
    """A 200 MiB artifact written into an 8 MiB filesystem: bundle, unbundle and pull each refuse before the first
    byte (exit 2), naming the folder, the bytes free and the bytes needed, and leave nothing behind."""
    prefix = f"full-{uuid.uuid4().hex[:8]}/v1"
    publish_s3(big_artifact, f"s3://models/{prefix}", settings=Settings(s3_endpoint_url=s3_endpoint))
    env = {**AWS_ENV, "MODELYARD_S3_ENDPOINT_URL": s3_endpoint}
    r = run_cli("bundle", str(big_artifact), "-o", str(tmp_path / "big.tar.zst"), "--json")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    total = json_result(r.stdout, "bundle")["bytes_in"]
    # each names the folder asked for (bundle: -o's folder), never the temp folder it would have written
    for cmd, named, what in (
            (["bundle", str(big_artifact), "-o", str(small_fs / "big.tar.zst")], small_fs, "the bundle"),
            (["unbundle", str(tmp_path / "big.tar.zst"), "-o", str(small_fs / "unbundled")], small_fs / "unbundled",
             "the unbundled artifact"),
            (["pull", f"s3://models/{prefix}", "-o", str(small_fs / "pulled")], small_fs / "pulled",
             "the pulled artifact")):
        r = run_cli(*cmd, "--json", env=env)
        err = json_error(r.stdout, cmd[0], 2)
        assert err["type"] == "InsufficientResourcesError", err
        assert re.fullmatch(rf"{re.escape(str(named))} has [\d,]+ bytes free; this run needs [\d,]+ there "
                            rf"\({what} [\d,]+ bytes\)", err["message"]), err["message"]
        needed = int(err["message"].split("(")[1].split()[-2].replace(",", ""))
        assert BIG < needed <= total + 64 * 1024, (cmd[0], needed, total)
        assert list(small_fs.iterdir()) == [], cmd[0]


def _pid_of(needle: str) -> int:
    """The pid of the one process whose command line contains ``needle``."""
    (pid,) = [int(d.name) for d in Path("/proc").iterdir() if d.name.isdigit() and needle.encode() in
              (d / "cmdline").read_bytes()]
    return pid


def test_a_stalled_registry_fails_the_pull_within_its_timeout(big_artifact, registry, tmp_path, tmp_path_factory):
    """The session's registry is frozen (SIGSTOP: connections are still accepted, nothing is answered) once the pull
    has written its first bytes of the 200 MiB file: the pull ends (exit 2) about MODELYARD_REGISTRY_TIMEOUT seconds
    later, naming the silence and the setting, and keeps what it had for the next pull."""
    import signal
    import subprocess

    ref = f"oci://{registry}/models/stall-{uuid.uuid4().hex[:8]}:v1"
    publish_oci(big_artifact, ref, settings=Settings())
    into = tmp_path / "out" / "pulled"
    frozen = _pid_of(str(Path(tmp_path_factory.getbasetemp()) / "registry0" / "config.yml"))
    cli = subprocess.Popen([sys.executable, "-m", "modelyard", "pull", ref, "-o", str(into), "--json"],
                           env={**os.environ, "MODELYARD_REGISTRY_TIMEOUT": "3"}, stdout=subprocess.PIPE, text=True)
    stopped_at = None
    try:
        deadline = time.monotonic() + 120
        while stopped_at is None and time.monotonic() < deadline and cli.poll() is None:
            if any(p.stat().st_size for p in into.parent.glob(f".{into.name}.pull-*/serve/shard.bin")):
                os.kill(frozen, signal.SIGSTOP)
                stopped_at = time.monotonic()
            time.sleep(0.05)
        assert stopped_at is not None, "the pull ended before the registry could be frozen"
        stdout, _ = cli.communicate(timeout=120)
        waited = time.monotonic() - stopped_at
    finally:
        os.kill(frozen, signal.SIGCONT)
        if cli.poll() is None:
            cli.kill()
    err = json_error(stdout, "pull", 2)
    assert err["message"] == f"{ref}: downloading serve/shard.bin failed (the registry sent nothing for 3 s)"
    assert "MODELYARD_REGISTRY_TIMEOUT" in err["fix"]
    assert waited < 60, waited  # about 3 s of silence per read in flight, never forever
    assert list(into.parent.glob(f".{into.name}.pull-*/serve/shard.bin")) and not into.exists()


def test_a_disk_that_fills_up_during_a_pull_is_exit_2_naming_the_folder(big_artifact, registry, tmp_path):
    """A real 240 MiB tmpfs holds the 200 MiB artifact when the pull starts (the preflight passes); once 32 MiB of
    the shard are on their way (a relay in front of the registry holds the rest), another writer takes the rest of
    the disk: the pull ends with exit 2 (not 3, "internal error"), naming the folder, the bytes free and still to
    come, and keeps its partial folder for the next pull."""
    import subprocess

    mnt = Path(f"/tmp/modelyard-fill-{uuid.uuid4().hex[:8]}")
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=240m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        mnt.rmdir()
        pytest.skip(f"cannot mount a tmpfs here (needs root): {r.stderr.strip()}")
    relay = GateRelay(registry, after=2 * RANGE_PART)
    try:
        ref = f"{registry}/models/fill-{uuid.uuid4().hex[:8]}:v1"
        publish_oci(big_artifact, f"oci://{ref}", settings=Settings())
        into = mnt / "pulled"
        cli = subprocess.Popen([sys.executable, "-m", "modelyard", "pull", f"oci://{relay.address}/{ref.split('/', 1)[1]}",
                                "-o", str(into), "--json"], stdout=subprocess.PIPE, text=True)
        assert relay.holding.wait(timeout=180), "the pull never asked for the shard"
        with open(mnt / "filler", "wb") as fh:
            with contextlib.suppress(OSError):
                os.posix_fallocate(fh.fileno(), 0, shutil.disk_usage(mnt).free)
        relay.release.set()
        stdout, _ = cli.communicate(timeout=180)
        err = json_error(stdout, "pull", 2)
        assert err["type"] == "InsufficientResourcesError"
        assert re.fullmatch(rf"{mnt} filled up while serve/shard\.bin was written: [\d,]+ bytes free, [\d,]+ bytes of "
                            rf"it and the files after it still to come; nothing was written to {into}", err["message"])
        assert err["fix"].startswith("Free space there (what was pulled is kept in ")
        assert list(mnt.glob(".pulled.pull-*/serve/shard.bin")) and not into.exists()
    finally:
        relay.close()
        subprocess.run(["umount", "-l", str(mnt)], check=False)
        mnt.rmdir()


def _kill_oci_publish_at(big_artifact: Path, relay: GateRelay, ref: str, env: dict, journal: Path) -> dict:
    """Run ``modelyard publish ARTIFACT --to REF`` through ``relay``; once the relay holds it, check that the layer's
    upload session is kept in ``journal`` (its record returned), SIGKILL the publish and drop what the relay held
    (the killed process never sent it)."""
    import signal
    import subprocess

    cli = subprocess.Popen([sys.executable, "-m", "modelyard", "publish", str(big_artifact), "--to", ref, "--json"],
                           env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert relay.holding.wait(timeout=180), "the publish never reached the hold"
        kept = [json.loads(p.read_text()) for p in journal.glob("*.json")]
        assert len(kept) == 1 and kept[0]["digest"] == "sha256:" + _tree(big_artifact)["serve/shard.bin"]
    finally:
        os.kill(cli.pid, signal.SIGKILL)
        cli.wait(timeout=60)
        relay.cut()
    return kept[0]


def _unsent(big_artifact: Path, registry: str, ref: str) -> int:
    """Bytes of the artifact's files but the big shard that the registry does not hold yet."""
    import requests

    repo = ref.split("/", 3)[3].split(":")[0]
    return sum((big_artifact / rel).stat().st_size for rel, sha in _tree(big_artifact).items()
               if rel != "serve/shard.bin" and requests.head(f"http://{registry}/v2/{repo}/blobs/sha256:{sha}",
                                                             timeout=30).status_code != 200)


def test_a_killed_oci_publish_continues_the_half_pushed_layer(big_artifact, registry, tmp_path):
    """`modelyard publish --to oci://` SIGKILLed while the 200 MiB layer goes up, between two chunks (a relay in front
    of the real registry holds the 4th chunk's PATCH): the session's location was kept in the journal under
    MODELYARD_HOME; the next publish asks the registry what the session holds (3 chunks) and sends only the rest of
    that layer and the files the registry has not (the config blob went first, in the killed run); it pulls whole."""
    import requests

    env = {"MODELYARD_HOME": str(tmp_path / "home")}
    journal = tmp_path / "home" / ".cache" / "oci-uploads"
    relay = GateRelay(registry, after=3 * RANGE_PART, held="requests", at=b"PATCH ")
    try:
        ref = f"oci://{relay.address}/models/republish-{uuid.uuid4().hex[:8]}:v1"
        kept = _kill_oci_publish_at(big_artifact, relay, ref, env, journal)
        status = requests.get(kept["location"], timeout=30)  # what the session holds, as the next publish asks it
        assert (status.status_code, status.headers.get("Range")) == (204, f"0-{3 * RANGE_PART - 1}"), status.text
        missing = _unsent(big_artifact, registry, ref)
        out = json_result(run_cli("publish", str(big_artifact), "--to", ref, "--json", env=env).stdout, "publish")
        assert (out["sent"], out["restarted"]) == (BIG - 3 * RANGE_PART + missing, [])
        assert list(journal.glob("*")) == []
    finally:
        relay.close()
    r = run_cli("pull", ref.replace(relay.address, registry), "-o", str(tmp_path / "pulled"), "--json", env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert _tree(tmp_path / "pulled") == _tree(big_artifact)


def test_a_publish_killed_inside_a_chunk_restarts_that_layer_only_and_says_so(big_artifact, registry, tmp_path):
    """Killed in the middle of a chunk's PATCH, the registry (docker-registry, CNCF distribution) holds more bytes
    than the session's last location says and cancels the session when it is asked about it: the next publish
    names that layer in ``restarted`` and sends it whole, and nothing else twice."""
    env = {"MODELYARD_HOME": str(tmp_path / "home")}
    journal = tmp_path / "home" / ".cache" / "oci-uploads"
    relay = GateRelay(registry, after=3 * RANGE_PART + RANGE_PART // 2, held="requests")
    try:
        ref = f"oci://{relay.address}/models/republish-{uuid.uuid4().hex[:8]}:v1"
        _kill_oci_publish_at(big_artifact, relay, ref, env, journal)
        missing = _unsent(big_artifact, registry, ref)
        out = json_result(run_cli("publish", str(big_artifact), "--to", ref, "--json", env=env).stdout, "publish")
        assert (out["sent"], out["restarted"]) == (BIG + missing, ["serve/shard.bin"])
        assert list(journal.glob("*")) == []
    finally:
        relay.close()
