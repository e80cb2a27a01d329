"""Local, offline Hugging Face Hub stand-in for end-to-end tests, built on olah.

Plain helpers (no pytest fixtures):

* ``make_lfs_repo`` builds a non-bare git checkout with Git LFS under
  ``<root>/models/<org>/<name>`` -- the layout olah's ``mirrors-path`` expects.
* ``OlahServer`` runs olah (``python -m olah.server --config ...``) in offline
  mode over that root and exposes ``.endpoint`` for ``huggingface_hub``.

Requires the ``git`` and ``git-lfs`` executables (Debian: ``apt-get install -y
git-lfs``); ``git_lfs_available()`` lets a wrapper skip cleanly without them.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path, PurePosixPath
from typing import Mapping, Optional, Sequence, Union

__all__ = [
    "LFS_PATTERNS",
    "GitError",
    "OlahStartError",
    "OlahServer",
    "git_blob_sha1",
    "git_lfs_available",
    "make_lfs_repo",
    "repo_path",
    "sha256_hex",
]

# Patterns tracked by git-lfs in every repo made by make_lfs_repo.
LFS_PATTERNS: tuple[str, ...] = ("*.safetensors", "*.gguf", "*.bin")

_GIT_NAME = "modelyard-test"
_GIT_EMAIL = "modelyard-test@example.invalid"
# Commit i gets date _BASE_EPOCH + 60*i (UTC), so commits are ordered and shas
# are reproducible for identical inputs.
_BASE_EPOCH = 1_700_000_000


class GitError(RuntimeError):
    pass


class OlahStartError(RuntimeError):
    pass


# --------------------------------------------------------------------------- hashing


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def git_blob_sha1(data: bytes) -> str:
    """Git blob id of ``data`` (what the Hub reports as ``blob_id`` / non-LFS oid)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


# --------------------------------------------------------------------------- git


def git_lfs_available() -> bool:
    if shutil.which("git") is None:
        return False
    try:
        r = subprocess.run(["git", "lfs", "version"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


def _git_env(date_epoch: Optional[int] = None) -> dict[str, str]:
    env = dict(os.environ)
    # Isolate from any user/system git config (works with no ~/.gitconfig).
    env["GIT_CONFIG_NOSYSTEM"] = "1"
    env["GIT_CONFIG_GLOBAL"] = os.devnull
    env["GIT_TERMINAL_PROMPT"] = "0"
    env["GIT_AUTHOR_NAME"] = env["GIT_COMMITTER_NAME"] = _GIT_NAME
    env["GIT_AUTHOR_EMAIL"] = env["GIT_COMMITTER_EMAIL"] = _GIT_EMAIL
    if date_epoch is not None:
        stamp = f"@{date_epoch} +0000"
        env["GIT_AUTHOR_DATE"] = env["GIT_COMMITTER_DATE"] = stamp
    for k in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"):
        env.pop(k, None)
    return env


def _git(cwd: Path, *args: str, date_epoch: Optional[int] = None) -> str:
    r = subprocess.run(
        ["git", *args],
        cwd=cwd,
        env=_git_env(date_epoch),
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        raise GitError(
            f"git {' '.join(args)} failed in {cwd} (rc={r.returncode}):\n"
            f"stdout:\n{r.stdout}\nstderr:\n{r.stderr}"
        )
    return r.stdout


def _is_lfs_path(rel: str) -> bool:
    return any(fnmatch.fnmatch(PurePosixPath(rel).name, p) for p in LFS_PATTERNS)


def repo_path(root: Path, org: str, name: str) -> Path:
    """Where olah (mirrors-path=root) looks for model ``org/name``."""
    return Path(root) / "models" / org / name


def make_lfs_repo(
    root: Path,
    org: str,
    name: str,
    commits: Sequence[Mapping[str, Optional[bytes]]],
    *,
    check_olah_compat: bool = True,
) -> list[str]:
    """Create ``root/models/<org>/<name>`` as a git+LFS checkout on branch ``main``.

    Each element of ``commits`` maps a relative path (``/`` separators) to its
    content; files persist across commits unless overwritten. A value of
    ``None`` deletes the file in that commit. ``.gitattributes`` (LFS tracking
    of ``LFS_PATTERNS``) is added in the first commit. Returns the commit shas
    in order (last one == ``main``).

    ``check_olah_compat`` rejects non-LFS files of 121..149 bytes that are not
    UTF-8: olah 0.5.4 sniffs every blob of that size as a possible LFS pointer
    with ``.decode("utf-8")`` and answers 500 for it (tree, paths-info, resolve).
    """
    if not commits:
        raise ValueError("commits must not be empty")
    if not git_lfs_available():
        raise GitError("git-lfs is not available (Debian: apt-get install -y git-lfs)")

    repo = repo_path(Path(root), org, name)
    if repo.exists():
        raise FileExistsError(repo)
    repo.mkdir(parents=True)

    _git(repo, "init", "-q", "-b", "main")
    # Writes filter.lfs.* into .git/config (not global) and installs hooks.
    _git(repo, "lfs", "install", "--local")
    (repo / ".gitattributes").write_text(
        "".join(f"{p} filter=lfs diff=lfs merge=lfs -text\n" for p in LFS_PATTERNS)
    )

    shas: list[str] = []
    for i, files in enumerate(commits):
        for rel, content in files.items():
            rel_path = Path(rel)
            if rel_path.is_absolute() or ".." in rel_path.parts:
                raise ValueError(f"bad repo path: {rel!r}")
            target = repo / rel_path
            if content is None:
                if target.exists():
                    _git(repo, "rm", "-q", "--", rel)
                continue
            if check_olah_compat and not _is_lfs_path(rel) and 120 < len(content) < 150:
                try:
                    content.decode("utf-8")
                except UnicodeDecodeError:
                    raise ValueError(
                        f"{rel!r}: non-LFS, {len(content)} bytes, not UTF-8 -- olah 0.5.4 "
                        "returns 500 for such blobs; change its size or pass check_olah_compat=False"
                    ) from None
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)
        _git(repo, "add", "-A")
        _git(
            repo,
            "commit",
            "-q",
            "--allow-empty",
            "--no-verify",
            "-m",
            f"commit {i + 1}",
            date_epoch=_BASE_EPOCH + 60 * i,
        )
        shas.append(_git(repo, "rev-parse", "HEAD").strip())

    # Sanity check: LFS content really went to .git/lfs/objects (olah reads it there).
    lfs_files = _git(repo, "lfs", "ls-files", "-n").split()
    for rel in lfs_files:
        oid = sha256_hex((repo / rel).read_bytes())
        obj = repo / ".git" / "lfs" / "objects" / oid[:2] / oid[2:4] / oid
        if not obj.is_file():
            raise GitError(f"LFS object for {rel} missing at {obj}")
    return shas


# --------------------------------------------------------------------------- olah


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _toml_str(value: Union[str, Path]) -> str:
    # TOML basic string; escape backslashes and quotes.
    s = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{s}"'


class OlahServer:
    """Run olah offline over ``mirrors_root`` (a dir holding ``models/<org>/<repo>``).

    Usage::

        with OlahServer(mirrors_root) as hub:
            HfApi(endpoint=hub.endpoint).model_info("org/tiny", revision="main")

    ``workdir`` (default: a fresh temp dir, removed on exit unless ``keep_workdir``)
    holds ``olah.toml``, ``repos/`` (olah cache), ``logs/`` and ``olah.out.log``
    (olah's stdout+stderr, unless ``log_path`` is given -- pass one outside an
    owned workdir to keep it after exit; see ``.log_path`` / ``.read_log()``).

    The upstream hub is pointed at a closed local port (``http://127.0.0.1:<p>``)
    so nothing can leak to huggingface.co; ``/api/whoami-v2`` then answers 504
    quickly, which still proves the server is up.
    """

    def __init__(
        self,
        mirrors_root: Union[str, Path],
        *,
        host: str = "127.0.0.1",
        port: Optional[int] = None,
        workdir: Optional[Union[str, Path]] = None,
        keep_workdir: bool = False,
        startup_timeout: float = 60.0,
        shutdown_timeout: float = 10.0,
        python: str = sys.executable,
        extra_basic: Optional[Mapping[str, Union[str, int, bool]]] = None,
        log_path: Optional[Union[str, Path]] = None,
    ) -> None:
        self.mirrors_root = Path(mirrors_root).resolve()
        self.host = host
        self._requested_port = port
        self.port: Optional[int] = None
        self._workdir_arg = Path(workdir) if workdir is not None else None
        self._keep_workdir = keep_workdir
        self.startup_timeout = startup_timeout
        self.shutdown_timeout = shutdown_timeout
        self.python = python
        self.extra_basic = dict(extra_basic or {})
        self.workdir: Optional[Path] = None
        self.config_path: Optional[Path] = None
        self._log_path_arg = Path(log_path) if log_path is not None else None
        self.log_path: Optional[Path] = None
        self.startup_seconds: Optional[float] = None
        self._proc: Optional[subprocess.Popen] = None
        self._log_fh = None
        self._own_workdir = False

    # ------------------------------------------------------------------ props
    @property
    def endpoint(self) -> str:
        if self.port is None:
            raise RuntimeError("OlahServer not started")
        return f"http://{self.host}:{self.port}"

    @property
    def process(self) -> Optional[subprocess.Popen]:
        return self._proc

    def read_log(self) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")

    # ------------------------------------------------------------------ config
    def _write_config(self, port: int) -> Path:
        assert self.workdir is not None
        upstream_port = _free_port()  # closed once returned: connection refused
        basic: dict[str, Union[str, int, bool]] = {
            "host": self.host,
            "port": port,
            "repos-path": str(self.workdir / "repos"),
            "mirrors-path": [str(self.mirrors_root)],  # type: ignore[dict-item]
            "hf-scheme": "http",
            "hf-netloc": f"127.0.0.1:{upstream_port}",
            "hf-lfs-netloc": f"127.0.0.1:{upstream_port}",
            "mirror-scheme": "http",
            "mirror-netloc": f"{self.host}:{port}",
            "mirror-lfs-netloc": f"{self.host}:{port}",
            "metadata-cache-ttl": 0,
        }
        basic.update(self.extra_basic)

        def fmt(v: object) -> str:
            if isinstance(v, bool):
                return "true" if v else "false"
            if isinstance(v, int):
                return str(v)
            if isinstance(v, (list, tuple)):
                return "[" + ", ".join(fmt(x) for x in v) + "]"
            return _toml_str(str(v))

        lines = ["[basic]"]
        lines += [f"{k} = {fmt(v)}" for k, v in basic.items()]
        lines += [
            "",
            "[accessibility]",
            "offline = true",
            "",
            "[[accessibility.proxy]]",
            'repo = "*"',
            "allow = true",
            "",
            "[[accessibility.proxy]]",
            'repo = "*/*"',
            "allow = true",
            "",
            "[[accessibility.cache]]",
            'repo = "*"',
            "allow = true",
            "",
            "[[accessibility.cache]]",
            'repo = "*/*"',
            "allow = true",
            "",
        ]
        path = self.workdir / "olah.toml"
        path.write_text("\n".join(lines))
        return path

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> "OlahServer":
        if self._proc is not None:
            raise RuntimeError("already started")
        if self._workdir_arg is not None:
            self.workdir = self._workdir_arg
            self.workdir.mkdir(parents=True, exist_ok=True)
        else:
            self.workdir = Path(tempfile.mkdtemp(prefix="olah-hub-"))
            self._own_workdir = True
        (self.workdir / "repos").mkdir(exist_ok=True)
        (self.workdir / "logs").mkdir(exist_ok=True)
        self.log_path = self._log_path_arg or (self.workdir / "olah.out.log")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)

        attempts = 1 if self._requested_port is not None else 3
        last_err: Optional[Exception] = None
        for _ in range(attempts):
            port = self._requested_port or _free_port(self.host)
            try:
                self._spawn_and_wait(port)
                return self
            except OlahStartError as e:  # e.g. port raced away; retry on a new one
                last_err = e
                self._stop_process()
        self._cleanup_workdir()
        assert last_err is not None
        raise last_err

    def _spawn_and_wait(self, port: int) -> None:
        assert self.workdir is not None and self.log_path is not None
        self.port = port
        self.config_path = self._write_config(port)
        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"
        no_proxy = ",".join(filter(None, [env.get("NO_PROXY", ""), "127.0.0.1", "localhost"]))
        env["NO_PROXY"] = env["no_proxy"] = no_proxy
        self._log_fh = open(self.log_path, "ab")
        self._log_fh.write(f"=== starting olah on port {port} ===\n".encode())
        self._log_fh.flush()
        t0 = time.monotonic()
        self._proc = subprocess.Popen(
            [
                self.python,
                "-m",
                "olah.server",
                "--config",
                str(self.config_path),
                "--log-path",
                str(self.workdir / "logs"),
            ],
            cwd=self.workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log_fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = t0 + self.startup_timeout
        url = f"{self.endpoint}/api/whoami-v2"
        while True:
            rc = self._proc.poll()
            if rc is not None:
                raise OlahStartError(
                    f"olah exited with rc={rc} during startup; log tail:\n{self.read_log()[-4000:]}"
                )
            if self._ping(url):
                self.startup_seconds = time.monotonic() - t0
                return
            if time.monotonic() > deadline:
                raise OlahStartError(
                    f"olah not ready after {self.startup_timeout}s; log tail:\n{self.read_log()[-4000:]}"
                )
            time.sleep(0.1)

    @staticmethod
    def _ping(url: str) -> bool:
        # Any HTTP answer (olah proxies whoami upstream -> 504 offline) means ready.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(url, timeout=15) as resp:
                resp.read()
            return True
        except urllib.error.HTTPError:
            return True
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            return False

    def _stop_process(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout=self.shutdown_timeout)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(timeout=self.shutdown_timeout)
        if self._log_fh is not None:
            self._log_fh.close()
            self._log_fh = None

    def _cleanup_workdir(self) -> None:
        if self._own_workdir and not self._keep_workdir and self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def stop(self) -> None:
        self._stop_process()
        self._cleanup_workdir()

    def __enter__(self) -> "OlahServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
