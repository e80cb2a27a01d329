"""A tiny real HTTP server in front of the olah hub that changes what the hub answers, for the cases
olah cannot produce itself. It is the hub's response under test, not a mock of modelyard's code:
modelyard talks HTTP to it through huggingface_hub exactly as to the hub.

* ``redact[repo] = {path: "asterisks" | "null"}``: in the tree API's answer (``/api/models/<repo>/tree/...``)
  the file's digest is redacted as gated repos may answer: an LFS file's ``lfs.oid`` becomes 64
  asterisks (``"asterisks"``) or null (``"null"``); a git file's ``oid`` becomes asterisks or null.
* ``corrupt[repo] = {path, ...}``: the body of a ``GET .../resolve/<rev>/<path>`` has one byte flipped
  (its middle one), as a broken proxy or disk would; HEAD answers (size, etag) are the hub's.
* ``served[(method, url path)]``: body bytes sent to the client, per request path; ``requests``: every
  ``(method, url path, Range header or None)`` in arrival order.
* ``ranges = True``: a ``GET`` with ``Range: bytes=a-`` or ``bytes=a-b`` is answered ``206`` with that slice
  of the hub's body (``Content-Range``), as the Hub's CDN does; olah itself ignores ``Range``.
* ``gated = {repo, ...}``: every request of the repo (its API and its files) is answered ``401`` with
  ``X-Error-Code: GatedRepo``, as the Hub answers a gated repo to a client without access.
* ``stall[path] = n``: a ``GET .../resolve/<rev>/<path>`` sends its first ``n`` body bytes, then holds the
  connection open without sending more (until the client goes away): a download to kill mid-file.

Every other request and header passes through unchanged, except redirects to olah itself, which point
back at the proxy (what nginx's ``proxy_redirect`` does).
"""

from __future__ import annotations

import http.client
import json
import sys
import threading
import time
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse

_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "proxy-connection", "upgrade", "te", "trailer"}


class HubProxy:
    """``with HubProxy(upstream_endpoint) as p: ... p.endpoint``; set ``p.redact`` / ``p.corrupt`` first."""

    def __init__(self, upstream: str) -> None:
        u = urlparse(upstream)
        self.upstream = (u.hostname or "127.0.0.1", u.port or 80)
        self.redact: dict[str, dict[str, str]] = {}
        self.corrupt: dict[str, set[str]] = {}
        self.served: dict[tuple[str, str], int] = defaultdict(int)
        self.requests: list[tuple[str, str, str | None]] = []
        self.ranges = False
        self.stall: dict[str, int] = {}
        self.gated: set[str] = set()
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                proxy._forward(self, "GET")

            def do_HEAD(self) -> None:  # noqa: N802
                proxy._forward(self, "HEAD")

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: object, client_address: object) -> None:
                if not isinstance(sys.exc_info()[1], ConnectionError):  # a client may close early (a range read)
                    super().handle_error(request, client_address)  # type: ignore[arg-type]

        self._server = Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> HubProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _forward(self, h: BaseHTTPRequestHandler, method: str) -> None:
        conn = http.client.HTTPConnection(*self.upstream, timeout=60)
        asked = h.headers.get("Range")
        with self._lock:
            self.requests.append((method, unquote(urlparse(h.path).path), asked))
        if any(f"/{repo}/" in unquote(urlparse(h.path).path) + "/" for repo in self.gated):
            body = json.dumps({"error": "Access to this model is restricted. You must have access to it."}).encode()
            h.send_response(401)
            for k, v in (("X-Error-Code", "GatedRepo"), ("X-Error-Message", "Access to this model is restricted."),
                         ("Content-Type", "application/json"), ("Content-Length", str(len(body)))):
                h.send_header(k, v)
            h.end_headers()
            if method == "GET":
                h.wfile.write(body)
            return
        headers = {k: v for k, v in h.headers.items() if k.lower() not in _HOP and k.lower() not in ("host", "range")}
        conn.request(method, h.path, headers=headers)
        resp = conn.getresponse()
        body = resp.read() if method == "GET" else b""
        up = f"http://{self.upstream[0]}:{self.upstream[1]}"
        out_headers = [(k, v.replace(up, self.endpoint) if k.lower() == "location" else v)  # as nginx's proxy_redirect
                       for k, v in resp.getheaders() if k.lower() not in _HOP]
        length = resp.getheader("Content-Length")
        conn.close()
        path = unquote(urlparse(h.path).path)
        status = resp.status
        if method == "GET" and resp.status == 200:
            body = self._rewrite(path, body)
            length = str(len(body))
            if asked and self.ranges and asked.startswith("bytes="):
                first, _, last = asked[len("bytes="):].partition("-")
                total, start = len(body), int(first)
                end = min(int(last) + 1 if last else total, total)
                body, status, length = body[start:end], 206, str(end - start)
                out_headers.append(("Content-Range", f"bytes {start}-{end - 1}/{total}"))
        h.send_response(status)
        for k, v in out_headers:
            h.send_header(k, v)
        h.send_header("Content-Length", length or "0")
        h.end_headers()
        if method == "GET":
            stall = next((n for p, n in self.stall.items() if "/resolve/" in path and path.endswith("/" + p)), None)
            h.wfile.write(body if stall is None else body[:stall])
            with self._lock:
                self.served[(method, path)] += len(body) if stall is None else min(stall, len(body))
            if stall is not None:
                h.wfile.flush()
                while True:  # hold the connection until the client is killed (the server thread is a daemon)
                    time.sleep(0.5)

    def _rewrite(self, path: str, body: bytes) -> bytes:
        for repo, rules in self.redact.items():
            if path.startswith(f"/api/models/{repo}/tree/"):
                entries = json.loads(body)
                for e in entries:
                    how = rules.get(e.get("path"))
                    if how is not None:
                        value = "*" * (64 if "lfs" in e else 40) if how == "asterisks" else None
                        if "lfs" in e:
                            e["lfs"]["oid"] = value
                        else:
                            e["oid"] = value
                return json.dumps(entries).encode()
        for repo, paths in self.corrupt.items():
            prefix = f"/{repo}/resolve/"
            if path.startswith(prefix) and path[len(prefix):].split("/", 1)[-1] in paths and body:
                flipped = bytearray(body)
                flipped[len(flipped) // 2] ^= 0xFF
                return bytes(flipped)
        return body
