"""serve sizing: what the plan needs to know of a checkpoint (:class:`ModelSize`), read header-only from the
safetensors (never a weight byte), or estimated from config.json for a dense Llama-style model.

All sizes are bytes; see :mod:`modelyard.stages.serve.plan` for the memory model that uses them."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, overload

from modelyard.checks.config import declared_dtype, derived_max_len, stored_dtype
from modelyard.errors import MissingConfigError, ServePlanError
from modelyard.model.checkpoint import Checkpoint

#: bytes per element of the model/KV dtype names vLLM accepts.
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}
_MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
#: a decoder layer's index in a tensor name (``model.layers.12.mlp...``, ``language_model.model.layers.3...``).
_LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)\.")


@dataclass(frozen=True)
class ModelSize:
    """What the plan needs from the checkpoint. ``weight_bytes``: stored bytes (headers) or the
    config estimate; ``weight_source`` says which; ``param_count`` only for the estimate."""

    layers: int
    attention_heads: int
    kv_heads: int
    head_dim: int
    dtype: str
    weight_bytes: int
    weight_source: str
    param_count: int | None
    quantization: str | None
    derived_max_len: int | None
    derived_max_len_source: str
    #: bytes of each decoder layer (index order); empty when unknown (then layers share weight_bytes evenly)
    layer_bytes: tuple[int, ...] = ()
    #: bytes outside the decoder layers that the first stage holds (embeddings, a vision tower)
    head_bytes: int = 0
    #: bytes the last stage holds besides its layers (final norm, lm_head)
    tail_bytes: int = 0
    #: the embedding matrix's bytes, which the last stage holds again when the embeddings are tied
    tied_embedding_bytes: int = 0

    def stage_layers(self, pp: int) -> tuple[int, ...]:
        """Decoder layers per pipeline stage (vLLM ``get_pp_indices``; see :func:`stage_layers`)."""
        return stage_layers(self.layers, pp)

    def stage_weight_bytes(self, pp: int) -> tuple[int, ...]:
        """Weight bytes each of ``pp`` stages holds (the whole model for ``pp`` = 1)."""
        if pp == 1:
            return (self.weight_bytes,)
        counts = self.stage_layers(pp)
        per = self.layer_bytes if len(self.layer_bytes) == self.layers else None
        even = (self.weight_bytes - self.head_bytes - self.tail_bytes) / self.layers
        out, start = [], 0
        for i, n in enumerate(counts):
            b = sum(per[start:start + n]) if per else round(even * n)
            start += n
            if i == 0:
                b += self.head_bytes
            if i == pp - 1:
                b += self.tail_bytes + self.tied_embedding_bytes
            out.append(b)
        return tuple(out)


def stage_layers(layers: int, pp: int) -> tuple[int, ...]:
    """How vLLM splits ``layers`` decoder layers over ``pp`` pipeline stages (vLLM 0.32
    ``get_pp_indices`` in ``vllm/distributed/utils.py``, without ``VLLM_PP_LAYER_PARTITION``):
    ``layers // pp`` each, and a remainder ``r`` adds one layer to each of the ``r`` stages before the
    last (``partitions[-2]``, ``partitions[-3]``, ...): 126 over 4 is 31/32/32/31."""
    base, rem = divmod(layers, pp)
    parts = [base] * pp
    for i in range(2, rem + 2):
        parts[-i] += 1
    return tuple(parts)


@overload
def _int(cfg: dict[str, Any], key: str, default: int) -> int: ...
@overload
def _int(cfg: dict[str, Any], key: str, default: None = None) -> int | None: ...
def _int(cfg: dict[str, Any], key: str, default: int | None = None) -> int | None:
    v = cfg.get(key, default)
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else default


def llama_param_parts(cfg: dict[str, Any]) -> tuple[int, int, int, int]:
    """``(embeddings, one decoder layer, final norm, lm_head)`` parameters of a dense Llama-style
    decoder (see :func:`llama_param_count`); ``lm_head`` is 0 with ``tie_word_embeddings``.
    Raises :class:`ServePlanError` when config.json lacks a shape key."""
    need = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
    missing = [k for k in need if _int(cfg, k) is None]
    if missing:
        raise ServePlanError(f"config.json lacks {', '.join(missing)}, so the weights cannot be estimated",
                             fix="Plan from a folder with its safetensors weights.")
    h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    kv = _int(cfg, "num_key_value_heads", heads)
    hd = _int(cfg, "head_dim", h // heads)
    inter, vocab = cfg["intermediate_size"], cfg["vocab_size"]
    attn = h * heads * hd + 2 * h * kv * hd + heads * hd * h
    if cfg.get("attention_bias"):
        attn += heads * hd + 2 * kv * hd + h
    mlp = 3 * h * inter + ((2 * inter + h) if cfg.get("mlp_bias") else 0)
    head = 0 if cfg.get("tie_word_embeddings", False) else vocab * h
    return vocab * h, attn + mlp + 2 * h, h, head


def llama_param_count(cfg: dict[str, Any]) -> int:
    """Parameters of a dense Llama-style decoder from its config: embeddings (vocab x hidden) +
    layers x (q, k, v, o projections [+ biases with ``attention_bias``] + gate/up/down MLP
    [+ biases with ``mlp_bias``] + 2 RMSNorm weights) + the final norm + ``lm_head`` unless
    ``tie_word_embeddings``. Matches transformers ``LlamaForCausalLM`` (8B: 8,030,261,248)."""
    embed, layer, norm, head = llama_param_parts(cfg)
    return embed + cfg["num_hidden_layers"] * layer + norm + head


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype_bytes: int, tp: int = 1) -> int:
    """KV-cache bytes one token takes on one rank: 2 x layers x max(1, kv_heads // tp) x head_dim x
    dtype_bytes (vLLM replicates KV heads when tp > kv_heads). ``tp=1`` gives the whole model."""
    return 2 * layers * max(1, kv_heads // tp) * head_dim * dtype_bytes


def _header_stage_parts(ckpt: Checkpoint, layers: int) -> tuple[tuple[int, ...], int, int, int]:
    """``(bytes per decoder layer, head bytes, tail bytes, embedding bytes)`` from the safetensors
    headers: a tensor named ``...layers.N...`` belongs to layer N; ``lm_head`` and the final ``norm``
    to the last stage; everything else (embeddings, a vision tower) to the first."""
    per = [0] * layers
    head = tail = embed = 0
    for name, t in ckpt.tensors.items():
        n = t.end - t.begin
        m = _LAYER_RE.search(name)
        if m and int(m.group(1)) < layers:
            per[int(m.group(1))] += n
        elif "lm_head" in name or name.rsplit(".", 2)[-2:] == ["norm", "weight"]:
            tail += n
        else:
            head += n
            if "embed_tokens" in name or "wte" in name or "word_embeddings" in name:
                embed += n
    return tuple(per), head, tail, embed


def model_size(ckpt: Checkpoint) -> ModelSize:
    """Read what the plan needs: header-only (never weight bytes); with no readable safetensors,
    a config-only estimate (dense Llama-style models only)."""
    if ckpt.config is None:
        raise MissingConfigError(f"{ckpt.root} has no readable config.json",
                                 fix="Point at a model folder (or an artifact with model/).")
    cfg = ckpt.text_config
    layers, heads = _int(cfg, "num_hidden_layers"), _int(cfg, "num_attention_heads")
    hidden = _int(cfg, "hidden_size")
    if not (layers and heads and hidden):
        raise ServePlanError("config.json lacks num_hidden_layers / num_attention_heads / hidden_size",
                             fix="Restore them from the base model's config.json.")
    if _int(cfg, "kv_lora_rank"):
        raise ServePlanError("multi-head latent attention (kv_lora_rank) is not modelled by the serve plan",
                             fix="Size this model by hand from vLLM's startup log (KV cache size).")
    kv = _int(cfg, "num_key_value_heads", heads)
    head_dim = _int(cfg, "head_dim", hidden // heads)
    qcfg = (ckpt.config or {}).get("quantization_config")
    quant = (qcfg.get("quant_method") or "unknown") if isinstance(qcfg, dict) else None
    dtype, _ = declared_dtype(cfg)
    tied = bool(cfg.get("tie_word_embeddings", (ckpt.config or {}).get("tie_word_embeddings", False)))
    if ckpt.weights_readable:
        dtype = dtype or stored_dtype(ckpt) or "bfloat16"
        weight_bytes = sum(t.end - t.begin for t in ckpt.tensors.values())
        src = (f"safetensors headers: {len(ckpt.tensors):,} tensors in {len(ckpt.safetensors_files)} shard(s)"
               + (f", stored {quant}-quantized" if quant else ""))
        params = None
        per_layer, head_b, tail_b, embed_b = _header_stage_parts(ckpt, layers)
    else:
        if quant or any(_int(cfg, k) for k in _MOE_KEYS):
            raise ServePlanError(f"{ckpt.root} has no readable safetensors weights, and its config is "
                                 f"{'quantized' if quant else 'a mixture of experts'}, which the config estimate "
                                 "does not cover", fix="Plan from a folder with its safetensors weights.")
        dtype = dtype or "bfloat16"
        if dtype not in DTYPE_BYTES:
            raise ServePlanError(f"config.json dtype {dtype!r} has no known size", fix="Set torch_dtype to bfloat16.")
        params = llama_param_count(cfg)
        b = DTYPE_BYTES[dtype]
        weight_bytes = params * b
        src = f"config estimate (no weights): {params:,} parameters x {b} B ({dtype})"
        embed, layer, norm, lm_head = llama_param_parts(cfg)
        per_layer, head_b, tail_b, embed_b = (layer * b,) * layers, embed * b, (norm + lm_head) * b, embed * b
    limit, key, how = derived_max_len(cfg)
    return ModelSize(layers=layers, attention_heads=heads, kv_heads=kv, head_dim=head_dim, dtype=dtype,
                     weight_bytes=weight_bytes, weight_source=src, param_count=params, quantization=quant,
                     derived_max_len=limit, derived_max_len_source=how or (key or ""), layer_bytes=per_layer,
                     head_bytes=head_b, tail_bytes=tail_b, tied_embedding_bytes=embed_b if tied else 0)
