"""A TCP relay on 127.0.0.1 in front of a real server (the registry) that holds one direction of the traffic at a
byte count until the test lets it go: a transfer stopped at a known point without polling (no race with a loaded
machine). It relays bytes unchanged; it is no mock of the server."""

from __future__ import annotations

import contextlib
import socket
import threading


class GateRelay:
    """Relay ``127.0.0.1:<port>`` (``address``) to ``upstream`` (``host:port``). Once ``after`` bytes (all
    connections together) have gone the ``held`` way (``"answers"``: server to client, ``"requests"``: client to
    server), every further chunk that way waits (``holding`` is set) until ``release`` is set; ``relayed`` counts
    the bytes passed that way. With ``at`` (``b"PATCH "``), the hold starts at the first chunk past ``after`` that
    begins with it: at a request's first byte, not in the middle of one. ``cut()`` drops what is held and ends those
    connections; ``close()`` releases and stops accepting."""

    def __init__(self, upstream: str, after: int, held: str = "answers", at: bytes | None = None) -> None:
        host, _, port = upstream.rpartition(":")
        self._upstream = (host, int(port))
        self._after = after
        self._held = held
        self._at = at
        self.relayed = 0
        self._lock = threading.Lock()
        self.holding = threading.Event()
        self.release = threading.Event()
        self._cut = False
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self._upstream)
            threading.Thread(target=self._pipe, args=(client, server, self._held == "requests"), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, self._held == "answers"), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, gated: bool) -> None:
        with contextlib.suppress(OSError):
            while chunk := src.recv(1 << 16):
                if gated and not self.release.is_set():
                    with self._lock:
                        over = self.relayed + len(chunk) > self._after if self._at is None else \
                            self.relayed >= self._after and chunk.startswith(self._at)
                        if not over:
                            self.relayed += len(chunk)
                    if over:
                        self.holding.set()
                        self.release.wait()
                        if self._cut:  # the held bytes never reach the other side: the connection just ends
                            break
                        with self._lock:
                            self.relayed += len(chunk)
                elif gated:
                    with self._lock:
                        self.relayed += len(chunk)
                dst.sendall(chunk)
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        """End every held connection without passing its held bytes on (as if the client died before sending
        them), and let everything after pass."""
        self._cut = True
        self.release.set()

    def close(self) -> None:
        self.release.set()
        self._listener.close()
