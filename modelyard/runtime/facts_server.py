"""The warm facts worker's process: it imports transformers once and answers
:mod:`modelyard.checks.facts_worker`'s questions (that module is the client and the protocol) with the
same :class:`~modelyard.checks.hf.HFFacts` code the client would run itself.

Started by ``modelyard server start`` (:mod:`modelyard.runtime.prefect_server`), in its own session,
or by a test with ``with_parent=True`` (it then exits with its parent)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import OrderedDict
from pathlib import Path
from typing import Any

from modelyard.checks.facts_worker import ENV, PROTOCOL, SESSIONS, TMP_PREFIX, libraries
from modelyard.checks.hf import HFFacts
from modelyard.model.checkpoint import Checkpoint
from modelyard.unixsock import die_with_parent, listen_private, read_line
from modelyard.version import code_digest

#: a word of the worker's command line, by which a recorded pid is known to still be a worker
MARKER = "modelyard.runtime.facts_server"


def spawn(path: str, *, with_parent: bool, log: Any = subprocess.DEVNULL) -> subprocess.Popen[bytes]:
    """Start a worker listening on ``path`` (this module's :func:`main`); returns at once
    (its imports take seconds; :func:`ask` waits for it to accept). ``with_parent``: it exits when this
    process dies (Linux ``PR_SET_PDEATHSIG``), else it gets its own session and lives until stopped.
    ``log``: where its output goes (a file object or DEVNULL)."""
    cmd = [sys.executable, "-c", "from modelyard.runtime.facts_server import main; main()", "--socket", path]
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
    if parent.name.startswith(TMP_PREFIX) and parent.parent == Path(tempfile.gettempdir()):
        shutil.rmtree(parent, ignore_errors=True)


def private_socket() -> str:
    """A socket path for a worker, in a fresh 0700 temp folder."""
    return str(Path(tempfile.mkdtemp(prefix=TMP_PREFIX)) / "facts.sock")



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
    if req == {}:
        return {"ok": True, "ready": True}
    if req.get("v") != PROTOCOL:
        return {"ok": False, "error": f"protocol {req.get('v')!r}, this worker speaks {PROTOCOL}"}
    if req.get("code") != code_digest() or req.get("libraries") != libraries():
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
    if parent is not None and not die_with_parent(parent):
        return
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).unlink(missing_ok=True)
    srv = listen_private(path)  # bound before the imports: a client's connection waits in the backlog meanwhile
    _warm()
    sessions: OrderedDict[str, Any] = OrderedDict()
    try:
        while True:
            conn, _ = srv.accept()
            with conn:
                try:
                    conn.settimeout(30.0)
                    req = json.loads(read_line(conn))
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
        if Path(path).parent.name.startswith(TMP_PREFIX):  # the folder private_socket() made for it
            with contextlib.suppress(OSError):
                Path(path).parent.rmdir()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="modelyard facts worker", description=__doc__.splitlines()[0])
    ap.add_argument("--socket", required=True, help="the Unix socket to listen on")
    ap.add_argument("--parent", type=int, help="exit when this process is gone")
    a = ap.parse_args(argv)
    serve(a.socket, a.parent)

