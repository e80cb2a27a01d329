"""tokenizer: tokenizer files exist, transformers builds the tokenizer, a chat template exists.

Rules: vLLM builds its tokenizer with transformers ``AutoTokenizer``; its chat endpoint formats
messages with the tokenizer's chat template (``chat_template.jinja`` or
``tokenizer_config.chat_template``) and rejects chat requests when there is none
(vLLM ``chat_utils``: "default chat template is no longer allowed").
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from modelyard.checkpoint import Checkpoint
from modelyard.checks.findings import CheckContext, Finding, Severity
from modelyard.checks.registry import check


@check("tokenizer")
def tokenizer_loads(ckpt: Checkpoint, ctx: CheckContext) -> Iterator[Finding]:
    if "tokenizer.json" not in ckpt.files and "tokenizer.model" not in ckpt.files:
        yield Finding(code="tokenizer.files.missing", severity=Severity.ERROR,
                      message="neither tokenizer.json nor tokenizer.model is present", file="tokenizer.json",
                      fix="Download the tokenizer files from the same revision.",
                      source="transformers AutoTokenizer needs tokenizer.json or a SentencePiece model")
        return
    try:
        from transformers import AutoTokenizer

        logging.getLogger("transformers").setLevel(logging.ERROR)
        AutoTokenizer.from_pretrained(str(ckpt.root), trust_remote_code=False, local_files_only=True)
    except Exception as exc:
        yield Finding(code="tokenizer.load_failed", severity=Severity.ERROR,
                      message=f"transformers cannot build the tokenizer: {type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}",
                      file="tokenizer_config.json",
                      fix="Check tokenizer_config.json's tokenizer_class and that the tokenizer files match it.",
                      source="transformers AutoTokenizer.from_pretrained")


@check("tokenizer")
def chat_template(ckpt: Checkpoint, ctx: CheckContext) -> Iterator[Finding]:
    if ckpt.chat_template():
        return
    chat = ctx.target.serve == "chat"
    yield Finding(code="tokenizer.chat_template.missing",
                  severity=Severity.ERROR if chat else Severity.WARNING,
                  message="no chat template (no chat_template.jinja, no tokenizer_config.chat_template): "
                          "vLLM's chat endpoint rejects every request",
                  file="tokenizer_config.json", field="chat_template",
                  fix="Add the model's chat template as chat_template.jinja, or serve as completion only.",
                  source="vLLM chat_utils: a default chat template is no longer allowed (transformers >= 4.44)")
