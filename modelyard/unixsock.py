"""Stdlib only: what the warm worker processes and their clients share about a private Unix socket. Imported by
the facts worker (client and server) and the engine host's client; loaded by path (``runpy``) by the engine host
itself, which runs in the vLLM interpreter and must not import modelyard."""

from __future__ import annotations

import ctypes
import os
import signal
import socket

PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int) -> bool:
    """Ask Linux to SIGTERM this process when ``parent`` dies (``prctl(PR_SET_PDEATHSIG)``, prctl(2)); False when
    ``parent`` is already gone (the caller then exits). Elsewhere only the check."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    except (AttributeError, OSError):
        pass
    return os.getppid() == parent


def listen_private(path: str, backlog: int = 64) -> socket.socket:
    """A Unix socket bound at ``path`` with mode 0600 (umask 0177 while binding) and listening; a connection made
    before the caller accepts waits in the ``backlog``."""
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        srv.bind(path)
    finally:
        os.umask(old)
    srv.listen(backlog)
    return srv


def read_line(s: socket.socket, limit: int = 1 << 20) -> bytes:
    """One newline-terminated message from ``s``; raises :class:`OSError` when the peer closes first and
    :class:`ValueError` past ``limit`` bytes."""
    buf = bytearray()
    while not buf.endswith(b"\n"):
        chunk = s.recv(1 << 16)
        if not chunk:
            raise OSError("the peer closed the connection before a whole line")
        buf += chunk
        if len(buf) > limit:
            raise ValueError(f"a message over {limit} bytes")
    return bytes(buf)
