"""Real publish targets on 127.0.0.1 for the tests: Debian ``docker-registry`` (distribution 2.8,
filesystem store in a temp folder) and ``moto_server`` (S3). Each binds a free port, is probed until
it answers, and is stopped (SIGTERM, then SIGKILL) by the fixture that started it."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

REGISTRY_BIN = "/usr/bin/docker-registry"
#: moto's S3 accepts any credentials; these are what the tests set
AWS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(url: str, proc: subprocess.Popen, log: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: the server exited ({proc.returncode}): {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except urllib.error.HTTPError:
            return  # it answers
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer within {timeout} s: {log.read_text()[-2000:]}")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def registry_available() -> bool:
    return os.access(REGISTRY_BIN, os.X_OK)


@contextmanager
def docker_registry(root: Path, *, login: tuple[str, str] | None = None) -> Iterator[str]:
    """A distribution 2.8 registry on 127.0.0.1:<free port>, storing under ``root``; yields host:port. With
    ``login`` (user, password) every request needs HTTP basic auth, from an htpasswd file (bcrypt, the only
    hash distribution accepts)."""
    port = free_port()
    root.mkdir(parents=True, exist_ok=True)
    auth = ""
    if login is not None:
        import bcrypt

        (root / "htpasswd").write_bytes(login[0].encode() + b":" + bcrypt.hashpw(login[1].encode(), bcrypt.gensalt(5)) + b"\n")
        auth = f"auth:\n  htpasswd:\n    realm: modelyard-tests\n    path: {root / 'htpasswd'}\n"
    cfg = root / "config.yml"
    cfg.write_text(f"""version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: {root / 'data'}
  delete:
    enabled: true
http:
  addr: 127.0.0.1:{port}
{auth}""")
    log = root / "registry.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen([REGISTRY_BIN, "serve", str(cfg)], stdout=fh, stderr=subprocess.STDOUT)
    try:
        _wait(f"http://127.0.0.1:{port}/v2/", proc, log)
        yield f"127.0.0.1:{port}"
    finally:
        _stop(proc)


def moto_available() -> bool:
    return shutil.which("moto_server", path=str(Path(sys.executable).parent)) is not None


@contextmanager
def moto_s3(root: Path) -> Iterator[str]:
    """``moto_server`` on 127.0.0.1:<free port>; yields its endpoint URL. Its request recorder (off until a test
    POSTs ``/moto-api/recorder/start-recording``) writes to ``root/recording.jsonl``: every request's method, URL
    and headers, as they arrive."""
    port = free_port()
    root.mkdir(parents=True, exist_ok=True)
    log = root / "moto.log"
    exe = str(Path(sys.executable).parent / "moto_server")
    with open(log, "wb") as fh:
        proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port)], stdout=fh, stderr=subprocess.STDOUT,
                                env={**os.environ, "MOTO_ALLOW_NONEXISTENT_REGION": "true",
                                     "MOTO_RECORDER_FILEPATH": str(root / "recording.jsonl")})
    try:
        _wait(f"http://127.0.0.1:{port}/moto-api/", proc, log)
        yield f"http://127.0.0.1:{port}"
    finally:
        _stop(proc)
