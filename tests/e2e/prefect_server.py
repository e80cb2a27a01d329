"""A real Prefect server on 127.0.0.1 for the orchestration tests (no ephemeral API, no mocks).

``PrefectServer(workdir)`` runs ``prefect server start --host 127.0.0.1 --port <free>`` with its own
``PREFECT_HOME`` and database: SQLite (``sqlite+aiosqlite:///<workdir>/prefect.db``) by default, or any
``database_url`` (e.g. ``postgresql+asyncpg://`` from :class:`Postgres15`). ``.env`` is what a client
subprocess needs (``PREFECT_API_URL`` and friends). Readiness: ``GET /api/health`` answers 200.

``Postgres15(workdir)`` runs the installed PostgreSQL 15 (``/usr/lib/postgresql/15/bin``): initdb into a
temp folder, start on a free port (as user ``postgres`` when the tests run as root), create a database.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

PG_BIN = Path("/usr/lib/postgresql/15/bin")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrefectServer:
    def __init__(self, workdir: Path, *, database_url: str | None = None, startup_timeout: float = 180.0,
                 server_env: dict[str, str] | None = None) -> None:
        self.workdir = Path(workdir)
        self.server_env = server_env or {}  # more settings for the server process (e.g. its services' loops)
        self.database_url = database_url or f"sqlite+aiosqlite:///{self.workdir / 'prefect.db'}"
        self.startup_timeout = startup_timeout
        self.port: int | None = None
        self.proc: subprocess.Popen | None = None
        self.log_path = self.workdir / "prefect-server.log"

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    @property
    def env(self) -> dict[str, str]:
        """Environment for clients (CLI subprocesses, in-process code) talking to this server."""
        return {"PREFECT_API_URL": self.api_url, "PREFECT_HOME": str(self.workdir / "client-home"),
                "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_API_DATABASE_CONNECTION_URL": self.database_url}

    def start(self) -> "PrefectServer":
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        env = {**os.environ, "PREFECT_HOME": str(self.workdir / "server-home"),
               "PREFECT_API_DATABASE_CONNECTION_URL": self.database_url,
               "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_SERVER_UI_ENABLED": "false",
               "PREFECT_LOGGING_LEVEL": "WARNING", "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
               **self.server_env}
        env.pop("PREFECT_API_URL", None)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(self.port),
             "--no-ui", "--analytics-off"],
            env=env, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prefect server exited with {self.proc.returncode}:\n{self.read_log()[-4000:]}")
            try:
                with urllib.request.urlopen(f"{self.api_url}/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"prefect server not healthy after {self.startup_timeout} s:\n{self.read_log()[-4000:]}")

    def read_log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self.proc = None
        if getattr(self, "_log", None) is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> "PrefectServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def postgres_available() -> bool:
    return (PG_BIN / "initdb").is_file() and (PG_BIN / "pg_ctl").is_file()


class Postgres15:
    """The installed PostgreSQL 15 in a temp data dir on a free port; ``.url`` for Prefect (asyncpg)."""

    def __init__(self) -> None:
        import tempfile

        self._as_postgres = os.geteuid() == 0  # initdb refuses to run as root
        # Its own folder directly under /tmp: pytest's tmp folders are 0700 root, which user postgres
        # cannot enter.
        self.workdir = Path(tempfile.mkdtemp(prefix="modelyard-pg-"))
        self.data = self.workdir / "pgdata"
        self.port = free_port()

    @property
    def url(self) -> str:
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/prefect"

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        cmd = list(args)
        if self._as_postgres:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if check and r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
        return r

    def start(self) -> "Postgres15":
        if self._as_postgres:
            shutil.chown(self.workdir, "postgres", "postgres")
        self._run(str(PG_BIN / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8")
        self._run(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.workdir / "pg.log"), "-w", "-t", "60",
                  "-o", f"-h 127.0.0.1 -p {self.port} -k {self.workdir}", "start")
        self._run(str(PG_BIN / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "prefect")
        return self

    def stop(self) -> None:
        self._run(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop", check=False)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> "Postgres15":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --------------------------------------------------------------------------- pytest fixtures
# Import them into a test module (``from tests.e2e.prefect_server import prefect_server``).

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory):
    """One real Prefect server on SQLite for the session; yields the :class:`PrefectServer`."""
    with PrefectServer(tmp_path_factory.mktemp("prefect-sqlite")) as server:
        yield server
