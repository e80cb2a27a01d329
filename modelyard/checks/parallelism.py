"""parallelism: attention heads split evenly over ``tensor_parallel_size`` ranks.

Rule from vLLM ``ModelConfig.verify_with_parallel_config``: ``num_attention_heads`` must be
divisible by ``tensor_parallel_size``; KV heads are split when ``num_key_value_heads >= tp``
(then divisible) and replicated otherwise (then ``tp`` must be a multiple of them).
"""

from __future__ import annotations

from collections.abc import Iterator

from modelyard.checkpoint import Checkpoint
from modelyard.checks.findings import CheckContext, Finding, Severity
from modelyard.checks.registry import check


def valid_tp_sizes(heads: int, kv_heads: int, limit: int = 64) -> list[int]:
    """TP sizes in 1..``limit`` for which vLLM can shard ``heads`` query and ``kv_heads`` KV heads."""
    out = []
    for tp in range(1, limit + 1):
        if heads % tp:
            continue
        if kv_heads >= tp and kv_heads % tp:
            continue
        if kv_heads < tp and tp % kv_heads:
            continue
        out.append(tp)
    return out


@check("parallelism")
def heads_divisible(ckpt: Checkpoint, ctx: CheckContext) -> Iterator[Finding]:
    cfg = ckpt.config or {}
    cfg = cfg.get("text_config", cfg) if isinstance(cfg.get("text_config"), dict) else cfg
    tp = ctx.target.tensor_parallel_size
    heads = cfg.get("num_attention_heads")
    kv = cfg.get("num_key_value_heads", heads)
    if not isinstance(heads, int) or not isinstance(kv, int) or heads <= 0 or kv <= 0:
        return
    if heads % kv:
        yield Finding(code="parallelism.gqa_heads_not_divisible", severity=Severity.ERROR,
                      message=f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}",
                      file="config.json", field="num_key_value_heads", value=kv,
                      fix="Restore the original num_key_value_heads (grouped-query attention needs heads % kv_heads == 0).",
                      source="transformers/vLLM grouped-query attention: num_key_value_groups = heads // kv_heads")
        return
    if tp <= 1:
        return
    ok = valid_tp_sizes(heads, kv)
    if tp not in ok:
        yield Finding(code="parallelism.heads_not_divisible", severity=Severity.ERROR,
                      message=(f"{heads} attention heads / {kv} KV heads cannot be split over tensor_parallel_size={tp}; "
                               f"valid sizes: {', '.join(map(str, ok))}"),
                      file="config.json", field="num_attention_heads", value=heads,
                      fix=f"Use --tensor-parallel-size {max(t for t in ok if t <= tp)} (or another valid size).",
                      source="vLLM ModelConfig.verify_with_parallel_config")
