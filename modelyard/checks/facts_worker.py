"""A warm process that answers :mod:`modelyard.checks.hf`'s questions with transformers already imported.

The first question verify asks transformers about a folder costs a cold process 3 to 5 s of imports
(torch, then transformers' configuration machinery, which imports ``torch.distributed.tensor``,
``torch._dynamo`` and accelerate: benchmarks/README.md, "Everyday commands"), whatever the folder's
size. A worker pays them once and then answers in milliseconds:

``modelyard server start`` starts one beside the Prefect server (its pid and socket, in a 0700 temp
folder, are in ``server.json``; ``server stop`` stops it), and commands of that store ask it
(:func:`modelyard.runtime.prefect_server.use_facts_worker`). The worker itself, its process and its
socket folder, is :mod:`modelyard.runtime.facts_server`; this module is the client and the protocol.

The client side is :func:`ask`, called by :meth:`modelyard.checks.hf.HFFacts._get` for a question that
is not in the facts cache, when ``MODELYARD_FACTS_WORKER`` names a socket (the CLI sets it). One
connection per question; the request and the reply are one JSON line each over a Unix socket
(mode 0600, in a folder only its user can enter)::

    {"v": 1, "code": <modelyard code digest>, "libraries": {...}, "session": "<id>", "root": "/abs/folder",
     "name": "parameters:LlamaForCausalLM"}
    {"ok": true, "value": <the answer, as the facts cache stores it>}   or   {"ok": false, "error": "..."}

The worker answers only a client with its own code digest and library versions (the facts cache key's
inputs), so a worker started before an upgrade is never asked. It computes with the same
:class:`~modelyard.checks.hf.HFFacts` code, on its own :class:`~modelyard.model.checkpoint.Checkpoint`
of the folder per client session, so an answer is the one the client would have computed. Any failure
(no socket, a timeout, a refusal) makes the client compute the answer itself: the worker changes how
fast verify is, never what it says.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from modelyard.checks.versions import FACTS_LIBRARIES
from modelyard.unixsock import read_line
from modelyard.version import code_digest, library_versions

PROTOCOL = 1
#: environment variable that names the worker's socket for this process and its children
ENV = "MODELYARD_FACTS_WORKER"
#: seconds a client waits for one answer (a worker still importing takes seconds, a meta-device model of a
#: 400B config a few more); past it the client answers itself and does not ask that worker again
ANSWER_TIMEOUT = 60.0
#: seconds a client waits to connect (the worker accepts once its imports are done)
CONNECT_TIMEOUT = 60.0
#: seconds a client retries a socket that does not exist yet
START_GRACE = 5.0
#: sessions (client checkpoints, each with its config and tokenizer objects) a worker keeps; the oldest goes first
SESSIONS = 4
#: what :func:`ask` returns when it has no answer
MISS = object()
TMP_PREFIX = "modelyard-facts-"
_dead: set[str] = set()  # sockets that failed in this process: not asked again


def libraries() -> dict[str, str | None]:
    """The versions of the libraries a worker's answers depend on (both sides must have the same)."""
    return library_versions(FACTS_LIBRARIES)


# --------------------------------------------------------------------------- client

def socket_path() -> str | None:
    """The worker socket this process may ask (``MODELYARD_FACTS_WORKER``), None when unset, ``off`` or
    already failed in this process."""
    p = os.environ.get(ENV) or None
    if p is None or p.lower() in ("off", "none", "0") or p in _dead:
        return None
    return p


def ask(root: str, session: str, name: str, *, path: str | None = None, timeout: float = ANSWER_TIMEOUT) -> Any:
    """The worker's answer to question ``name`` (an :class:`~modelyard.checks.hf.HFFacts` memo key, e.g.
    ``tokenizer`` or ``parameters:LlamaForCausalLM``) about the folder ``root`` (made absolute), in the form
    the facts cache stores; :data:`MISS` when there is no worker or it cannot answer (the socket is then
    not asked again by this process). Never raises."""
    path = path or socket_path()
    if path is None:
        return MISS
    req = {"v": PROTOCOL, "code": code_digest(), "libraries": libraries(), "session": session,
           "root": str(Path(root).absolute()), "name": name}
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            _connect(s, path)
            s.settimeout(timeout)
            s.sendall(json.dumps(req).encode() + b"\n")
            reply = read_line(s)
        d = json.loads(reply)
    except (OSError, ValueError):
        _dead.add(path)
        return MISS
    if not isinstance(d, dict) or d.get("ok") is not True or "value" not in d:
        _dead.add(path)
        return MISS
    return d["value"]


def _connect(s: socket.socket, path: str) -> None:
    """Connect, retrying for :data:`START_GRACE` s while the socket does not exist yet (a worker just
    spawned binds it within a fraction of a second, before its imports)."""
    deadline = time.monotonic() + START_GRACE
    s.settimeout(CONNECT_TIMEOUT)
    while True:
        try:
            s.connect(path)
            return
        except (FileNotFoundError, ConnectionRefusedError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def wait_ready(path: str, timeout: float) -> bool:
    """Block until the worker at ``path`` accepts a connection (its imports done), at most ``timeout``
    seconds; True when it does."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            _connect(s, path)
            s.settimeout(timeout)
            s.sendall(b"{}\n")
            return json.loads(read_line(s)).get("ready") is True
    except (OSError, ValueError, AttributeError):
        return False
