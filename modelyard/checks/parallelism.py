"""parallelism: the model splits evenly over ``tensor_parallel_size`` ranks.

Rules and their sources:

- vLLM ``ModelConfig.verify_with_parallel_config``: ``num_attention_heads`` divisible by the TP size;
  KV heads are split when ``num_key_value_heads >= tp`` (then divisible) and replicated otherwise
  (then ``tp`` a multiple of them) - vllm-project/vllm#414, #2652, #4232.
- Row-parallel layers (``o_proj``: heads x head_dim inputs, ``down_proj``: ``intermediate_size``
  inputs) split their *input* over the ranks; vLLM's ``RowParallelLinear`` needs it divisible, and for
  group-quantized weights (AWQ, GPTQ, compressed-tensors ``group``, FP8 block) each rank's slice a
  multiple of the group: "The input size is not aligned with the quantized weight shape"
  (vllm-project/vllm#1258, #21695, #13640, QwenLM/Qwen3#698).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from modelyard.checks.base import CheckContext, Finding, Severity, check
from modelyard.model.checkpoint import Checkpoint

_SRC_HEADS = "vLLM ModelConfig.verify_with_parallel_config; vllm-project/vllm#414, #4232"
_SRC_GROUP = "vLLM RowParallelLinear weight loading; vllm-project/vllm#1258, #21695, #13640"


@dataclass(frozen=True)
class RowInput:
    """A row-parallel layer's input width (elements) and the config field it comes from."""

    layer: str
    size: int
    field: str


def quant_group_size(cfg: dict[str, Any]) -> int | None:
    """The input-dimension group (elements) of a quantized checkpoint, or None when ungrouped:
    ``group_size`` (AWQ, GPTQ; -1 means per channel), compressed-tensors ``config_groups.*.weights``
    with strategy ``group``, FP8 ``weight_block_size`` [n, k] (k is the input block)."""
    q = cfg.get("quantization_config")
    if not isinstance(q, dict):
        return None
    g = q.get("group_size")
    if isinstance(g, int) and not isinstance(g, bool) and g > 0:
        return g
    groups = q.get("config_groups")
    if isinstance(groups, dict):
        for grp in groups.values():
            w = grp.get("weights") if isinstance(grp, dict) else None
            size = w.get("group_size") if isinstance(w, dict) and w.get("strategy") == "group" else None
            if isinstance(size, int) and size > 0:
                return size
    block = q.get("weight_block_size")
    if isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block):
        cols: int = block[1]
        return cols
    return None


def row_inputs(cfg: dict[str, Any]) -> list[RowInput]:
    """Inputs of the row-parallel projections, from the text config."""
    out = []
    heads, hidden = cfg.get("num_attention_heads"), cfg.get("hidden_size")
    head_dim = cfg.get("head_dim")
    if not isinstance(head_dim, int) and isinstance(heads, int) and isinstance(hidden, int) and heads > 0:
        head_dim = hidden // heads
    if isinstance(heads, int) and isinstance(head_dim, int):
        out.append(RowInput("o_proj", heads * head_dim, "num_attention_heads"))
    for key in ("intermediate_size", "moe_intermediate_size"):
        v = cfg.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            out.append(RowInput("down_proj" if key == "intermediate_size" else "experts.down_proj", v, key))
    return out


def tp_problems(cfg: dict[str, Any], tp: int) -> list[tuple[str, Any, str]]:
    """Why ``tp`` ranks cannot shard this config: ``[(field, value, reason)]``; empty when it can."""
    out: list[tuple[str, Any, str]] = []
    heads = cfg.get("num_attention_heads")
    kv = cfg.get("num_key_value_heads", heads)
    if isinstance(heads, int) and heads > 0:
        if heads % tp:
            out.append(("num_attention_heads", heads, f"{heads} attention heads do not split evenly over {tp} ranks"))
        elif isinstance(kv, int) and kv > 0:
            if kv >= tp and kv % tp:
                out.append(("num_key_value_heads", kv, f"{kv} KV heads do not split evenly over {tp} ranks"))
            elif kv < tp and tp % kv:
                out.append(("num_key_value_heads", kv,
                            f"{tp} ranks cannot share {kv} KV heads evenly (replication needs tp a multiple of them)"))
    group = quant_group_size(cfg)
    for r in row_inputs(cfg):
        if r.layer == "o_proj" and any(f == "num_attention_heads" for f, _, _ in out):
            continue
        if r.size % tp:
            out.append((r.field, r.size, f"{r.layer}'s input {r.size} does not split evenly over {tp} ranks"))
        elif group and (r.size // tp) % group:
            out.append((r.field, r.size, f"{r.layer}'s input {r.size} gives {r.size // tp} per rank at TP {tp}, "
                                         f"not a multiple of the quantization group_size {group}"))
    return out


def valid_tp_sizes(cfg: dict[str, Any], limit: int = 64) -> list[int]:
    """TP sizes in 1..``limit`` for which vLLM can shard this (text) config."""
    return [tp for tp in range(1, limit + 1) if not tp_problems(cfg, tp)]


@check("parallelism")
def heads_divisible(ckpt: Checkpoint, ctx: CheckContext) -> Iterator[Finding]:
    cfg = ckpt.text_config
    heads = cfg.get("num_attention_heads")
    kv = cfg.get("num_key_value_heads", heads)
    if isinstance(heads, int) and isinstance(kv, int) and heads > 0 and kv > 0 and heads % kv:
        yield Finding(code="parallelism.gqa_heads_not_divisible", severity=Severity.ERROR,
                      message=f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}",
                      file="config.json", field="num_key_value_heads", value=kv,
                      fix="Restore the original num_key_value_heads (grouped-query attention needs heads % kv_heads == 0).",
                      source="transformers/vLLM grouped-query attention: num_key_value_groups = heads // kv_heads")
        return
    tp = ctx.target.tensor_parallel_size
    if tp <= 1:
        return
    problems = tp_problems(cfg, tp)
    if not problems:
        return
    ok = valid_tp_sizes(cfg)
    suggestion = max((t for t in ok if t <= tp), default=1)
    for field, value, reason in problems:
        grouped = "group_size" in reason
        code = ("parallelism.quant_group_not_divisible" if grouped else
                "parallelism.heads_not_divisible" if field in ("num_attention_heads", "num_key_value_heads") else
                "parallelism.row_input_not_divisible")
        yield Finding(code=code,
                      severity=Severity.ERROR,
                      message=f"tensor_parallel_size {tp}: {reason}; valid sizes: {', '.join(map(str, ok))}",
                      file="config.json", field=field, value=value,
                      fix=(f"Use --tensor-parallel-size {suggestion} (valid: {', '.join(map(str, ok))}) and cover the "
                           "remaining GPUs with pipeline parallelism"
                           + ("; or requantize with a smaller group (64, 32)" if grouped else "") + "."),
                      source=_SRC_GROUP if grouped else _SRC_HEADS)
