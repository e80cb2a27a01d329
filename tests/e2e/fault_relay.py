"""A fault injector for the rollout tests: an HTTP relay on 127.0.0.1 in front of a real vLLM server.

The canary the rollout judges and nginx routes to is this relay's address. While ``mode`` is ``"pass"`` it
forwards every request to the vLLM server and its answer back unchanged (status, headers, body; a streamed
answer whole, once vLLM finished it). The faults it injects are the ones the rollout must survive:

- ``die(after=N)``: after N more ``/v1/`` requests of the rollout's own smoke it stops listening (connection refused, as a crashed
  canary): a canary that dies mid-step;
- ``mode = "500"``: every ``/v1/`` request is answered 500 with an OpenAI-style error body;
- ``mode = "garbage"``: answers pass through with the text of every choice replaced (``"text"``,
  ``message.content`` and streamed ``delta.content``): a canary that answers, but nonsense.

It counts the ``/v1/`` requests it answered and those it answered with a status other than 200.
"""

from __future__ import annotations

import http.client
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.e2e.publish_servers import free_port

GARBAGE = "zq xv zq"
_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "proxy-connection", "upgrade"}


def _garble(doc: Any) -> Any:
    for choice in (doc.get("choices") or []) if isinstance(doc, dict) else []:
        if isinstance(choice.get("text"), str):
            choice["text"] = GARBAGE
        for key in ("message", "delta"):
            if isinstance(choice.get(key), dict) and isinstance(choice[key].get("content"), str):
                choice[key]["content"] = GARBAGE
    return doc


def garble_body(body: bytes, content_type: str) -> bytes:
    """``body`` with every choice's text replaced by :data:`GARBAGE`: a JSON answer, or each ``data:`` event
    of a server-sent-event stream."""
    if "event-stream" in content_type:
        lines = []
        for line in body.decode().split("\n"):
            if line.startswith("data: {"):
                line = "data: " + json.dumps(_garble(json.loads(line[6:])))
            lines.append(line)
        return "\n".join(lines).encode()
    if "json" in content_type:
        try:
            return json.dumps(_garble(json.loads(body))).encode()
        except ValueError:
            return body
    return body


class FaultRelay:
    """The relay (see the module docstring); ``base`` is its URL. Use as a context manager."""

    def __init__(self, upstream: str) -> None:
        host, _, port = upstream.removeprefix("http://").rstrip("/").partition(":")
        self.upstream = (host, int(port))
        self.mode = "pass"
        self.answered = 0
        self.errors = 0
        self._die_after: int | None = None
        self._lock = threading.Lock()
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> FaultRelay:
        relay = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def _relay(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else None
                api = self.path.startswith("/v1/")
                if api and relay.mode == "500":
                    self._answer(500, {"Content-Type": "application/json"},
                                 b'{"error": {"message": "injected fault", "type": "InternalServerError", "code": 500}}')
                    relay._count(500, direct=self.headers.get("X-Forwarded-For") is None)
                    return
                conn = http.client.HTTPConnection(*relay.upstream, timeout=600)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                    conn.request(self.command, self.path, body=body, headers=headers)
                    r = conn.getresponse()
                    data = r.read()
                    out = {k: v for k, v in r.getheaders() if k.lower() not in _HOP}
                finally:
                    conn.close()
                if api and relay.mode == "garbage":
                    data = garble_body(data, r.getheader("Content-Type") or "")
                self._answer(r.status, out, data)
                if api:
                    relay._count(r.status, direct=self.headers.get("X-Forwarded-For") is None)

            def _answer(self, status: int, headers: dict[str, str], data: bytes) -> None:
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Connection", "close")
                self.end_headers()
                try:
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client left (a rollout stopped by a signal): nothing to answer
                self.close_connection = True

            do_GET = do_POST = _relay

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def _count(self, status: int, direct: bool) -> None:
        with self._lock:
            self.answered += 1
            self.errors += status != 200
            if self._die_after is not None and direct:
                self._die_after -= 1
                if self._die_after <= 0:
                    self._die_after = None
                    threading.Thread(target=self.stop, daemon=True).start()

    def die(self, after: int = 0) -> None:
        """Stop listening after ``after`` more ``/v1/`` requests sent to it directly (not through nginx, which sets
        ``X-Forwarded-For``: the rollout's smoke of the canary); 0: now."""
        if after <= 0:
            self.stop()
        else:
            with self._lock:
                self._die_after = after

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FaultRelay:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
