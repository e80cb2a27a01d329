"""Session fixtures shared by the e2e tests: one demo run (GGUF conversion + vLLM smoke) and one vLLM
OpenAI server on its artifact per session."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest
import yaml

from tests.conftest import built_once, json_result, run_cli
from tests.e2e.publish_servers import AWS_ENV, docker_registry, moto_s3


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory):
    """``(store home, ingest result)`` of `modelyard demo --json` into a fresh store. Nothing reaches
    stderr: no progress with --json, and no library's progress bar or warning (transformers' GGUF
    conversion bar printed there once). Built once per run, also across workers (:func:`tests.conftest.built_once`)."""
    def build(home: Path):
        r = run_cli("demo", "--json", "--out", str(home), timeout=1500)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        assert r.stderr == ""
        return home, json_result(r.stdout, "demo")

    return built_once(tmp_path_factory, "demo-store", build)


@pytest.fixture(scope="session")
def registry(tmp_path_factory):
    """``host:port`` of one Debian docker-registry on 127.0.0.1 for the session's OCI publish tests."""
    with docker_registry(tmp_path_factory.mktemp("registry")) as host:
        yield host


@pytest.fixture(scope="session")
def vllm_server(demo_run):
    """``(artifact folder, RunningServer)``: ONE vLLM OpenAI server for the session, on the demo
    artifact, started from its serve/vllm.yaml the way the server smoke starts it (CPU overrides,
    ``start_server``) and stopped at the end. The metrics, SLO and proxy tests share it."""
    from modelyard.settings import Settings
    from modelyard.stages.smoke.server import start_server

    _, out = demo_run
    art = Path(out["artifact"])
    config = yaml.safe_load((art / "serve" / "vllm.yaml").read_text())
    with start_server(art / "model", Settings(), config=config, max_model_len=4096) as server:
        yield art, server


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory):
    """One ``moto_server`` (S3) for the session, with the bucket ``models``; AWS_* test credentials are set
    in this process while it runs. Yields its endpoint URL."""
    old = {k: os.environ.get(k) for k in AWS_ENV}
    os.environ.update(AWS_ENV)
    try:
        with moto_s3(tmp_path_factory.mktemp("moto")) as url:
            import boto3

            boto3.client("s3", endpoint_url=url).create_bucket(Bucket="models")
            yield url
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="session")
def client(s3_endpoint):
    """A boto3 S3 client of :func:`s3_endpoint` (the tests' own view of the bucket, not modelyard's)."""
    import boto3

    return boto3.client("s3", endpoint_url=s3_endpoint)


@pytest.fixture(scope="session")
def s3_settings(s3_endpoint):
    """modelyard's :class:`~modelyard.settings.Settings` pointed at :func:`s3_endpoint`."""
    from modelyard.settings import Settings

    return Settings(s3_endpoint_url=s3_endpoint)


@pytest.fixture(scope="module")
def small_fs(tmp_path_factory):
    """A real 8 MiB tmpfs, mounted for the module (mounting needs root, CAP_SYS_ADMIN, which this project's
    machines and CI have; skipped elsewhere)."""
    mnt = Path(f"/tmp/modelyard-full-{uuid.uuid4().hex[:8]}")
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        mnt.rmdir()
        pytest.skip(f"cannot mount a tmpfs here (needs root): {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)
        mnt.rmdir()
