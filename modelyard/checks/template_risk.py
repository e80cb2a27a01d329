"""What a chat template tries to do, read before anything renders it: ``security.template.*`` findings.

A chat template is a program every chat request runs. vLLM renders it in jinja2's
``ImmutableSandboxedEnvironment`` (through transformers' ``apply_chat_template``), which stops the
known escapes at run time, but a reviewer promoting a checkpoint must know that a template *tries*: a
payload in a branch the sample conversations never reach passes every render, and GGUF chat-template
injection is a documented attack on local runtimes (the template travels inside the weights file).

Two readings, no trust in either alone:

1. **Static** (:func:`static_findings`): the template's Jinja AST (``Environment.parse``; nothing
   executes). Errors for escape attempts (an attribute or key that starts with ``_``, a string naming
   a dunder, attributes of the globals ``cycler``/``joiner``/``namespace``/``lipsum``/``range``/``self``);
   warnings for filters outside the set healthy templates use, ``range()`` bounds built by
   multiplication from the input, string repetition by a computed count, and URLs.
2. **Sandboxed rendering** (:func:`~modelyard.checks.template_sandbox.sandbox_render`), in a child process with a time limit
   (:data:`RENDER_SECONDS`), an address-space limit (:data:`RENDER_MEMORY_BYTES`) and an output limit
   (:data:`RENDER_OUTPUT_CHARS`) per conversation: a ``SecurityError`` is an error, a limit reached is an
   error, and text the template adds to every conversation that the user's own system message does not
   replace (a hidden system prompt) is a warning when it reads as an instruction
   (:data:`INSTRUCTION_CUES`).

Sources: jinja2's sandbox documentation (``jinja2.sandbox``: unsafe attributes are those starting with
``_`` and the function/frame/generator internals; ``str.format`` is intercepted); transformers
``utils/chat_template_utils.py`` (the environment: ``trim_blocks``, ``lstrip_blocks``, ``loopcontrols``, the
``generation`` tag, ``raise_exception``, ``strftime_now``, ``tojson``); vLLM ``entrypoints/chat_utils.py``
(``apply_hf_chat_template``); the GGUF template-injection reports ("Poisoned GGUF templates",
Pillar Security, 2025)."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from modelyard.checks.base import CheckContext, Finding, Severity, check
from modelyard.checks.template_sandbox import (
    ASSISTANT,
    RENDER_MEMORY_BYTES,
    RENDER_OUTPUT_CHARS,
    RENDER_SECONDS,
    SYSTEM,
    USER,
    USER2,
    rendered_once,
)

if TYPE_CHECKING:
    from modelyard.model.checkpoint import Checkpoint

#: bytes of template source read (the largest healthy templates are tens of kilobytes)
MAX_TEMPLATE_BYTES = 4 << 20

SOURCE_SANDBOX = "jinja2.sandbox (ImmutableSandboxedEnvironment), the environment vLLM renders chat templates in"
SOURCE_STATIC = ("jinja2.sandbox unsafe attributes (names starting with _; function, frame and generator "
                 "internals); GGUF chat-template injection reports (Pillar Security, 2025)")

#: filters the chat templates of the known families use, and the other harmless jinja2 built-ins
USUAL_FILTERS = frozenset({
    "abs", "batch", "capitalize", "center", "count", "d", "default", "dictsort", "e", "escape", "first", "float",
    "forceescape", "groupby", "indent", "int", "items", "join", "last", "length", "list", "lower", "map", "max",
    "min", "reject", "rejectattr", "replace", "reverse", "round", "safe", "select", "selectattr", "slice", "sort",
    "string", "striptags", "sum", "title", "tojson", "trim", "truncate", "unique", "upper", "wordcount",
    "wordwrap"})
#: globals whose own attributes a template has no reason to reach (their internals lead out of the sandbox)
GUARDED_GLOBALS = frozenset({"cycler", "joiner", "namespace", "lipsum", "range", "dict", "self"})
#: attribute names of the classic escape chains that do not start with ``_``
ESCAPE_NAMES = frozenset({"mro", "func_globals", "func_code", "f_globals", "f_locals", "f_back", "gi_frame", "gi_code",
                          "cr_frame", "cr_code", "ag_frame", "tb_frame", "im_func", "popen",
                          "import_module", "subprocess", "check_output", "environ"})
#: the Python internals escape chains walk (a template naming one, whole or cut in pieces to be joined, is an error)
DUNDERS = ("__class__", "__mro__", "__subclasses__", "__globals__", "__builtins__", "__init__", "__import__",
           "__base__", "__bases__", "__dict__", "__getattribute__", "__reduce__", "__reduce_ex__", "__code__",
           "__func__", "__self__", "__module__", "__loader__", "__spec__", "__call__", "__getitem__", "__new__",
           "__subclasshook__", "__closure__", "__defaults__", "__kwdefaults__", "__traceback__", "__frame__",
           "__wrapped__", "__qualname__", "__name__", "__getattr__", "__setattr__", "__delattr__", "__weakref__")
_DUNDER = re.compile(r"__[a-z]\w*__|__[a-z]{2,}|[a-z]{2,}__")
_URL = re.compile(r"\b(?:https?|ftp)://[^\s\"'<>]+", re.I)
#: words of an instruction aimed at the user or the model that a chat format never needs
INSTRUCTION_CUES = re.compile(
    r"\b(password|passcode|passphrase|credentials?|api[ _-]?keys?|secret|credit card|bank (?:account|details)|"
    r"wallet|seed phrase|social security|send (?:it|them|us|the|your)|e-?mail (?:it|them|us)|visit|click|"
    r"download|install|ignore (?:all |any )?(?:previous|prior|above|earlier|the user)|disregard|"
    r"(?:do not|don't|never) (?:tell|reveal|mention|disclose)|tell the user|ask the user|"
    r"always (?:say|answer|respond|recommend|mention|include|tell)|recommend|(?:respond|answer|reply|write|speak) only|"
    r"only (?:respond|answer|reply|write|speak)|say (?:that|candidate)|is the (?:best|only)|append|base64|encoded|"
    r"promote|advertis\w*|sponsor\w*|partner|affiliate|https?://\S+)", re.I)
#: tag-like pieces of chat markup (``<|im_start|>``, ``<start_of_turn>``, ``[INST]``, ``<｜User｜>``)
#: and the role name right after such a piece (``<|im_start|>user``); "tell the user" elsewhere stays
_MARKUP = re.compile(r"(?:<\|[^|<>\s]{1,40}\|>|</?[A-Za-z_][\w:.-]{0,40}>|\[/?[A-Z_]{2,30}\]|<\uff5c[^<>]{1,40}\uff5c>)"
                     r"(?:\s*(?:system|user|assistant|developer|tool|ipython|model|human|bot)\b:?)?", re.I)
_INVISIBLE = re.compile("[\u200b-\u200f\u2060-\u2064\ufeff\u00ad]")
#: Greek and Cyrillic letters that render as Latin ones (Unicode's confusables, UTS #39, for the lowercase and
#: uppercase letters of English words): "rec\u03bfmmend" with a Greek omicron reads as "recommend"
_CONFUSABLE = str.maketrans(
    "\u0430\u0435\u043e\u0440\u0441\u0443\u0445\u0456\u0458\u0455\u0501\u04bb\u0410\u0412\u0415\u041a\u041c\u041d"
    "\u041e\u0420\u0421\u0422\u0425\u0406\u0408\u0405\u03bf\u03b1\u03b5\u03b9\u03ba\u03bd\u03c1\u03c4\u03c5\u03c7"
    "\u0391\u0392\u0395\u0396\u0397\u0399\u039a\u039c\u039d\u039f\u03a1\u03a4\u03a5\u03a7",
    "aeopcyxijsdhABEKMHOPCTXIJSoaeikvptuxABEZHIKMNOPTYX")


def folded(text: str) -> str:
    """``text`` as a reader sees it, for matching :data:`INSTRUCTION_CUES`: compatibility forms folded (NFKC:
    fullwidth and mathematical letters), combining marks dropped, Greek and Cyrillic look-alikes read as
    Latin letters."""
    text = unicodedata.normalize("NFKD", unicodedata.normalize("NFKC", text))
    return "".join(c for c in text if not unicodedata.combining(c)).translate(_CONFUSABLE)




def templates_of(ckpt: Checkpoint) -> list[tuple[str, str, str]]:
    """Every chat template of ``ckpt`` that transformers or vLLM may render, as ``(file, field, source)``:
    ``chat_template.jinja``, each ``additional_chat_templates/*.jinja`` (transformers loads them as named
    templates and picks ``tool_use`` whenever a request has tools), ``chat_template.json`` (a processor's),
    and ``tokenizer_config.json``'s ``chat_template`` (a string, or a list of ``{name, template}``: every
    one). A source is read up to one byte past :data:`MAX_TEMPLATE_BYTES` (a longer one is a finding)."""
    out: list[tuple[str, str, str]] = []

    def read(p: Path) -> str:
        with open(p, "rb") as fh:
            return fh.read(MAX_TEMPLATE_BYTES + 1).decode("utf-8", "replace")

    p = ckpt.root / "chat_template.jinja"
    if p.is_file():
        out.append(("chat_template.jinja", "chat_template", read(p)))
    extra = ckpt.root / "additional_chat_templates"
    if extra.is_dir():
        for q in sorted(extra.glob("*.jinja")):
            if q.is_file():
                out.append((f"additional_chat_templates/{q.name}", "chat_template", read(q)))
    docs = [("tokenizer_config.json", ckpt.tokenizer_config or {})]
    cj = ckpt.root / "chat_template.json"
    if cj.is_file():
        data, _ = ckpt.json("chat_template.json")
        docs.append(("chat_template.json", data if isinstance(data, dict) else {}))
    for fname, doc in docs:
        ct = doc.get("chat_template")
        if isinstance(ct, str):
            out.append((fname, "chat_template", ct[:MAX_TEMPLATE_BYTES + 1]))
        elif isinstance(ct, list):
            for i, item in enumerate(ct):
                if isinstance(item, dict) and isinstance(item.get("template"), str):
                    out.append((fname, f"chat_template.{i}.template", item["template"][:MAX_TEMPLATE_BYTES + 1]))
    return out


def _environment() -> Any:
    """A jinja2 environment shaped like transformers' (same syntax options and tags), for parsing only."""
    from jinja2 import nodes  # noqa: PLC0415 - jinja2 is imported when a template is read
    from jinja2.ext import Extension  # noqa: PLC0415
    from jinja2.sandbox import ImmutableSandboxedEnvironment  # noqa: PLC0415

    class Generation(Extension):
        """transformers' ``{% generation %}`` tag (AssistantTracker), parsed as a plain block."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            next(parser.stream)
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.Scope(body)

    return ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                         extensions=["jinja2.ext.loopcontrols", Generation])


def _finding(code: str, severity: Severity, message: str, file: str, field: str, value: Any, fix: str,
             source: str) -> Finding:
    return Finding(code, severity, message, file=file, field=field, value=value, fix=fix, source=source)


_FIX_ESCAPE = ("Do not serve this checkpoint: replace the chat template with the base model's published one and "
               "find out who changed it.")


def static_findings(source: str, file: str, field: str) -> list[Finding]:  # noqa: C901
    """``security.template.*`` findings of one template's source, from its Jinja AST alone (nothing is
    rendered). A template that does not parse yields nothing here (the render check reports it)."""
    from jinja2 import TemplateSyntaxError, nodes  # noqa: PLC0415

    try:
        tree = _environment().parse(source)
    except (TemplateSyntaxError, RecursionError, ValueError):
        return []
    out: list[Finding] = []
    seen: set[tuple[str, str]] = set()

    def add(code: str, sev: Severity, key: str, message: str, fix: str, source_: str = SOURCE_STATIC) -> None:
        if (code, key) not in seen:
            seen.add((code, key))
            out.append(_finding(code, sev, message, file, field, key, fix, source_))

    for node in tree.find_all((nodes.Getattr, nodes.Getitem)):
        name = node.attr if isinstance(node, nodes.Getattr) else (
            node.arg.value if isinstance(node.arg, nodes.Const) and isinstance(node.arg.value, str) else None)
        base = node.node.name if isinstance(node.node, nodes.Name) else None
        if name is None:
            if isinstance(node, nodes.Getitem) and base in GUARDED_GLOBALS:
                add("security.template.escape_attempt", Severity.ERROR, f"{base}[…]",
                    f"the chat template looks up a key computed at render time in jinja2's global {base!r} (line "
                    f"{node.lineno}): a name built from pieces is how a payload hides a dunder; no chat format "
                    "needs it", _FIX_ESCAPE)
            continue
        if name.startswith("_") or name in ESCAPE_NAMES:
            add("security.template.escape_attempt", Severity.ERROR, name,
                f"the chat template reaches the attribute {name!r} (line {node.lineno}): the first step of a "
                "sandbox escape (object internals lead to Python's globals and os); no chat format needs it",
                _FIX_ESCAPE)
        elif base in GUARDED_GLOBALS:
            add("security.template.escape_attempt", Severity.ERROR, f"{base}.{name}",
                f"the chat template reaches {base}.{name} (line {node.lineno}): the internals of jinja2's "
                f"global {base!r} are a known way out of the sandbox; no chat format needs them", _FIX_ESCAPE)
    for node in tree.find_all((nodes.Const, nodes.TemplateData)):
        text = node.value if isinstance(node, nodes.Const) else node.data
        if not isinstance(text, str):
            continue
        for m in _DUNDER.finditer(text):
            frag = m.group(0)
            if not any(d == frag or (frag.startswith("__") and d.startswith(frag)) or d.endswith(frag) for d in DUNDERS):
                continue  # Markdown bold (__Important__), not a Python internal
            add("security.template.escape_attempt", Severity.ERROR, frag,
                f"the chat template holds the string {frag!r} (line {node.lineno}): a Python internal named in "
                "text (or a piece of one to be joined), as attribute lookups by name (attr, map(attribute=...), "
                "format, a computed key) use it", _FIX_ESCAPE)
    for out_node in tree.find_all((nodes.Output,)):
        for node in out_node.find_all((nodes.Const, nodes.TemplateData)):
            text = node.value if isinstance(node, nodes.Const) else node.data
            if not isinstance(text, str):
                continue
            for url in _URL.findall(text):
                add("security.template.url", Severity.WARNING, url,
                    f"the chat template writes the URL {url} (line {node.lineno}) into the prompt: a chat format "
                    "has no links; a template that sends the model somewhere is an injected instruction",
                    "Read the template; remove the URL or replace the template with the base model's.")
    for node in tree.find_all(nodes.Filter):
        if node.name not in USUAL_FILTERS:
            add("security.template.unusual_filter", Severity.WARNING, node.name,
                f"the chat template uses the filter {node.name!r} (line {node.lineno}), which no chat template "
                "of the known families uses" + (" (attribute lookup by a computed name)" if node.name == "attr"
                                                 else ""),
                "Read what the filter is applied to; replace the template with the base model's if unsure.")
    for node in tree.find_all(nodes.Call):
        if isinstance(node.node, nodes.Name) and node.node.name == "range":
            if any(_computed_product(a) for a in node.args):
                add("security.template.input_bounded_loop", Severity.WARNING, f"range (line {node.lineno})",
                    f"the chat template loops over range() of a product computed at render time (line "
                    f"{node.lineno}): a conversation chooses how long rendering takes",
                    "Read the loop; a chat format loops over the messages, not over computed counts.")
    for node in tree.find_all(nodes.Mul):
        if isinstance(node.left, nodes.Const) and isinstance(node.left.value, str) and not isinstance(node.right, nodes.Const) \
                or isinstance(node.right, nodes.Const) and isinstance(node.right.value, str) and not isinstance(node.left, nodes.Const):
            add("security.template.input_bounded_loop", Severity.WARNING, f"string * (line {node.lineno})",
                f"the chat template repeats a string a computed number of times (line {node.lineno}): a "
                "conversation chooses how much memory rendering takes",
                "Read the expression; a chat format does not repeat text by computed counts.")
    for node in tree.find_all((nodes.Include, nodes.Import, nodes.FromImport, nodes.Extends)):
        kind = type(node).__name__.lower().replace("fromimport", "from-import")
        add("security.template.includes", Severity.ERROR, f"{kind} (line {node.lineno})",
            f"the chat template pulls in another template ({kind}, line {node.lineno}): what it renders is not in "
            "this file, so nothing here can be judged; no chat format of the known families needs one",
            "Replace the chat template with one self-contained file (the base model's published template).")
    controls = {ord(c): node.lineno for node in tree.find_all((nodes.Const, nodes.TemplateData))
                if isinstance(text := node.value if isinstance(node, nodes.Const) else node.data, str)
                for c in text if _format_control(c)}
    if controls:
        cps = [f"U+{cp:04X}" for cp in sorted(controls)]
        add("security.template.format_control", Severity.ERROR, ",".join(cps),
            f"the chat template holds format-control code points {', '.join(cps)} (line {min(controls.values())}): "
            "invisible characters that reorder or hide text (bidirectional overrides, zero-width joiners, tag "
            "characters) around what the model reads; no chat format needs them",
            "Replace the chat template with the base model's; compare it byte for byte.", SOURCE_FORMAT)
    for node in tree.find_all(nodes.If):
        if _content_trigger(node.test) and (said := _prose(node.body)):
            add("security.template.content_triggered", Severity.ERROR, f"if (line {node.lineno})",
                f"the chat template writes {said!r} only when a message's content matches a fixed text (line "
                f"{node.lineno}): an instruction that a trigger word in the user's text switches on, invisible to "
                "every conversation without it",
                "Do not serve this checkpoint with this template: replace it with the base model's published one.")
    for node in tree.find_all((nodes.Filter, nodes.Call)):
        rewrite = node.name if isinstance(node, nodes.Filter) else (
            node.node.attr if isinstance(node.node, nodes.Getattr) else None)
        target = node.node if isinstance(node, nodes.Filter) else (
            node.node.node if isinstance(node.node, nodes.Getattr) else None)
        if rewrite in REWRITES and target is not None and _mentions_content(target):
            add("security.template.content_rewritten", Severity.ERROR, f"{rewrite} (line {node.lineno})",
                f"the chat template rewrites a message's content with {rewrite} (line {node.lineno}): the model reads "
                "other text than the user or the tool sent (a tool result changed on its way in); chat formats "
                "only trim or split off their own markup",
                "Replace the chat template with the base model's published one.")
    for outer in tree.find_all(nodes.For):
        for inner in outer.body:
            for loop in ([inner] if isinstance(inner, nodes.For) else list(inner.find_all(nodes.For))):
                if _is_range(outer.iter) and _is_range(loop.iter):
                    add("security.template.input_bounded_loop", Severity.WARNING, f"nested range (line {outer.lineno})",
                        f"the chat template nests range() loops (line {outer.lineno}): rendering time grows as a "
                        "product of counts", "Read the loops; a chat format loops over the messages once.")
    return out


#: string methods and filters that change a message's text (the known families only trim it, or split off their own
#: reasoning markup with ``split``)
REWRITES = frozenset({"replace", "regex_replace", "translate", "format", "center", "wordwrap", "title", "capitalize",
                      "upper", "lower", "swapcase", "reverse"})
SOURCE_FORMAT = ("Unicode format characters (general category Cf: UAX #9 bidirectional controls, zero-width joiners, "
                 "tag characters); \"Trojan Source\" (CVE-2021-42574)")


def _format_control(c: str) -> bool:
    """A format-control code point (Unicode category Cf), but the BOM and soft hyphen, which text editors add."""
    return unicodedata.category(c) == "Cf" and c not in "\ufeff\u00ad"


def _mentions_content(expr: Any) -> bool:
    """``expr`` reads a message's ``content`` (``m.content``, ``m['content']``, or a name set from one: ``content``)."""
    from jinja2 import nodes  # noqa: PLC0415

    for n in [expr, *expr.find_all((nodes.Getattr, nodes.Getitem, nodes.Name))]:
        if isinstance(n, nodes.Getattr) and n.attr == "content" or isinstance(n, nodes.Name) and n.name == "content" \
                or isinstance(n, nodes.Getitem) and isinstance(n.arg, nodes.Const) and n.arg.value == "content":
            return True
    return False


def _content_trigger(test: Any) -> bool:
    """``test`` (an ``if``'s condition) compares a message's content with a fixed text: ``'word' in content``,
    ``content == '...'``, ``content.startswith('...')`` and the like."""
    from jinja2 import nodes  # noqa: PLC0415

    for cmp in [test, *test.find_all(nodes.Compare)]:
        if isinstance(cmp, nodes.Compare):
            sides = [cmp.expr, *(o.expr for o in cmp.ops)]
            if any(_mentions_content(x) for x in sides) and any(
                    isinstance(x, nodes.Const) and isinstance(x.value, str) and x.value.strip() for x in sides):
                return True
    for call in [test, *test.find_all(nodes.Call)]:
        if isinstance(call, nodes.Call) and isinstance(call.node, nodes.Getattr) \
                and call.node.attr in ("startswith", "endswith", "find", "count") \
                and _mentions_content(call.node.node) and any(isinstance(a, nodes.Const) for a in call.args):
            return True
    return False


def _prose(body: list[Any]) -> str:
    """The constant text ``body`` writes, when it holds words (three or more letters-words, in any script), markup,
    role names and whitespace dropped; ``""`` otherwise."""
    from jinja2 import nodes  # noqa: PLC0415

    outputs = [o for out in body for o in ([out] if isinstance(out, nodes.Output) else list(out.find_all(nodes.Output)))]
    # the message of raise_exception(...) (a template refusing a conversation) is never written into the prompt
    refused = {id(c) for o in outputs for call in o.find_all(nodes.Call)
               if isinstance(call.node, nodes.Name) and call.node.name == "raise_exception"
               for c in call.find_all(nodes.Const)}
    parts = [t for o in outputs for n in o.find_all((nodes.Const, nodes.TemplateData))
             if id(n) not in refused and isinstance(t := getattr(n, "value", getattr(n, "data", None)), str)]
    text = " ".join(_MARKUP.sub(" ", t) for t in parts)
    words = [w for w in re.findall(r"[^\W\d_]{2,}", text) if w.lower() not in ROLE_WORDS]
    return " ".join(text.split())[:120] if len(words) >= 3 else ""


#: role names and chat-format words that templates write around content, not instructions
ROLE_WORDS = frozenset({"system", "user", "assistant", "tool", "tools", "ipython", "model", "developer", "human",
                        "bot", "function", "response", "think", "analysis", "final", "commentary", "channel"})


def _computed_product(expr: Any) -> bool:
    from jinja2 import nodes  # noqa: PLC0415

    return any(not (isinstance(n.left, nodes.Const) and isinstance(n.right, nodes.Const))
               for n in ([expr] if isinstance(expr, (nodes.Mul, nodes.Pow)) else [])
               + list(expr.find_all((nodes.Mul, nodes.Pow))))


def _is_range(expr: Any) -> bool:
    from jinja2 import nodes  # noqa: PLC0415

    return isinstance(expr, nodes.Call) and isinstance(expr.node, nodes.Name) and expr.node.name == "range"


def residual_text(rendered: str, specials: tuple[str, ...] = ()) -> str:
    """What a rendering holds beyond the conversation and its markup: the sentinels, the special tokens
    ``specials`` (those without spaces), tag-like markup and zero-width characters removed, whitespace collapsed."""
    text = _INVISIBLE.sub("", rendered)
    for s in sorted(specials, key=len, reverse=True):
        if s and not any(c.isspace() for c in s):  # a "special token" that is a sentence is content, not markup
            text = text.replace(s, " <|s|> ")  # markup: the role name after it goes too
    for s in (SYSTEM, USER, ASSISTANT, USER2, "QQtoolQQ"):
        text = text.replace(s, " ")
    return " ".join(_MARKUP.sub(" ", text).split())


def render_findings(source: str, file: str, field: str, *, bos_token: str = "", eos_token: str = "",
                    specials: tuple[str, ...] = ()) -> list[Finding]:
    """``security.template.*`` findings of rendering ``source`` in the sandbox (see the module doc)."""
    got = rendered_once(source, bos_token, eos_token)
    if isinstance(got, str):
        return [_finding("security.template.render_limit", Severity.ERROR,
                         f"rendering the chat template was stopped: {got} (limits: {RENDER_SECONDS:g} s, "
                         f"{RENDER_MEMORY_BYTES >> 20} MiB, {RENDER_OUTPUT_CHARS} characters per conversation); "
                         "vLLM would render it on every request", file, field, got, _FIX_ESCAPE, SOURCE_SANDBOX)]
    out: list[Finding] = []
    for r in got:
        if r.kind == "security":
            out.append(_finding("security.template.sandbox_violation", Severity.ERROR,
                                f"the chat template tried something jinja2's sandbox forbids: {r.error}",
                                file, field, r.error, _FIX_ESCAPE, SOURCE_SANDBOX))
            break
        if r.kind in ("output_limit", "memory"):
            out.append(_finding("security.template.render_limit", Severity.ERROR,
                                f"rendering the chat template was stopped: {r.error} (limits: "
                                f"{RENDER_MEMORY_BYTES >> 20} MiB, {RENDER_OUTPUT_CHARS} characters per conversation)",
                                file, field, r.error, _FIX_ESCAPE, SOURCE_SANDBOX))
            break
    for r in got:
        kept = residual_text(r.text, specials) if r.text is not None else ""
        cue = INSTRUCTION_CUES.search(folded(kept))
        if cue:
            out.append(_finding(
                "security.template.hidden_instruction", Severity.WARNING,
                f"the chat template adds text to the conversation (in a default system prompt, around the "
                f"messages or on some condition) that reads as an instruction ({cue.group(0)!r}): {kept[:240]!r}",
                file, field, kept[:1000],
                "Read the template: a chat format adds role markup, not instructions; replace it with the base "
                "model's published template unless the added text is yours.",
                "modelyard: the residue of rendering beside vLLM's chat_utils (what apply_hf_chat_template adds)"))
            break
    return out


def specials_of(ckpt: Checkpoint) -> tuple[str, ...]:
    """The special-token strings ``ckpt`` declares (tokenizer_config's added tokens and named specials)."""
    tc = ckpt.tokenizer_config or {}
    added = tc.get("added_tokens_decoder")
    out = [v.get("content") for v in (added.values() if isinstance(added, dict) else ()) if isinstance(v, dict)]
    for k in ("bos_token", "eos_token", "pad_token", "unk_token"):
        v = tc.get(k)
        out.append(v.get("content") if isinstance(v, dict) else v)
    return tuple(s for s in out if isinstance(s, str) and s)


def _token(tc: dict[str, Any], key: str) -> str:
    v = tc.get(key)
    v = v.get("content") if isinstance(v, dict) else v
    return v if isinstance(v, str) else ""


@check("security")
def chat_template_risk(ckpt: Checkpoint, ctx: CheckContext) -> Iterator[Finding]:
    """Every chat template of the checkpoint read statically and rendered in the sandbox with limits."""
    tc = ckpt.tokenizer_config or {}
    specials = specials_of(ckpt)
    for file, field, source in templates_of(ckpt):
        if len(source.encode("utf-8", "replace")) > MAX_TEMPLATE_BYTES:
            yield _finding("security.template.render_limit", Severity.ERROR,
                           f"the chat template is over {MAX_TEMPLATE_BYTES >> 20} MiB, more than modelyard reads (the "
                           "largest of the known families is under 20 KB): not judged, so not trusted",
                           file, field, f"over {MAX_TEMPLATE_BYTES} bytes", _FIX_ESCAPE, SOURCE_SANDBOX)
            continue
        yield from static_findings(source, file, field)
        yield from render_findings(source, file, field, bos_token=_token(tc, "bos_token"),
                                   eos_token=_token(tc, "eos_token"), specials=specials)
