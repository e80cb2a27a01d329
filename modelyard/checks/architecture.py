"""architecture: the tensors in the headers are the parameters the architecture expects.

The expected names and shapes come from transformers itself: the model class named by
``config.architectures[0]`` is instantiated on the ``meta`` device (no weights, no memory; cost is
independent of the model's size in bytes), and its ``state_dict`` is compared with the union of the
shard headers. transformers is asked through :mod:`modelyard.checks.hf`, which keeps its answers for the
next run over the same config. Rules and their sources:

- A parameter with no tensor is left uninitialised: vLLM's loader raises for unquantized models
  ("Following weights were not initialized from checkpoint") and skips that check for quantized ones,
  which then produce garbage (vllm-project/vllm#34859).
- A tensor the model has no parameter for makes vLLM's ``load_weights`` fail with ``KeyError``.
- ``tie_word_embeddings``: a tied head reuses ``embed_tokens``; a stored ``lm_head.weight`` next to it
  is redundant and rejected by some loaders (KeyError 'lm_head.weight'); an untied head with no
  ``lm_head.weight`` is random (huggingface/transformers#31139, vllm-project/vllm#3553).
- Quantized layouts stand in for their dense parameter: AutoAWQ ``qweight`` (in, out*bits/32),
  GPTQ ``qweight`` (in*bits/32, out), compressed-tensors ``weight_packed`` (out, in*bits/32 in I32,
  or in*bits/8 in U8 for NVFP4), plus their
  scales, zero points and ``g_idx``.
- transformers 5 fuses some checkpoint tensors at load (``conversion_mapping``): the per-expert
  ``experts.<e>.gate_proj/up_proj/down_proj.weight`` of MoE checkpoints become one stacked
  ``experts.gate_up_proj`` / ``experts.down_proj`` parameter. Where the fusion is a stack over experts
  (``MergeModulelist(dim=0)``), optionally followed by a split-equal concatenation (``Concatenate(dim=1)``),
  the fused parameter is unfolded back into the per-expert names and shapes the checkpoint stores, so every
  expert is compared one to one (dense or quantized: vLLM's ``FusedMoE.make_expert_params_mapping`` loads
  ``experts.<e>.<proj>.<qweight|weight_packed|weight|scales|...>`` into its fused expert parameters). Other
  fusions are compared by name only: a tensor whose (dense) name matches a fused source pattern is accepted.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from modelyard.checks.base import CheckContext, Finding, Severity, check
from modelyard.checks.hf import Fusion, facts
from modelyard.checks.hf import conversion as _conversion
from modelyard.model.checkpoint import DTYPE_BITS, Checkpoint, TensorInfo

__all__ = ["Fusion", "_conversion", "generation_head", "parameters"]

#: tensors that replace ``<module>.weight`` in a quantized checkpoint.
QUANT_PRIMARY = {".qweight": "awq_gptq", ".weight_packed": "packed"}
#: side tensors of a quantized ``<module>.weight`` (scales, zero points, orderings, shapes).
QUANT_AUX = (".qzeros", ".scales", ".g_idx", ".weight_scale", ".weight_scale_inv", ".weight_zero_point",
             ".weight_g_idx", ".weight_shape", ".weight_global_scale", ".input_scale", ".input_global_scale",
             ".input_zero_point")
#: attention-level KV-cache scales (FP8 KV cache), accepted when the module exists.
KV_SCALES = (".k_scale", ".v_scale", ".q_scale", ".prob_scale")
#: buffers old exports saved that every loader ignores (vLLM llama.py load_weights skips them).
IGNORED = re.compile(r"(rotary_emb\.(inv_freq|cos_cached|sin_cached)|\.attn\.bias|\.attn\.masked_bias)$")
_LIST = 10
_LAYER = re.compile(r"\.layers\.(\d+)\.")
_SRC = "transformers model class on the meta device vs the shard headers; vLLM DefaultModelLoader"


def _unfold_fused(expected: dict[str, tuple[int, ...]], fusions: list[Fusion]
                  ) -> tuple[dict[str, tuple[int, ...]], list[Fusion]]:
    """``expected`` with each fused parameter replaced by the per-expert tensors it is loaded from
    (:meth:`Fusion.unfold`), and the fusions that could not be unfolded (compared by name only)."""
    out: dict[str, tuple[int, ...]] = {}
    opaque: list[Fusion] = []
    for name, shape in expected.items():
        hits = [f for f in fusions if f.fuses(name)]
        if not hits:
            out[name] = shape
            continue
        parts = hits[0].unfold(name, shape) if len(hits) == 1 else None
        if parts is None:
            opaque.extend(f for f in hits if f not in opaque)
        else:
            out.update(parts)
    return out, opaque


def _dense_of(name: str) -> tuple[str, str] | None:
    """``(dense parameter name, kind)`` for a quantized tensor name; None for a plain tensor."""
    for suffix, kind in QUANT_PRIMARY.items():
        if name.endswith(suffix):
            return name[: -len(suffix)] + ".weight", kind
    for suffix in QUANT_AUX:
        if name.endswith(suffix):
            return name[: -len(suffix)] + ".weight", "aux"
    return None


def _quant_bits(cfg: dict[str, Any]) -> int | None:
    q: dict[str, Any] = cfg["quantization_config"] if isinstance(cfg.get("quantization_config"), dict) else {}
    bits = q.get("bits") or q.get("w_bit")
    if isinstance(bits, int):
        return bits
    for grp in (q.get("config_groups") or {}).values():
        w = grp.get("weights") if isinstance(grp, dict) else None
        if isinstance(w, dict) and isinstance(w.get("num_bits"), int):
            num_bits: int = w["num_bits"]
            return num_bits
    return None


def _packed_shape_ok(t: TensorInfo, dense: tuple[int, ...], method: str | None, bits: int | None) -> bool | None:
    """Does the packed tensor ``t`` fit the dense (out, in) shape? None when the layout is unknown."""
    container = DTYPE_BITS.get(t.dtype)  # I32 for AutoAWQ/GPTQ/pack-quantized int4, U8 for NVFP4 (2 per byte)
    if len(dense) != 2 or len(t.shape) != 2 or not bits or not container or container % bits:
        return None
    out_f, in_f = dense
    pack = container // bits
    if t.name.endswith(".weight_packed"):
        return t.shape == (out_f, -(-in_f // pack))
    if method == "awq":
        return t.shape == (in_f, out_f // pack)
    if method == "gptq":
        return t.shape == (in_f // pack, out_f)
    return None


def _spec_layer_prefixes(text_config: dict[str, Any]) -> tuple[str, ...]:
    """``model.layers.<i>.`` of the multi-token-prediction layers a config declares: i from
    ``num_hidden_layers`` for ``num_nextn_predict_layers`` (DeepSeek-V3, GLM-4-MoE, MiMo: vLLM's
    ``get_spec_layer_idx_from_weight_name``) or ``mtp_num_hidden_layers`` layers."""
    n_layers = text_config.get("num_hidden_layers")
    n_spec = text_config.get("num_nextn_predict_layers") or text_config.get("mtp_num_hidden_layers") or 0
    if not isinstance(n_layers, int) or not isinstance(n_spec, int) or n_spec <= 0:
        return ()
    return tuple(f"model.layers.{n_layers + i}." for i in range(n_spec))


def _names(names: list[str]) -> str:
    return ", ".join(names[:_LIST]) + (f" and {len(names) - _LIST} more" if len(names) > _LIST else "")


@check("architecture")
def parameters(ckpt: Checkpoint, ctx: CheckContext) -> Iterator[Finding]:  # noqa: C901
    """Missing, unexpected and wrong-shaped tensors; ``tie_word_embeddings`` against ``lm_head``."""
    cfg_dict = ckpt.config
    if not isinstance(cfg_dict, dict) or not ckpt.weights_readable:
        return  # config and safetensors checks report why
    hf = facts(ckpt)
    archs = cfg_dict.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    if arch is None or hf.config_error() is not None:
        return
    if not hf.has_class(arch):
        yield Finding(code="architecture.unknown_class", severity=Severity.INFO,
                      message=f"transformers has no class {arch}; parameter names were not compared",
                      file="config.json", field="architectures", value=arch,
                      fix="Check that the target vLLM supports this architecture.", source=_SRC)
        return
    layers = ckpt.text_config.get("num_hidden_layers")
    stored_layers = {int(m.group(1)) for n in ckpt.tensors if (m := _LAYER.search(n))}
    if isinstance(layers, int) and stored_layers and layers > max(stored_layers) + 1 + 64:
        # Building a model of (say) 10^12 layers on the meta device would not finish: judge without it.
        yield Finding(code="architecture.layer_count_mismatch", severity=Severity.ERROR,
                      message=f"config.json num_hidden_layers is {layers} but the weights hold layers 0-{max(stored_layers)}",
                      file="config.json", field="num_hidden_layers", value=layers,
                      fix=f"Set num_hidden_layers to {max(stored_layers) + 1}, or ship the missing layers.",
                      source="vLLM/transformers build num_hidden_layers decoder layers")
        return
    model_type = hf.model_type() or ""
    if hf.backbone(arch) and _stores_head(ckpt):
        # a causal-LM export labelled with its backbone class: vLLM 0.32 maps LlamaModel/MistralModel to the
        # causal LM and loads it (measured by benchmarks/differential.py); compare with that class
        arch = hf.causal(model_type) or arch
    params = hf.parameters(arch)
    if params.error is not None:
        yield Finding(code="architecture.instantiate_failed", severity=Severity.ERROR,
                      message=f"transformers cannot build {arch} from config.json: {params.error}",
                      file="config.json", field="architectures", value=arch,
                      fix="Fix the config.json value named in the message: vLLM builds the model from it too.",
                      source=_SRC)
        return
    expected, tied, prefix = dict(params.shapes), set(params.tied), params.prefix
    renames, fusions = hf.conversion(model_type)
    expected, opaque = _unfold_fused(expected, fusions)
    stored: dict[str, TensorInfo] = {}
    mtp: list[str] = []
    spec_layers = _spec_layer_prefixes(ckpt.text_config)
    ignored = [re.compile(p) for p in params.ignored]
    for name, t in ckpt.tensors.items():
        if name.startswith(spec_layers) or any(p.search(name) for p in ignored):
            mtp.append(name)
            continue
        # the loader's own renaming, where it names a parameter (a per-expert tensor it fuses keeps its name:
        # the expected names hold the fused parameters unfolded per expert)
        renamed = params.renamed.get(name)
        if renamed is not None and (renamed in expected or (_dense_of(renamed) or ("",))[0] in expected):
            name = renamed
        else:
            for a, b in renames:
                name = name.replace(a, b)
        dense_name = (_dense_of(name) or (name, ""))[0]  # a quantized expert is judged by its dense name
        if any(f.matches(dense_name) for f in opaque):
            continue
        stored[name] = t
    # Base-model exports (no "model." prefix) load through base_model_prefix in both runtimes.
    if prefix and stored and not set(stored) & set(expected):
        stored = {f"{prefix}.{k}": v for k, v in stored.items()}
    method = (cfg_dict.get("quantization_config") or {}).get("quant_method") \
        if isinstance(cfg_dict.get("quantization_config"), dict) else None
    bits = _quant_bits(cfg_dict)

    # Tensors the index maps to a shard that is absent are reported by safetensors.index.missing_shard.
    index_map = (ckpt.index or {}).get("weight_map")
    covered: set[str] = {n for n, shard in index_map.items() if shard not in ckpt.safetensors_files} \
        if isinstance(index_map, dict) else set()
    unexpected: list[str] = []
    shape_bad: list[str] = []
    for name, t in sorted(stored.items()):
        dense = _dense_of(name)
        if name in expected:
            covered.add(name)
            if t.shape != expected[name] and not name.endswith(".weight_shape"):
                shape_bad.append(f"{name} {list(t.shape)} (expected {list(expected[name])})")
            continue
        if dense and dense[0] in expected:
            if dense[1] != "aux":
                covered.add(dense[0])
                ok = _packed_shape_ok(t, expected[dense[0]], method, bits)
                if ok is False:
                    shape_bad.append(f"{name} {list(t.shape)} (packs {list(expected[dense[0]])} at {bits} bits)")
            continue
        if name.endswith(KV_SCALES) or IGNORED.search(name):
            continue
        unexpected.append(name)
    if mtp:
        yield Finding(code="architecture.speculative_layers", severity=Severity.INFO,
                      message=(f"{len(mtp)} tensor(s) belong to multi-token-prediction layers that the model's loader "
                               f"skips (vLLM loads them only as a speculative-decoding draft): {_names(sorted(mtp))}"),
                      file=ckpt.tensor_shard.get(mtp[0]), field=mtp[0], value=len(mtp),
                      source="vLLM deepseek_v2.py get_spec_layer_idx_from_weight_name (layers num_hidden_layers .. + "
                             "num_nextn_predict_layers); transformers _keys_to_ignore_on_load_unexpected")
    tie_field = "tie_word_embeddings"
    for name in sorted(tied):
        if name in covered:
            yield Finding(code="architecture.tied_head_stored", severity=Severity.WARNING,
                          message=(f"tie_word_embeddings is true, yet {name} is stored as well: the head reuses the "
                                   "embeddings, and some loaders reject the redundant tensor (KeyError "
                                   f"'{name}')"),
                          file="config.json", field=tie_field, value=True,
                          fix=f"Drop {name} from the weights, or set tie_word_embeddings to false if it differs from "
                              "the embeddings.",
                          source="huggingface/transformers#31139, vllm-project/vllm#3553")
    missing = sorted(k for k in expected if k not in covered and k not in tied)
    head_missing = [k for k in missing if k.endswith("lm_head.weight")]
    for name in head_missing:
        yield Finding(code="architecture.untied_head_missing", severity=Severity.ERROR,
                      message=(f"tie_word_embeddings is false but no {name} is stored: the output projection would "
                               "stay uninitialised and every answer would be noise"),
                      file=ckpt.tensor_shard.get("model.embed_tokens.weight") or None, field=name, value=None,
                      fix=f"Add {name} from the source model, or set tie_word_embeddings to true if the head is "
                          "meant to reuse the embeddings.",
                      source="vLLM DefaultModelLoader (weights not initialized); huggingface/transformers#31139")
    rest = [k for k in missing if k not in head_missing]
    if rest:
        yield Finding(code="architecture.missing_tensors", severity=Severity.ERROR,
                      message=f"{len(rest)} parameter(s) of {arch} have no tensor in the weights: {_names(rest)}",
                      file=None, field=rest[0], value=rest,
                      fix="The checkpoint is incomplete or exported for another architecture; re-export it with "
                          "save_pretrained, or fix config.json if it describes a different model size.",
                      source="vLLM DefaultModelLoader: 'Following weights were not initialized from checkpoint'")
    if unexpected:
        yield Finding(code="architecture.unexpected_tensors", severity=Severity.ERROR,
                      message=f"{len(unexpected)} tensor(s) are not parameters of {arch}: {_names(unexpected)}",
                      file=ckpt.tensor_shard.get(unexpected[0]), field=unexpected[0], value=unexpected,
                      fix="Check architectures/model_type in config.json, or drop the stray tensors.",
                      source="vLLM <Model>.load_weights (params_dict[name] raises KeyError)")
    if shape_bad:
        fix = ("config.json sizes (hidden_size, intermediate_size, vocab_size, heads) do not match the "
               "weights; restore the config of the same export.")
        hd = _head_dim_hint(ckpt, shape_bad)
        if hd:
            fix = hd
        yield Finding(code="architecture.shape_mismatch", severity=Severity.ERROR,
                      message=f"{len(shape_bad)} tensor(s) have the wrong shape for config.json: {_names(shape_bad)}",
                      file=None, field=shape_bad[0].split(" ")[0], value=shape_bad, fix=fix,
                      source="vLLM weight_loader shape assertion; transformers size mismatch error")


def _head_dim_hint(ckpt: Checkpoint, shape_bad: list[str]) -> str | None:
    """When config.json omits ``head_dim`` and attention projections disagree with the shapes, the fix names
    ``head_dim``: transformers and vLLM then use hidden_size / num_attention_heads, which need not be the
    stored per-head size (Gemma, Qwen3 and Mistral-Nemo-style configs set it apart)."""
    cfg = ckpt.text_config
    if "head_dim" in cfg or not any(re.search(r"\.(q|k|v|o)_proj\.", b) for b in shape_bad):
        return None
    heads, kv, hidden = cfg.get("num_attention_heads"), cfg.get("num_key_value_heads"), cfg.get("hidden_size")
    if not (isinstance(heads, int) and heads > 0 and isinstance(hidden, int) and hidden > 0):
        return None
    kv = kv if isinstance(kv, int) and kv > 0 else heads
    rows: dict[str, int] = {}
    for name, t in ckpt.tensors.items():
        for proj in ("q_proj", "k_proj"):
            if name.endswith(f"self_attn.{proj}.weight") and len(t.shape) == 2:
                rows.setdefault(proj, t.shape[0])
    per_q = rows["q_proj"] / heads if "q_proj" in rows else None
    per_k = rows["k_proj"] / kv if "k_proj" in rows else None
    stored = int(per_q) if per_q and per_q == per_k and per_q.is_integer() else None
    derived = hidden // heads
    if stored and stored != derived:
        return (f"config.json has no head_dim, so the runtime uses hidden_size / num_attention_heads = {derived}, but "
                f"the stored attention projections imply head_dim {stored}: set \"head_dim\": {stored} (or restore "
                "the heads of the same export).")
    return ("config.json has no head_dim and the attention projections do not match hidden_size / "
            f"num_attention_heads = {derived}: check head_dim, num_attention_heads and num_key_value_heads against "
            "the weights.")


@check("architecture")
def generation_head(ckpt: Checkpoint, ctx: CheckContext) -> Iterator[Finding]:
    """``architectures[0]`` names a class that can generate: a bare backbone saved via ``AutoModel``
    has no LM head (older vLLM: "LlamaModel is not supported"; newer vLLM runs it only as a pooling
    model; vllm-project/vllm#9736, #10481)."""
    archs = (ckpt.config or {}).get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    hf = facts(ckpt)
    if not arch or not hf.backbone(arch):
        return
    src = ("transformers MODEL_MAPPING_NAMES vs MODEL_FOR_CAUSAL_LM_MAPPING_NAMES; vLLM model registry; "
           "vllm-project/vllm#9736, #10481")
    causal = hf.causal((ckpt.config or {}).get("model_type", "")) or f"{arch.removesuffix('Model')}ForCausalLM"
    if _stores_head(ckpt):
        yield Finding(code="architecture.backbone_label", severity=Severity.WARNING,
                      message=(f"config.json architectures names the bare backbone {arch}, but the weights are a causal-LM "
                               f"export (lm_head.weight and model.* names): vLLM 0.32 maps {arch} to {causal} and serves "
                               "it; older vLLM rejects the class and transformers' AutoModel drops the head"),
                      file="config.json", field="architectures", value=arch,
                      fix=f"Set architectures to [\"{causal}\"].", source=src)
        return
    yield Finding(code="architecture.no_lm_head", severity=Severity.ERROR,
                  message=(f"config.json architectures names {arch}, the bare decoder that AutoModel saves, and no "
                           "lm_head.weight is stored: it cannot generate text (older vLLM rejects the class; newer vLLM "
                           "runs it only as an embedding/pooling model)"),
                  file="config.json", field="architectures", value=arch,
                  fix=(f"Save from AutoModelForCausalLM (architectures {causal}, model.* names and lm_head.weight), or, "
                       "if this is meant to be an embedding model, serve it as one (vllm serve --runner pooling)."),
                  source=src)


def _stores_head(ckpt: Checkpoint) -> bool:
    """A dense or quantized ``lm_head`` is stored, or the head is tied and the causal-LM ``model.`` names are used."""
    names = ckpt.tensors
    if any(n == "lm_head.weight" or n.startswith("lm_head.") for n in names):
        return True
    tied = (ckpt.text_config or {}).get("tie_word_embeddings")
    return bool(tied) and any(n.startswith("model.") for n in names)
