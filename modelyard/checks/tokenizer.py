"""tokenizer: the tokenizer builds, its control tokens are special, the chat template renders, and
the token that ends an assistant turn stops generation. What transformers' tokenizer answers (its size,
special tokens, the rendered conversation) comes through :mod:`modelyard.checks.hf`, which keeps it.

Rules and their sources:

- vLLM builds its tokenizer with transformers ``AutoTokenizer`` (fast by default; ``--tokenizer-mode
  slow`` builds the declared slow class, which for SentencePiece families needs ``tokenizer.model``:
  huggingface/transformers#27845, #29137).
- vLLM's chat endpoint renders ``chat_template.jinja`` or ``tokenizer_config.chat_template`` and
  rejects chat requests when there is none (vLLM ``chat_utils``; vllm-project/vllm#18140).
- vLLM stops a request on the tokenizer's ``eos_token_id`` plus ``generation_config.eos_token_id``
  (``SamplingParams.update_from_generation_config``). A template that ends turns with a token outside
  that set makes chat replies run to ``max_tokens`` (Llama 3 ``<|eot_id|>``: vllm-project/vllm#4180,
  #4182).
- Control tokens not marked special are split by the pre-tokenizer and shown in the output
  (``skip_special_tokens`` only skips special tokens).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from modelyard.checks.base import CheckContext, Finding, Severity, check
from modelyard.checks.chat_render import render_conversation, turn_terminator
from modelyard.checks.hf import configured_eos_ids, facts
from modelyard.model.checkpoint import Checkpoint

__all__ = ["configured_eos_ids", "render_conversation", "stop_ids", "turn_terminator"]

#: slow tokenizer classes backed by a SentencePiece ``tokenizer.model`` (transformers 4 ``vocab_files_names``).
SENTENCEPIECE_SLOW_CLASSES = {
    "LlamaTokenizer", "CodeLlamaTokenizer", "GemmaTokenizer", "T5Tokenizer", "MT5Tokenizer", "AlbertTokenizer",
    "XLMRobertaTokenizer", "CamembertTokenizer", "BaichuanTokenizer", "InternLMTokenizer", "InternLM2Tokenizer",
    "ChatGLMTokenizer", "MistralTokenizer", "SiglipTokenizer", "LlamaTokenizerSlow",
}
#: contents that are control tokens by every family's convention.
CONTROL_TOKEN = re.compile(r"^(<\|[^|<>\s]+\|>|</?s>|<(unk|pad|mask|bos|eos|cls|sep)>|\[/?(INST|SYS)\]|"
                           r"<(start|end)_of_turn>|<\uff5c[^<>]+\uff5c>)$")


def _f(code: str, severity: Severity, message: str, file: str | None, field: str | None, value: Any, fix: str,
       source: str) -> Finding:
    return Finding(code=code, severity=severity, message=message, file=file, field=field, value=value, fix=fix,
                   source=source)


@check("tokenizer")
def tokenizer_files(ckpt: Checkpoint, ctx: CheckContext) -> Iterator[Finding]:
    """Files present; the declared class buildable from them; transformers builds it in fast mode."""
    has_json, has_spm = "tokenizer.json" in ckpt.files, "tokenizer.model" in ckpt.files
    # the slow tokenizers' own files: byte-level BPE (GPT-2, Qwen2: vocab.json + merges.txt), tiktoken, Tekken
    other = ({"vocab.json", "merges.txt"} <= set(ckpt.files)
             or any(f.endswith(".tiktoken") or f == "tekken.json" for f in ckpt.files))
    if not has_json and not has_spm and not other:
        yield _f("tokenizer.files.missing", Severity.ERROR,
                 "no tokenizer file is present (tokenizer.json, tokenizer.model, vocab.json with merges.txt, "
                 "*.tiktoken): transformers 4 fails, transformers 5 "
                 "builds a tokenizer that knows only the special tokens", "tokenizer.json", None, None,
                 "Copy tokenizer.json (and tokenizer.model for SentencePiece families) from the source model.",
                 "transformers AutoTokenizer; huggingface/transformers#27845")
        return
    cls = (ckpt.tokenizer_config or {}).get("tokenizer_class")
    if isinstance(cls, str) and cls in SENTENCEPIECE_SLOW_CLASSES and not has_spm:
        yield _f("tokenizer.class.slow_without_model", Severity.WARNING,
                 (f"tokenizer_config.json names the SentencePiece class {cls} but there is no tokenizer.model: the "
                  "fast tokenizer builds, the slow one (--tokenizer-mode slow, use_fast=False) fails on transformers 4"),
                 "tokenizer_config.json", "tokenizer_class", cls,
                 "Set tokenizer_class to \"PreTrainedTokenizerFast\" and do not serve with --tokenizer-mode slow.",
                 "huggingface/transformers#27845, #29137, #30607")
    hf = facts(ckpt)
    err = hf.tokenizer().error
    if err:
        cfg_err = hf.config_error()
        if cfg_err and cfg_err == err:
            return  # the config error is reported by config.config_json
        yield _f("tokenizer.load_failed", Severity.ERROR, f"transformers cannot build the tokenizer: {err}",
                 "tokenizer_config.json", "tokenizer_class", cls,
                 "Check tokenizer_config.json's tokenizer_class and that the tokenizer files match it.",
                 "transformers AutoTokenizer.from_pretrained (vLLM get_tokenizer)")


@check("tokenizer")
def special_tokens(ckpt: Checkpoint, ctx: CheckContext) -> Iterator[Finding]:
    """Control tokens in tokenizer.json's ``added_tokens`` are marked special; a pad token exists."""
    data, _ = ckpt.json("tokenizer.json")
    added = data.get("added_tokens") if isinstance(data, dict) else None
    if isinstance(added, list):
        plain = [t["content"] for t in added
                 if isinstance(t, dict) and isinstance(t.get("content"), str) and CONTROL_TOKEN.match(t["content"])
                 and t.get("special") is False]
        if plain:
            yield _f("tokenizer.control_tokens.not_special", Severity.WARNING,
                     (f"tokenizer.json has {len(plain)} control token(s) not marked special: {', '.join(plain[:8])}; "
                      "they are printed in replies and may be split when they appear in text"),
                     "tokenizer.json", "added_tokens", plain,
                     "Set \"special\": true for these tokens in tokenizer.json (and added_tokens_decoder in "
                     "tokenizer_config.json).", "vLLM detokenizer skip_special_tokens; tokenizers AddedToken.special")
    tok = facts(ckpt).tokenizer()
    if tok.error is None and tok.pad_missing:
        yield _f("tokenizer.pad_token.missing", Severity.INFO,
                 "the tokenizer has no pad token; vLLM does not need one, batch tools (calibration, evals) do",
                 "tokenizer_config.json", "pad_token", None,
                 "Set pad_token to an existing token (e.g. the eos or a reserved token) if a tool asks for one.",
                 "transformers PreTrainedTokenizerBase.pad")


@check("tokenizer")
def vocab_fits_embeddings(ckpt: Checkpoint, ctx: CheckContext) -> Iterator[Finding]:
    """Every token id the tokenizer can emit is below ``vocab_size`` (the embedding rows)."""
    tok = facts(ckpt).tokenizer()
    vocab = ckpt.text_config.get("vocab_size")
    if tok.error is not None or not isinstance(vocab, int) or isinstance(vocab, bool):
        return
    size = tok.size
    for i, where in sorted(_stop_set(ckpt, tok.eos_token, tok.eos_id).items()):
        if not 0 <= i < max(size, vocab):
            yield _f("tokenizer.stop_tokens.out_of_range", Severity.ERROR,
                     f"stop id {i} ({', '.join(where)}) is not a token id (the vocabulary has {max(size, vocab)})",
                     "generation_config.json" if "generation_config.eos_token_id" in where else "config.json",
                     "eos_token_id", i, "Set eos_token_id to the id of the model's end token.",
                     "vLLM SamplingParams stop_token_ids")
    if size > vocab:
        yield _f("tokenizer.vocab.exceeds_embeddings", Severity.ERROR,
                 (f"the tokenizer has {size} tokens (largest id {size - 1}) but config.json vocab_size is {vocab}: "
                  "any id >= vocab_size indexes past the embedding matrix (a device-side assert or garbage)"),
                 "config.json", "vocab_size", vocab,
                 "Use the tokenizer of the same revision, or resize the embeddings and set vocab_size to match.",
                 "transformers resize_token_embeddings; vLLM VocabParallelEmbedding")


def stop_ids(ckpt: Checkpoint, tok: Any) -> dict[int, list[str]]:
    """The stop set vLLM uses: id → where it comes from (generation_config / config / tokenizer)."""
    eos = getattr(tok, "eos_token", None)
    return _stop_set(ckpt, eos, tok.convert_tokens_to_ids(eos) if isinstance(eos, str) else None)


def _stop_set(ckpt: Checkpoint, eos: str | None, eos_id: Any) -> dict[int, list[str]]:
    """:func:`stop_ids` given the tokenizer's ``eos_token`` and its id."""
    out: dict[int, list[str]] = {}

    def add(v: Any, where: str) -> None:
        for i in (v if isinstance(v, list) else [v]):
            if isinstance(i, int) and not isinstance(i, bool):
                out.setdefault(i, []).append(where)

    add((ckpt.generation_config or {}).get("eos_token_id"), "generation_config.eos_token_id")
    add(ckpt.text_config.get("eos_token_id"), "config.eos_token_id")
    if isinstance(eos, str):
        add(eos_id, "tokenizer eos_token")
    return out


@check("tokenizer")
def chat_template(ckpt: Checkpoint, ctx: CheckContext) -> Iterator[Finding]:
    """A chat template exists, renders a system+user+assistant conversation, and its turn
    terminator is in the stop set. Errors when the target serves chat, warnings otherwise."""
    chat = ctx.target.serve == "chat"
    sev = Severity.ERROR if chat else Severity.WARNING
    if not ckpt.chat_template():
        yield _f("tokenizer.chat_template.missing", sev,
                 "no chat template (no chat_template.jinja, no tokenizer_config.chat_template): vLLM's chat "
                 "endpoint rejects every request", "tokenizer_config.json", "chat_template", None,
                 "Add the model's chat template as chat_template.jinja, or serve as completion only.",
                 "vLLM chat_utils: a default chat template is no longer allowed (transformers >= 4.44); "
                 "vllm-project/vllm#18140")
        return
    tok = facts(ckpt).tokenizer()
    if tok.error is not None or tok.render is None:
        return  # reported by tokenizer_files
    tfile = "chat_template.jinja" if "chat_template.jinja" in ckpt.files else "tokenizer_config.json"
    rendered, render_err, dropped = tok.render
    if rendered is None:
        yield _f("tokenizer.chat_template.render_failed", sev,
                 f"the chat template fails on a system+user+assistant conversation: {render_err}",
                 tfile, "chat_template", None,
                 "Fix the template (test it with tokenizer.apply_chat_template) or replace it with the base model's.",
                 "vLLM chat_utils apply_hf_chat_template")
        return
    if dropped:
        completion = ctx.target.serve == "completion"
        yield _f("tokenizer.chat_template.no_system_role", Severity.INFO if completion else Severity.WARNING,
                 ("the chat template raises on a system message: every chat request that carries a system prompt "
                  "(most OpenAI-style clients send one by default) is rejected with HTTP 400"
                  + ("; completions do not use the template" if completion else "")),
                 tfile, "chat_template", None,
                 "Fold the system text into the first user turn in the template (or document that clients must not "
                 "send system messages), then check that a system+user+assistant conversation renders.",
                 "vLLM chat_utils apply_hf_chat_template; vllm-project/vllm#2964, huggingface/chat-ui#1386")
    failed: dict[str, list[str]] = {}
    for shape, add_gen, err in tok.shapes:
        if err is not None and shape != "system+user":  # a system message: tokenizer.chat_template.no_system_role
            failed.setdefault(shape, []).append(f"add_generation_prompt={add_gen}: {err}")
    for shape, errs in failed.items():
        completion = ctx.target.serve == "completion"
        bad = Severity.INFO if completion else (sev if shape == "user" else Severity.WARNING)
        yield _f("tokenizer.chat_template.shape_failed", bad,
                 (f"the chat template raises on a conversation of shape {shape} ({'; '.join(errs)}): vLLM's chat "
                  "endpoint answers every such request with HTTP 400"
                  + ("; completions do not use the template" if completion else "")),
                 tfile, "chat_template", shape,
                 "Make the template accept the shape (or document that clients must not send it); "
                 "`tokenizer.apply_chat_template(messages, add_generation_prompt=True)` shows the error.",
                 "vLLM chat_utils apply_hf_chat_template renders every chat request through the template")
    for marker, pieces in tok.split_markers:
        # <|...|> markers are always added tokens of their vocabulary (ChatML, Llama 3, Phi); <name> markers
        # may be plain text of a template (a tag a model learnt as text), so they only warn
        bad = (Severity.INFO if ctx.target.serve == "completion" else sev if marker.startswith("<|")
               else Severity.WARNING)
        yield _f("tokenizer.chat_template.marker_split", bad,
                 (f"the chat template emits {marker}, which the tokenizer encodes as {list(pieces)}, not as the one token "
                  f"{marker}: every chat prompt reaches the model with a role header or turn marker it never "
                  "saw in training"), tfile, "chat_template", marker,
                 f"Add {marker} to the tokenizer as a special token (tokenizer.json added_tokens, with the id the "
                 "model was trained with), or use the tokenizer files of the model the template belongs to.",
                 "a chat model learns each role header and turn terminator as one token of its vocabulary; "
                 "vLLM tokenizes the rendered template with the served tokenizer")
    term = tok.terminator
    if term is None:
        yield _f("tokenizer.chat_template.no_turn_terminator", Severity.INFO,
                 "the template does not close the assistant's turn with a special token; replies stop on the "
                 "model's own eos only", tfile, "chat_template", None,
                 "No action needed if the model emits its eos at the end of a reply.",
                 "vLLM SamplingParams stop_token_ids")
        return
    content, tid = term
    stops = _stop_set(ckpt, tok.eos_token, tok.eos_id)
    if tid in stops:
        return
    current = sorted(stops)
    gen = (ckpt.generation_config or {}).get("eos_token_id")
    gen_ids = [i for i in (gen if isinstance(gen, list) else [gen]) if isinstance(i, int) and not isinstance(i, bool)]
    want = sorted(set(gen_ids) | set(current) | {tid})
    where = "serving chat" if chat else ("serving completions: clients that apply the chat template run on"
                                         if ctx.target.serve == "completion" else "serving mode unknown")
    yield _f("tokenizer.stop_tokens.missing_turn_terminator", sev,
             (f"the chat template ends every turn with {content} (id {tid}), but the stop set "
              f"{current} (generation_config eos_token_id, config eos_token_id, tokenizer eos_token) does not "
              f"contain it: replies never stop and run to max_tokens ({where})"),
             "generation_config.json", "eos_token_id", gen,
             f"Set generation_config.json \"eos_token_id\": {want} (or make {content} the tokenizer's eos_token); "
             "`modelyard patch` does this.",
             "vllm-project/vllm#4180, vllm-project/vllm#4182")


@check("tokenizer")
def eos_token_agrees(ckpt: Checkpoint, ctx: CheckContext) -> Iterator[Finding]:
    """The tokenizer's ``eos_token`` is one of the eos ids config.json / generation_config.json declare.

    vLLM adds the tokenizer's eos to every request's stop set (``SamplingParams`` ``eos_token_id``), and
    templates that print ``eos_token`` render it: a tokenizer eos that is not a configured eos (a GGUF
    conversion that writes ``<|im_start|>``, the bos, as eos) stops generation on the wrong token."""
    tok = facts(ckpt).tokenizer()
    configured = configured_eos_ids(ckpt)
    eos = tok.eos_token if tok.error is None else None
    if not configured or not isinstance(eos, str):
        return
    tid = tok.eos_id
    if not isinstance(tid, int) or tid in configured:
        return
    want = configured[0]
    want_tok = (tok.tokens or {}).get(want)  # None: an id past the vocabulary, reported by vocab_fits_embeddings
    same_as_bos = " (the same as the bos token)" if eos == tok.bos_token else ""
    yield _f("tokenizer.eos_token.disagrees", Severity.WARNING,
             (f"the tokenizer's eos_token is {eos} (id {tid}){same_as_bos}, but config.json/generation_config.json "
              f"declare eos_token_id {configured}: vLLM stops on the tokenizer's eos too, and templates that print "
              "eos_token render the wrong token"),
             "tokenizer_config.json", "eos_token", eos,
             (f"Set tokenizer_config.json \"eos_token\" to {want_tok!r} (id {want}); `modelyard patch` does this."
              if isinstance(want_tok, str) else f"Make the tokenizer's eos_token the token of id {want}."),
             "vLLM SamplingParams (tokenizer eos_token_id added to the stop set); transformers GGUF tokenizer conversion")
