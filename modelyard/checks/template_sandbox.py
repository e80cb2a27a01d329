"""The sandboxed rendering of a chat template: jinja2's ``ImmutableSandboxedEnvironment`` (the environment
transformers' ``apply_chat_template`` and so vLLM render in) in a child Python with a time, an address-space and an
output limit, over sample conversations whose user texts are sentinels. :mod:`modelyard.checks.template_risk`
reads what it returns; the tokenizer facts ask :func:`stopped_by_limits` before transformers renders in-process.

Sources: jinja2's sandbox documentation; transformers ``utils/chat_template_utils.py`` (``trim_blocks``,
``lstrip_blocks``, ``loopcontrols``, the ``generation`` tag, ``raise_exception``, ``strftime_now``, ``tojson``)."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

#: seconds the child process may spend rendering all the sample conversations
RENDER_SECONDS = 10.0
#: address space (bytes) of the rendering child: a template that doubles a string until it fills
#: memory stops here instead of taking the host
RENDER_MEMORY_BYTES = 1 << 30
#: characters one rendering may produce (a prompt template renders a few kilobytes)
RENDER_OUTPUT_CHARS = 1 << 20


@dataclass(frozen=True)
class Rendered:
    """One sandboxed rendering: ``text`` (None when it failed), ``error`` (``ExcType: message``) and
    ``kind``: ``ok``, ``security`` (a jinja2 ``SecurityError``), ``error``, ``output_limit`` or ``memory``."""

    text: str | None
    error: str | None
    kind: str


#: the child process: stdlib + jinja2 only; reads {template, conversations, bos_token, eos_token, limit,
#: memory} as JSON on stdin and writes one JSON list of {text, error, kind}
_CHILD = r'''
import json, resource, sys
req = json.loads(sys.stdin.read())
try:
    resource.setrlimit(resource.RLIMIT_AS, (req["memory"], req["memory"]))
except (ValueError, OSError):
    pass
from datetime import datetime
from jinja2 import nodes
from jinja2.exceptions import SecurityError, TemplateError
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

class Generation(Extension):
    tags = {"generation"}
    def parse(self, parser):
        next(parser.stream)
        return nodes.Scope(parser.parse_statements(("name:endgeneration",), drop_needle=True))

def raise_exception(message):
    raise TemplateError(message)

env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                    extensions=["jinja2.ext.loopcontrols", Generation])
env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: json.dumps(
    x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
env.globals["raise_exception"] = raise_exception
NOW = [datetime(2026, 1, 1)]
env.globals["strftime_now"] = lambda fmt: NOW[0].strftime(fmt)
out = []
try:
    tpl = env.from_string(req["template"])
except MemoryError:
    tpl, first = None, {"text": None, "error": "MemoryError while compiling", "kind": "memory"}
except Exception as exc:
    tpl, first = None, {"text": None, "error": f"{type(exc).__name__}: {str(exc)[:300]}", "kind": "error"}
for conv in req["conversations"]:
    if tpl is None:
        out.append(first)
        continue
    parts, size = [], 0
    NOW[0] = datetime.fromisoformat(conv.get("date", "2026-01-01"))
    try:
        for piece in tpl.generate(messages=conv["messages"], tools=conv.get("tools"), add_generation_prompt=True,
                                  bos_token=req["bos_token"], eos_token=req["eos_token"]):
            parts.append(piece)
            size += len(piece)
            if size > req["limit"]:
                raise OverflowError(f"more than {req['limit']} characters")
        out.append({"text": "".join(parts), "error": None, "kind": "ok"})
    except SecurityError as exc:
        out.append({"text": None, "error": f"SecurityError: {str(exc)[:300]}", "kind": "security"})
    except OverflowError as exc:
        out.append({"text": None, "error": str(exc), "kind": "output_limit"})
    except MemoryError:
        out.append({"text": None, "error": "MemoryError", "kind": "memory"})
    except Exception as exc:
        out.append({"text": None, "error": f"{type(exc).__name__}: {str(exc)[:300]}", "kind": "error"})
    parts = []
sys.stdout.write(json.dumps(out))
'''

#: sentinels that stand for what the user writes (never part of a template's own text)
SYSTEM, USER, ASSISTANT, USER2 = "QQsystemQQ", "QQuserQQ", "QQanswerQQ", "QQagainQQ"
#: the conversations rendered: the user's own system message, none, several turns, tools offered (tool
#: branches render too), and a far-future date (``strftime_now``)
CONVERSATIONS: tuple[dict[str, Any], ...] = (
    {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}]},
    {"messages": [{"role": "user", "content": USER}]},
    {"messages": [{"role": "user", "content": USER}, {"role": "assistant", "content": ASSISTANT},
                  {"role": "user", "content": USER2}]},
    {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}],
     "tools": [{"type": "function", "function": {"name": "get_weather", "description": "QQtoolQQ",
                                                 "parameters": {"type": "object", "properties": {}}}}]},
    # a date far ahead: a template that turns hostile after a date renders its payload here
    {"messages": [{"role": "user", "content": USER}], "date": "2099-12-31"},
)


def sandbox_render(source: str, *, bos_token: str = "", eos_token: str = "",
                   conversations: tuple[dict[str, Any], ...] = CONVERSATIONS, timeout: float = RENDER_SECONDS,
                   memory: int = RENDER_MEMORY_BYTES, limit: int = RENDER_OUTPUT_CHARS) -> list[Rendered] | str:
    """Render ``source`` for each of ``conversations`` in ``ImmutableSandboxedEnvironment``, in a child
    Python (``sys.executable -I``) with ``memory`` bytes of address space, ``limit`` characters per
    rendering and ``timeout`` seconds for them all. Returns one :class:`Rendered` per conversation, or a
    string saying which limit stopped the child (``"no answer within 10 s"``) when it did not finish."""
    req = json.dumps({"template": source, "conversations": list(conversations), "bos_token": bos_token,
                      "eos_token": eos_token, "limit": limit, "memory": memory})
    try:
        done = subprocess.run([sys.executable, "-I", "-c", _CHILD], input=req, capture_output=True, text=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return f"no answer within {timeout:g} s"
    try:
        return [Rendered(r["text"], r["error"], r["kind"]) for r in json.loads(done.stdout)]
    except (ValueError, KeyError, TypeError):
        tail = (done.stderr or "").strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
        return f"the rendering process died ({tail[0][:200]})"


@functools.lru_cache(maxsize=16)
def rendered_once(source: str, bos_token: str = "", eos_token: str = "") -> tuple[Rendered, ...] | str:
    """:func:`sandbox_render` of the sample conversations, once per (template, bos, eos) in this process:
    the security check and the tokenizer facts ask the same question."""
    got = sandbox_render(source, bos_token=bos_token, eos_token=eos_token)
    return got if isinstance(got, str) else tuple(got)


def stopped_by_limits(source: str, bos_token: str = "", eos_token: str = "") -> str | None:
    """Why rendering ``source`` in-process would be unsafe (the sandboxed child hit a time, memory or
    output limit, or the sandbox refused it), or None. transformers renders in-process with no limit: a
    nested-loop template held verify for minutes and a doubling one took gigabytes before this guard."""
    got = rendered_once(source, bos_token, eos_token)
    if isinstance(got, str):
        return got
    bad = next((r for r in got if r.kind in ("security", "output_limit", "memory")), None)
    return bad.error if bad else None
