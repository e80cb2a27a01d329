"""A warm process that answers :mod:`modelyard.checks.hf`'s questions with transformers already imported.

The first question verify asks transformers about a folder costs a cold process 3 to 5 s of imports
(torch, then transformers' configuration machinery, which imports ``torch.distributed.tensor``,
``torch._dynamo`` and accelerate: benchmarks/README.md, "Everyday commands"), whatever the folder's
size. A worker pays them once and then answers in milliseconds:

``modelyard server start`` starts one beside the Prefect server (its pid and socket, in a 0700 temp
folder, are in ``server.json``; ``server stop`` stops it), and commands of that store ask it
(:func:`modelyard.flows.server.use_facts_worker`).

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

import argparse
import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

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
_TMP_PREFIX = "modelyard-facts-"
_dead: set[str] = set()  # sockets that failed in this process: not asked again


def _libraries() -> dict[str, str | None]:
    from modelyard.checks.hf import LIBRARIES  # noqa: PLC0415 - a cycle at import time otherwise

    return library_versions(LIBRARIES)


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
    req = {"v": PROTOCOL, "code": code_digest(), "libraries": _libraries(), "session": session,
           "root": str(Path(root).absolute()), "name": name}
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            _connect(s, path)
            s.settimeout(timeout)
            s.sendall(json.dumps(req).encode() + b"\n")
            reply = _read_line(s)
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


def _read_line(s: socket.socket) -> bytes:
    buf = bytearray()
    while not buf.endswith(b"\n"):
        chunk = s.recv(1 << 16)
        if not chunk:
            raise OSError("the facts worker closed the connection")
        buf += chunk
    return bytes(buf)


def wait_ready(path: str, timeout: float) -> bool:
    """Block until the worker at ``path`` accepts a connection (its imports done), at most ``timeout``
    seconds; True when it does."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            _connect(s, path)
            s.settimeout(timeout)
            s.sendall(b"{}\n")
            return json.loads(_read_line(s)).get("ready") is True
    except (OSError, ValueError, AttributeError):
        return False


def spawn(path: str, *, with_parent: bool, log: Any = subprocess.DEVNULL) -> subprocess.Popen[bytes]:
    """Start a worker listening on ``path`` (this module's :func:`main`); returns at once
    (its imports take seconds; :func:`ask` waits for it to accept). ``with_parent``: it exits when this
    process dies (Linux ``PR_SET_PDEATHSIG``), else it gets its own session and lives until stopped.
    ``log``: where its output goes (a file object or DEVNULL)."""
    cmd = [sys.executable, "-c", "from modelyard.checks.facts_worker import main; main()", "--socket", path]
    env = dict(os.environ)
    env.pop(ENV, None)
    if with_parent:
        cmd += ["--parent", str(os.getpid())]
    return subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=not with_parent)


def remove_socket_dir(path: str) -> None:
    """Remove the folder :func:`private_socket` made for the socket ``path`` (and the socket); a path in any
    other folder (a hand-edited ``server.json``) is left alone."""
    parent = Path(path).parent
    if parent.name.startswith(_TMP_PREFIX) and parent.parent == Path(tempfile.gettempdir()):
        shutil.rmtree(parent, ignore_errors=True)


def private_socket() -> str:
    """A socket path for a worker, in a fresh 0700 temp folder."""
    return str(Path(tempfile.mkdtemp(prefix=_TMP_PREFIX)) / "facts.sock")


# --------------------------------------------------------------------------- worker

def _warm() -> None:
    """The imports the first question would pay: torch, transformers' config, tokenizer, auto-class tables,
    checkpoint conversion and the Llama modelling code (the most common architecture family)."""
    import torch  # noqa: PLC0415, F401
    from transformers import AutoConfig, AutoTokenizer  # noqa: PLC0415, F401
    from transformers.conversion_mapping import get_checkpoint_conversion_mapping  # noqa: PLC0415
    from transformers.models.auto import modeling_auto  # noqa: PLC0415, F401

    AutoConfig.for_model("llama")
    get_checkpoint_conversion_mapping("llama")
    try:
        import transformers  # noqa: PLC0415

        transformers.LlamaForCausalLM  # noqa: B018 - imports the modelling code
    except Exception:
        pass


def _answer(sessions: OrderedDict[str, Any], req: dict[str, Any]) -> dict[str, Any]:
    from modelyard.checks.hf import HFFacts  # noqa: PLC0415
    from modelyard.model.checkpoint import Checkpoint  # noqa: PLC0415

    if req == {}:
        return {"ok": True, "ready": True}
    if req.get("v") != PROTOCOL:
        return {"ok": False, "error": f"protocol {req.get('v')!r}, this worker speaks {PROTOCOL}"}
    if req.get("code") != code_digest() or req.get("libraries") != _libraries():
        return {"ok": False, "error": "stale: this worker runs other modelyard code or other library versions"}
    root, session, name = req.get("root"), req.get("session"), req.get("name")
    if not (isinstance(root, str) and isinstance(session, str) and isinstance(name, str)):
        return {"ok": False, "error": "root, session and name must be strings"}
    key = f"{session}\0{root}"
    if key not in sessions:
        ckpt = Checkpoint(Path(root))
        sessions[key] = (ckpt, HFFacts(ckpt, None))
        while len(sessions) > SESSIONS:
            sessions.popitem(last=False)
    sessions.move_to_end(key)
    _ckpt, facts = sessions[key]
    kind, _, arg = name.partition(":")
    calls = {"config_error": facts.config_error, "model_type": facts.model_type, "tokenizer": facts.tokenizer,
             "class": facts.has_class, "backbone": facts.backbone, "causal": facts.causal,
             "parameters": facts.parameters, "conversion": facts.conversion}
    call = calls.get(kind)
    if call is None or bool(arg) != (kind in ("class", "backbone", "causal", "parameters", "conversion")):
        return {"ok": False, "error": f"unknown question {name!r}"}
    call(arg) if arg else call()
    return {"ok": True, "value": facts.memo[name]}


def serve(path: str, parent: int | None = None) -> None:
    """Import, then answer on the Unix socket ``path`` until SIGTERM (or, with ``parent``, until that
    process is gone); one question per connection, one at a time."""
    if parent is not None:
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG
        except (AttributeError, OSError):
            pass
        if os.getppid() != parent:
            return
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).unlink(missing_ok=True)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        srv.bind(path)
    finally:
        os.umask(old)
    srv.listen(64)  # bound before the imports: a client's connection waits in the backlog meanwhile
    _warm()
    sessions: OrderedDict[str, Any] = OrderedDict()
    try:
        while True:
            conn, _ = srv.accept()
            with conn:
                try:
                    conn.settimeout(30.0)
                    req = json.loads(_read_line(conn))
                    reply = _answer(sessions, req) if isinstance(req, dict) else {"ok": False, "error": "not an object"}
                except (OSError, ValueError) as exc:
                    reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
                except Exception as exc:  # a question that crashes answers "no": the client computes it itself
                    reply = {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:200]}"}
                try:
                    conn.sendall(json.dumps(reply, separators=(",", ":")).encode() + b"\n")
                except (OSError, TypeError, ValueError):
                    pass
    finally:
        srv.close()
        Path(path).unlink(missing_ok=True)
        if Path(path).parent.name.startswith(_TMP_PREFIX):  # the folder private_socket() made for it
            with contextlib.suppress(OSError):
                Path(path).parent.rmdir()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="modelyard facts worker", description=__doc__.splitlines()[0])
    ap.add_argument("--socket", required=True, help="the Unix socket to listen on")
    ap.add_argument("--parent", type=int, help="exit when this process is gone")
    a = ap.parse_args(argv)
    serve(a.socket, a.parent)

