"""config: config.json exists, parses, names an architecture, and transformers loads it.

Rules: vLLM and transformers both start from ``config.json`` (``model_type`` picks the config
class, ``architectures`` the model class: vLLM's ``ModelConfig`` raises when neither resolves).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from modelyard.checkpoint import Checkpoint
from modelyard.checks.findings import CheckContext, Finding, Severity
from modelyard.checks.registry import check


@check("config")
def config_json(ckpt: Checkpoint, ctx: CheckContext) -> Iterator[Finding]:
    data, err = ckpt.json("config.json")
    if err == "missing":
        yield Finding(code="config.missing", severity=Severity.ERROR, message="config.json is missing",
                      file="config.json", fix="Download config.json from the same revision as the weights.",
                      source="transformers AutoConfig / vLLM ModelConfig read config.json")
        return
    if err or not isinstance(data, dict):
        yield Finding(code="config.invalid_json", severity=Severity.ERROR,
                      message=f"config.json is {err or 'not a JSON object'}", file="config.json",
                      fix="Download config.json again; it is corrupt.", source="transformers AutoConfig")
        return
    if not isinstance(data.get("model_type"), str):
        yield Finding(code="config.model_type.missing", severity=Severity.ERROR,
                      message="config.json has no model_type string", file="config.json", field="model_type",
                      value=data.get("model_type"), fix="Set model_type (e.g. \"llama\") as the architecture's config class expects.",
                      source="transformers AutoConfig dispatches on model_type")
        return
    archs = data.get("architectures")
    if not (isinstance(archs, list) and archs and all(isinstance(a, str) for a in archs)):
        yield Finding(code="config.architectures.missing", severity=Severity.ERROR,
                      message="config.json has no architectures list", file="config.json", field="architectures",
                      value=archs, fix="Set architectures, e.g. [\"LlamaForCausalLM\"].",
                      source="vLLM picks the model class from config.architectures")
    try:
        from transformers import AutoConfig

        logging.getLogger("transformers").setLevel(logging.ERROR)
        AutoConfig.from_pretrained(str(ckpt.root), trust_remote_code=False, local_files_only=True)
    except Exception as exc:  # transformers raises ValueError, KeyError, OSError...
        yield Finding(code="config.transformers_load_failed", severity=Severity.ERROR,
                      message=f"transformers cannot load config.json: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}",
                      file="config.json", field="model_type", value=data.get("model_type"),
                      fix="Fix the field named above, or use a transformers version that knows this model_type.",
                      source="transformers AutoConfig.from_pretrained")
