"""Chat templates rendered as the runtime renders them: one conversation with a sentinel reply (to find the
turn terminator and the role markers), and the conversation shapes users send (OpenAI chat API). Each
function takes a transformers tokenizer and never raises for a template's own failure."""

from __future__ import annotations

import re
from typing import Any

_SENTINEL = "modelyardsentinelreply"
_CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": _SENTINEL},
]


def render_conversation(tok: Any) -> tuple[str | None, str | None, bool]:
    """Render system+user+assistant through the chat template: ``(text, error, system_dropped)``.

    Retries without the system message when the template rejects it (Gemma, Mistral v1)."""
    last = None
    for msgs, dropped in ((_CONVERSATION, False), (_CONVERSATION[1:], True)):
        try:
            return tok.apply_chat_template(msgs, tokenize=False), None, dropped
        except Exception as exc:  # jinja2 TemplateError, raise_exception(...) in the template, ...
            last = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    return None, last, False


_TOOL = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                          "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                         "required": ["city"]}}}
#: the conversation shapes users send (OpenAI chat API), each rendered with and without add_generation_prompt
SHAPES: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]] | None]] = {
    "system+user": ([_CONVERSATION[0], _CONVERSATION[1]], None),
    "user": ([_CONVERSATION[1]], None),
    "user+user": ([_CONVERSATION[1], {"role": "user", "content": "And of Italy?"}], None),
    "multi-turn": ([_CONVERSATION[1], {"role": "assistant", "content": "Paris."},
                    {"role": "user", "content": "And of Italy?"}], None),
    "tool-call": ([{"role": "user", "content": "What is the weather in Paris?"},
                   {"role": "assistant", "content": "", "tool_calls": [
                       {"id": "call_1", "type": "function",
                        "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
                   {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "18 C, sunny"}],
                  [_TOOL]),
}


def render_shapes(tok: Any) -> list[list[Any]]:
    """Render each of :data:`SHAPES` through the chat template, with and without ``add_generation_prompt``:
    ``[[shape, add_generation_prompt, error or None], ...]`` (``error`` "ExcType: first line"). vLLM's chat
    endpoint renders every request through ``apply_chat_template`` this way (``tools`` passed for the
    tool-call shape), so a shape that raises here is an HTTP 400 for every request of that shape."""
    out: list[list[Any]] = []
    for name, (msgs, tools) in SHAPES.items():
        for gen in (True, False):
            err = None
            try:
                tok.apply_chat_template(msgs, tools=tools, add_generation_prompt=gen, tokenize=False)
            except Exception as exc:  # jinja2 TemplateError, raise_exception(...) in the template, ...
                err = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            out.append([name, gen, err])
    return out


def turn_terminator(tok: Any, rendered: str) -> tuple[str, int] | None:
    """The special token that closes the assistant's turn in ``rendered``: ``(content, id)``, or None
    when the text after the reply does not start with an added/special token."""
    idx = rendered.rfind(_SENTINEL)
    if idx < 0:
        return None
    rest = rendered[idx + len(_SENTINEL):].lstrip(" \t\r\n")
    if not rest:
        return None
    candidates: dict[str, int] = {}
    for tid, added in getattr(tok, "added_tokens_decoder", {}).items():
        content = getattr(added, "content", str(added))
        candidates[content] = tid
    for t in getattr(tok, "all_special_tokens", []):
        tid = tok.convert_tokens_to_ids(t)
        if isinstance(tid, int):
            candidates.setdefault(t, tid)
    best = max((c for c in candidates if c and rest.startswith(c)), key=len, default=None)
    return (best, candidates[best]) if best else None


#: what a chat template's role headers and turn terminators look like: ``<|...|>`` (ChatML, Llama 3, Phi) and
#: ``<name>``/``</name>`` (``<s>``, ``<start_of_turn>``, ``<end_of_turn>``)
_MARKER = re.compile(r"<\|[^<>|\s]{1,60}\|>|</?[A-Za-z_][A-Za-z0-9_]{0,40}>")


def split_markers(tok: Any, rendered: str) -> list[list[Any]]:
    """The markers of ``rendered`` (a template's rendering of :data:`_CONVERSATION`, with the conversation's own
    text taken out) that the tokenizer does not encode as one token: ``[[marker, [pieces]], ...]``. Every
    ``<|...|>`` marker is judged; a ``<name>`` marker only when the vocabulary holds it as a token. A model
    learnt each marker as one token; split into pieces it reaches the model as text it never saw in training
    (the Gemma GGUF import that split words had this failure too)."""
    text = rendered
    for m in _CONVERSATION:
        text = text.replace(m["content"], " ")
    out: list[list[Any]] = []
    vocab = tok.get_vocab()
    for marker in dict.fromkeys(_MARKER.findall(text)):
        if not marker.startswith("<|") and marker not in vocab:
            continue  # a <name> the vocabulary does not hold is the template's plain text (Llama 2's <<SYS>>)
        ids = tok.encode(marker, add_special_tokens=False)
        if len(ids) != 1 or tok.convert_ids_to_tokens(ids)[0] != marker:  # pieces, or the unknown token
            out.append([marker, [str(p) for p in tok.convert_ids_to_tokens(ids)]])
    return out
