"""Real serving tools on 127.0.0.1 for the tests, each run from a file serve/ generated for the demo
artifact, with only the host-specific lines rewritten to this test's ports and paths:

- Debian ``prometheus`` (2.42) with serve/prometheus.yml and the alerts.yml it loads: the scrape
  target becomes the session's vLLM server, the intervals 1 s; storage in a temp folder.
- Debian ``nginx`` (1.22) with serve/nginx.conf (a server block) inside a minimal main config: the
  upstream becomes the session's vLLM server, ``listen`` a free port on 127.0.0.1, the key file a temp
  file. It runs as a non-root user (``nobody`` via ``setpriv`` when the tests run as root) with
  every path it writes under a temp prefix.

Each binds a free port, is probed until it answers, and is stopped (SIGTERM, then SIGKILL) on exit."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

from tests.e2e.publish_servers import _stop, _wait, free_port

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"


def tool_missing(path: str) -> bool:
    return not os.access(path, os.X_OK)


def rewrite_prometheus_yml(text: str, target: str) -> str:
    """serve/prometheus.yml with its one scrape target replaced by ``target`` (host:port) and a 1 s
    interval; everything else (job, metrics path, labels) as generated."""
    cfg = yaml.safe_load(text)
    (job,) = cfg["scrape_configs"]
    (static,) = job["static_configs"]
    assert static["targets"] == ["vllm:8000"], static
    static["targets"] = [target]
    cfg["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    return yaml.safe_dump(cfg, sort_keys=False)


@contextmanager
def prometheus(config_text: str, root: Path, files: dict[str, str] | None = None) -> Iterator[str]:
    """Debian's prometheus with ``config_text`` on 127.0.0.1:<free port>, TSDB under ``root``, and
    ``files`` (name -> text, e.g. the ``alerts.yml`` its ``rule_files`` names) beside the config;
    yields its base URL once ``/-/ready`` answers."""
    port = free_port()
    root.mkdir(parents=True, exist_ok=True)
    (root / "prometheus.yml").write_text(config_text)
    for name, text in (files or {}).items():
        (root / name).write_text(text)
    log = root / "prometheus.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen([PROMETHEUS, f"--config.file={root / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={root / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
                                 "--log.level=warn"], stdout=fh, stderr=subprocess.STDOUT)
    try:
        _wait(f"http://127.0.0.1:{port}/-/ready", proc, log)
        yield f"http://127.0.0.1:{port}"
    finally:
        _stop(proc)


def rewrite_nginx_conf(text: str, *, upstream: str, listen: str, keys_file: Path) -> str:
    """serve/nginx.conf with the three host-specific lines replaced (each must occur exactly once)."""
    for old, new in (("server vllm:8000;", f"server {upstream};"), ("listen 8080;", f"listen {listen};"),
                     ("include /run/secrets/api_keys;", f"include {keys_file};")):
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    return text


def _unprivileged() -> tuple[list[str], int | None, int | None]:
    """The command prefix that drops root (setpriv to ``nobody``), and that user's uid/gid; nothing
    when the tests already run as another user."""
    if os.geteuid() != 0:
        return [], None, None
    pw = pwd.getpwnam("nobody")
    return ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--clear-groups"], pw.pw_uid, pw.pw_gid


def _write_main_conf(root: Path, uid: int | None, gid: int | None) -> None:
    """nginx.conf of a prefix ``root`` that includes ``root/default.conf``, with its temp paths and pid
    there; the folder is handed to ``uid``/``gid`` (nginx's user) when the tests run as root."""
    temps = "\n".join(f"    {d}_temp_path {root / d};" for d in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    (root / "nginx.conf").write_text(f"""daemon off;
worker_processes 1;
pid {root / 'nginx.pid'};
error_log stderr warn;
events {{ worker_connections 64; }}
http {{
    access_log off;
{temps}
    include {root / 'default.conf'};
}}
""")
    if uid is not None:
        root.chmod(0o755)
        for p in (root, *root.iterdir()):
            os.chown(p, uid, gid)


@contextmanager
def nginx(server_conf: str, *, upstream: str, keys: list[str]) -> Iterator[str]:
    """Debian's nginx, not as root, serving ``server_conf`` (serve/nginx.conf) in front of
    ``upstream`` (host:port) with the API keys ``keys``; yields its base URL once it answers."""
    prefix, uid, gid = _unprivileged()
    root = Path(tempfile.mkdtemp(prefix="modelyard-nginx-"))
    port = free_port()
    try:
        keys_file = root / "api_keys.map"
        keys_file.write_text("".join(f'"Bearer {k}" 1;\n' for k in keys))
        (root / "default.conf").write_text(rewrite_nginx_conf(server_conf, upstream=upstream,
                                                              listen=f"127.0.0.1:{port}", keys_file=keys_file))
        _write_main_conf(root, uid, gid)
        log = root / "nginx.log"
        with open(log, "wb") as fh:
            proc = subprocess.Popen([*prefix, NGINX, "-p", str(root), "-c", str(root / "nginx.conf"), "-e", "stderr"],
                                    stdout=fh, stderr=subprocess.STDOUT)
        try:
            _wait(f"http://127.0.0.1:{port}/health", proc, log)
            yield f"http://127.0.0.1:{port}"
        finally:
            _stop(proc)
    finally:
        shutil.rmtree(root, ignore_errors=True)


@contextmanager
def nginx_canary(server_conf: str, *, canary_dir: Path, keys: list[str]) -> Iterator[tuple[str, str]]:
    """Debian's nginx, not as root, serving the canary form of serve/nginx.conf: its upstream includes
    ``canary_dir/upstream.conf`` (which the rollout rewrites; it must be readable by nginx's user) in
    place of ``/etc/nginx/canary``; ``listen`` and the key file as in :func:`nginx`. Yields (its base URL,
    the command line that reloads it: ``nginx -s reload`` on its prefix, as the same user)."""
    prefix, uid, gid = _unprivileged()
    root = Path(tempfile.mkdtemp(prefix="modelyard-nginx-canary-"))
    port = free_port()
    try:
        keys_file = root / "api_keys.map"
        keys_file.write_text("".join(f'"Bearer {k}" 1;\n' for k in keys))
        text = server_conf
        for old, new in (("include /etc/nginx/canary/upstream.conf;", f"include {canary_dir / 'upstream.conf'};"),
                         ("listen 8080;", f"listen 127.0.0.1:{port};"),
                         ("include /run/secrets/api_keys;", f"include {keys_file};")):
            assert text.count(old) == 1, old
            text = text.replace(old, new)
        (root / "default.conf").write_text(text)
        _write_main_conf(root, uid, gid)
        base_cmd = [*prefix, NGINX, "-p", str(root), "-c", str(root / "nginx.conf"), "-e", "stderr"]
        log = root / "nginx.log"
        with open(log, "wb") as fh:
            proc = subprocess.Popen(base_cmd, stdout=fh, stderr=subprocess.STDOUT)
        try:
            _wait(f"http://127.0.0.1:{port}/health", proc, log)
            yield f"http://127.0.0.1:{port}", " ".join([*base_cmd, "-s", "reload"])
        finally:
            _stop(proc)
    finally:
        shutil.rmtree(root, ignore_errors=True)


@contextmanager
def nginx_site(server_block: str, *, probe: str = "/") -> Iterator[str]:
    """Debian's nginx, not as root, serving ``server_block`` (an nginx ``server { ... }`` whose ``listen`` line is
    ``listen {listen};``) on a free port of 127.0.0.1; yields its base URL once ``probe`` answers (any status)."""
    prefix, uid, gid = _unprivileged()
    root = Path(tempfile.mkdtemp(prefix="modelyard-nginx-site-"))
    port = free_port()
    try:
        (root / "default.conf").write_text(server_block.replace("{listen}", f"127.0.0.1:{port}"))
        _write_main_conf(root, uid, gid)
        log = root / "nginx.log"
        with open(log, "wb") as fh:
            proc = subprocess.Popen([*prefix, NGINX, "-p", str(root), "-c", str(root / "nginx.conf"), "-e", "stderr"],
                                    stdout=fh, stderr=subprocess.STDOUT)
        try:
            _wait(f"http://127.0.0.1:{port}{probe}", proc, log)
            yield f"http://127.0.0.1:{port}"
        finally:
            _stop(proc)
    finally:
        shutil.rmtree(root, ignore_errors=True)
