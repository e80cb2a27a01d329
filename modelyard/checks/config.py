"""config: config.json parses, names an architecture, and its rope, context length and dtype are
what the target vLLM will accept.

Rules and their sources:

- vLLM and transformers both start from ``config.json`` (``model_type`` picks the config class,
  ``architectures`` the model class: vLLM's ``ModelConfig`` raises when neither resolves).
- RoPE: transformers-4 ``rope_theta`` + ``rope_scaling`` (type key ``type`` or ``rope_type``) and
  transformers-5 ``rope_parameters``; the required keys per type are transformers'
  ``modeling_rope_utils`` validators (``_validate_llama3_parameters`` etc.). The llama3 form
  needs vLLM >= 0.5.3.post1 / transformers >= 4.43 (Llama 3.1 release; vllm-project/vllm#6689).
- Context length: vLLM ``_get_and_verify_max_len`` takes the smallest of its length keys
  (``max_position_embeddings``, ``n_positions``, ``max_seq_len``, ``seq_length``,
  ``max_sequence_length``, ``max_seq_length``, ``seq_len``), multiplies by the rope ``factor``
  for linear/dynamic scaling (yarn: ``original_max_position_embeddings x factor`` up to vLLM 0.31;
  0.32 no longer scales yarn), and refuses a larger ``--max-model-len``.
- dtype: vLLM ``--dtype auto`` follows ``torch_dtype`` (transformers 5: ``dtype``);
  ``_FLOAT16_NOT_SUPPORTED_MODELS`` in vLLM ``config/model.py`` lists the families that are
  numerically unstable in float16 (vllm-project/vllm#17154).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
from typing import Any

from modelyard.checks.base import DTYPE_ALIASES, CheckContext, Finding, Severity, check
from modelyard.checks.hf import facts
from modelyard.checks.versions import version_lt
from modelyard.model.checkpoint import Checkpoint

#: rope type -> keys transformers requires (modeling_rope_utils ``_validate_*_parameters``).
ROPE_REQUIRED: dict[str, tuple[str, ...]] = {
    "default": (),
    "linear": ("factor",),
    "dynamic": ("factor",),
    "yarn": ("factor",),
    "longrope": ("short_factor", "long_factor"),
    "su": ("short_factor", "long_factor"),  # Phi-3's early name for longrope
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "mrope": (),  # Qwen2-VL: default rope with mrope_section
}
#: rope types vLLM does not multiply the position limit by ``factor`` for (vLLM ``_get_and_verify_max_len``).
_UNSCALED_ROPE = {"su", "longrope", "llama3", "deepseek_yarn", "deepseek_llama_scaling"}
#: minimum vLLM release that parses each rope type.
ROPE_MIN_VLLM: dict[str, str] = {"llama3": "0.5.3.post1"}
ROPE_MIN_TRANSFORMERS: dict[str, str] = {"llama3": "4.43"}
#: vLLM's length keys, in its order (``model_max_length`` is a tokenizer key, handled apart).
LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length",
               "max_sequence_length", "max_seq_length", "seq_len")
#: vLLM ``_FLOAT16_NOT_SUPPORTED_MODELS`` (vLLM 0.32 ``config/model.py``).
FP16_UNSTABLE_MODEL_TYPES = {"gemma2", "gemma3", "gemma3_text", "glm4"}
#: safetensors dtype -> torch dtype name, for the floating dtypes a checkpoint is "stored in".
STORED_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}
_DTYPE_ALIASES = DTYPE_ALIASES
#: tensor-name suffixes of quantization side tensors (scales, zero points): not "the" weights' dtype.
QUANT_AUX_SUFFIXES = ("_scale", ".scales", "_scale_inv", ".qzeros", "_zero_point", ".g_idx", "_g_idx", "_shape",
                      ".input_scale", "_global_scale")
_SRC_LEN = "vLLM _get_and_verify_max_len (config/model.py)"


def _finding(code: str, severity: Severity, message: str, field: str | None, value: Any, fix: str, source: str,
             file: str = "config.json") -> Finding:
    return Finding(code=code, severity=severity, message=message, file=file, field=field, value=value, fix=fix,
                   source=source)


@check("config")
def config_json(ckpt: Checkpoint, ctx: CheckContext) -> Iterator[Finding]:
    """config.json parses; model_type and architectures present; rope valid; then AutoConfig loads it.

    The AutoConfig load is judged last and only when our own field checks found no error, so a
    broken rope block is reported once, at its field, not again as a transformers exception."""
    data, err = ckpt.json("config.json")
    if err == "missing":
        if "adapter_config.json" in ckpt.files:
            return  # files.lora_adapter says what the folder is and what to do
        yield _finding("config.missing", Severity.ERROR, "config.json is missing", None, None,
                       "Download config.json from the same revision as the weights.",
                       "transformers AutoConfig / vLLM ModelConfig read config.json")
        return
    if err or not isinstance(data, dict):
        yield _finding("config.invalid_json", Severity.ERROR, f"config.json is {err or 'not a JSON object'}", None, None,
                       "Download config.json again; it is corrupt.", "transformers AutoConfig")
        return
    if not isinstance(data.get("model_type"), str):
        yield _finding("config.model_type.missing", Severity.ERROR, "config.json has no model_type string",
                       "model_type", data.get("model_type"),
                       "Set model_type (e.g. \"llama\") as the architecture's config class expects.",
                       "transformers AutoConfig dispatches on model_type")
        return
    own = []
    archs = data.get("architectures")
    if not (isinstance(archs, list) and archs and all(isinstance(a, str) for a in archs)):
        own.append(_finding("config.architectures.missing", Severity.WARNING,
                            "config.json has no architectures list: vLLM 0.32 derives the class from model_type, "
                            "older vLLM releases and other loaders stop without it",
                            "architectures", archs, "Set architectures, e.g. [\"LlamaForCausalLM\"].",
                            "vLLM ModelConfig (architectures, else the model_type's default class); measured by "
                            "benchmarks/differential.py"))
    own.extend(_rope(ckpt.text_config, ctx))
    own.extend(_int_fields(ckpt.text_config))
    yield from own
    if any(f.severity == Severity.ERROR for f in own):
        return
    load_err = facts(ckpt).config_error()
    if load_err:
        yield _finding("config.transformers_load_failed", Severity.ERROR,
                       f"transformers cannot load config.json: {load_err}", "model_type", data.get("model_type"),
                       "Fix the field named above, or use a transformers version that knows this model_type.",
                       "transformers AutoConfig.from_pretrained")


def rope_blocks(cfg: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The rope dicts of a (text) config as ``(field path, dict)``: ``rope_scaling`` (transformers 4)
    and/or ``rope_parameters`` (transformers 5, possibly one dict per layer type)."""
    out: list[tuple[str, dict[str, Any]]] = []
    rs = cfg.get("rope_scaling")
    if isinstance(rs, dict):
        out.append(("rope_scaling", rs))
    rp = cfg.get("rope_parameters")
    if isinstance(rp, dict):
        if rp and all(isinstance(v, dict) for v in rp.values()):
            out.extend((f"rope_parameters.{k}", v) for k, v in rp.items())
        else:
            out.append(("rope_parameters", rp))
    return out


def rope_type(block: dict[str, Any]) -> str | None:
    t = block.get("rope_type", block.get("type"))
    return t if isinstance(t, str) else None


def _rope(cfg: dict[str, Any], ctx: CheckContext) -> Iterator[Finding]:
    vllm = ctx.target.vllm_version
    for path, block in rope_blocks(cfg):
        rtype = rope_type(block)
        scaling_keys = sorted(set(block) - {"rope_theta", "partial_rotary_factor", "mrope_section",
                                            "mrope_interleaved", "type", "rope_type"})
        if "type" in block and "rope_type" in block and block["type"] != block["rope_type"]:
            yield _finding("config.rope.type_conflict", Severity.ERROR,
                           f"config.json {path} has type {block['type']!r} and rope_type {block['rope_type']!r}",
                           f"{path}.rope_type", block["rope_type"], "Keep one of them (rope_type).",
                           "transformers rope_config_validation")
            continue
        if rtype is None:
            if scaling_keys:
                yield _finding("config.rope.type_missing", Severity.ERROR,
                               (f"config.json {path} has scaling keys ({', '.join(scaling_keys)}) but neither "
                                "'rope_type' nor 'type', so the scaling rule is unknown: transformers 4.4x rejects it, "
                                "older vLLM fails on the missing 'type' key, transformers 5 silently uses plain RoPE"),
                               f"{path}.rope_type", None,
                               "Add the rope_type these numbers belong to (factor + low/high_freq_factor + "
                               "original_max_position_embeddings is \"llama3\").",
                               "transformers modeling_rope_utils; vLLM patch_rope_parameters")
            continue
        if rtype not in ROPE_REQUIRED and rtype not in _UNSCALED_ROPE:
            yield _finding("config.rope.unknown_type", Severity.WARNING,
                           f"config.json {path} rope_type {rtype!r} is not one transformers validates "
                           f"({', '.join(sorted(ROPE_REQUIRED))})",
                           f"{path}.rope_type", rtype, "Check the runtime supports this rope type before serving.",
                           "transformers ROPE_INIT_FUNCTIONS")
            continue
        missing = [k for k in ROPE_REQUIRED.get(rtype, ()) if k not in block]
        for k in missing:
            yield _finding("config.rope.key_missing", Severity.ERROR,
                           f"config.json {path}: rope_type {rtype!r} needs {k}, which is absent, so the rotary "
                           "frequencies cannot be computed and loaders stop with a missing-key error",
                           f"{path}.{k}", None, f"Restore {path}.{k} from the base model's config.json.",
                           f"transformers modeling_rope_utils _validate_{rtype}_parameters")
        if missing:
            continue
        factor = block.get("factor")
        if "factor" in ROPE_REQUIRED.get(rtype, ()) and (isinstance(factor, bool) or not isinstance(factor, (int, float))
                                                          or not _finite(factor) or not 1 <= factor < 1e6):
            yield _finding("config.rope.bad_factor", Severity.ERROR,
                           f"config.json {path}.factor is {factor!r}; it must be a finite number >= 1",
                           f"{path}.factor", factor, "Restore the factor from the base model's config.json.",
                           "transformers modeling_rope_utils _check_received_keys / factor validation")
            continue
        need = ROPE_MIN_VLLM.get(rtype)
        need_tf = ROPE_MIN_TRANSFORMERS.get(rtype)
        tf = ctx.target.transformers_version
        if need_tf and tf is not None and version_lt(tf, need_tf):
            yield _finding("config.rope.unsupported_by_runtime", Severity.ERROR,
                           (f"config.json {path} uses rope_type {rtype!r}, which transformers {tf} cannot parse "
                            f"(needs >= {need_tf}; older releases accept only a {{type, factor}} dict)"),
                           path, rtype, f"Upgrade transformers to >= {need_tf}.",
                           "transformers 4.43 release notes (Llama 3.1 rope)")
        elif need and vllm is None and tf is None:
            yield _finding("config.rope.needs_recent_runtime", Severity.WARNING,
                           (f"config.json {path} uses rope_type {rtype!r}, which vLLM older than {need} and "
                            "transformers older than 4.43 cannot parse (KeyError 'type' or a rope_scaling ValueError "
                            "at startup)"),
                           path, rtype, f"Serve with vLLM >= {need} (state it with --vllm-version to confirm).",
                           "vllm-project/vllm#6689 (Llama 3.1 rope), transformers 4.43 release notes")
        elif need and vllm is not None and version_lt(vllm, need):
            yield _finding("config.rope.unsupported_by_runtime", Severity.ERROR,
                           f"config.json {path} uses rope_type {rtype!r}, which vLLM {vllm} cannot parse (needs >= {need})",
                           path, rtype, f"Upgrade the runtime to vLLM >= {need}.",
                           "vllm-project/vllm#6689 (Llama 3.1 rope)")


def derived_max_len(cfg: dict[str, Any], vllm_version: str | None = None) -> tuple[int | None, str | None, str]:
    """The context length (tokens) vLLM derives from a text config: ``(length, key, how)``.

    ``key`` is the config key that bounded it; ``how`` explains a rope scaling applied. Returns
    ``(None, None, "")`` when no length key exists. Follows vLLM ``_get_and_verify_max_len``; for
    yarn, releases before 0.32 derive ``original_max_position_embeddings x factor``, 0.32 leaves
    ``max_position_embeddings`` as is. ``model_max_length`` is ignored here (see the stray-key rule).
    """
    length, key = None, None
    for k in LENGTH_KEYS:
        v = cfg.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0 and (length is None or v < length):
            length, key = v, k
    if length is None:
        return None, None, ""
    how = ""
    new_yarn = vllm_version is not None and not version_lt(vllm_version, "0.32")
    for _path, block in rope_blocks(cfg):
        rtype = rope_type(block)
        factor = block.get("factor")
        if rtype is None or rtype in _UNSCALED_ROPE or not isinstance(factor, (int, float)) or isinstance(factor, bool) \
                or not _finite(factor) or not 0 < factor < 1e6:
            continue  # a bad factor is reported by the rope check
        if rtype == "yarn":
            if new_yarn:
                continue
            orig = block.get("original_max_position_embeddings")
            if isinstance(orig, int) and 0 < orig < 2**40:
                return int(orig * factor), "rope_scaling", f"yarn: original_max_position_embeddings {orig} x factor {factor:g}"
        if rtype in ("linear", "dynamic", "yarn") and length < 2**63:  # past 2**63 a float product can overflow
            return int(length * factor), key, f"{key} {length} x rope factor {factor:g} ({rtype})"
    return length, key, how


def _finite(x: int | float) -> bool:
    """``math.isfinite`` that accepts any int (an int past 1e308 makes ``math.isfinite`` raise OverflowError)."""
    return isinstance(x, int) or math.isfinite(x)


@check("config")
def generation_config(ckpt: Checkpoint, ctx: CheckContext) -> Iterator[Finding]:
    """generation_config.json, when present, is a JSON object whose ``eos_token_id`` is an int or a
    list of ints: vLLM silently ignores a generation config it cannot read, and with it the stop ids."""
    if "generation_config.json" not in ckpt.files:
        return
    data, err = ckpt.json("generation_config.json")
    src = "vLLM try_get_generation_config (an unreadable file is ignored)"
    if err or not isinstance(data, dict):
        yield _finding("config.generation_config.invalid", Severity.WARNING,
                       f"generation_config.json is {err or 'not a JSON object'}: vLLM ignores it, and its stop ids and "
                       "sampling defaults (the stop set falls back to the tokenizer's eos)",
                       None, None, "Restore generation_config.json from the source model.", src,
                       file="generation_config.json")
        return
    cap = data.get("max_new_tokens")
    if isinstance(cap, int) and not isinstance(cap, bool):
        limit, _, _ = derived_max_len(ckpt.text_config)
        ctx_txt = f" (the context is {limit})" if limit else ""
        yield _finding("config.generation_config.max_new_tokens", Severity.WARNING,
                       (f"generation_config.json sets max_new_tokens {cap}: vLLM (--generation-config auto, the "
                        "default) makes it the server's default max_tokens, so every request that does not set "
                        f"max_tokens is cut at {cap} tokens (finish_reason 'length'){ctx_txt}; some releases even "
                        "made it a ceiling an explicit max_tokens could not lift"),
                       "max_new_tokens", cap,
                       "Remove max_new_tokens from generation_config.json (or set it deliberately), or serve with "
                       "--generation-config vllm to ignore the file's defaults.",
                       "vLLM ModelConfig.get_diff_sampling_param; vllm-project/vllm#34005, #34063, #12242",
                       file="generation_config.json")
    rp = data.get("repetition_penalty")
    if isinstance(rp, (int, float)) and not isinstance(rp, bool) and rp > 1.3:
        yield _finding("config.generation_config.strong_repetition_penalty", Severity.WARNING,
                       (f"generation_config.json sets repetition_penalty {rp}: vLLM makes it the server default for every "
                        "request, and a penalty this strong also penalises the end-of-turn token and the answer's own "
                        "words (measured: the demo model no longer stops at 2.0)"),
                       "repetition_penalty", rp,
                       "Remove it or keep it near 1.0-1.2; or serve with --generation-config vllm.",
                       "vLLM ModelConfig.get_diff_sampling_param; benchmarks/differential.py", file="generation_config.json")
    eos = data.get("eos_token_id")
    ids = eos if isinstance(eos, list) else [eos]
    if eos is not None and not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        yield _finding("config.generation_config.bad_eos", Severity.WARNING,
                       f"generation_config.json eos_token_id is {eos!r}; it must be a token id or a list of token ids "
                       "(vLLM cannot stop on these; the tokenizer's eos still stops)",
                       "eos_token_id", eos, "Write the ids as integers, e.g. [128001, 128009].", src,
                       file="generation_config.json")


@check("config")
def context_length(ckpt: Checkpoint, ctx: CheckContext) -> Iterator[Finding]:
    """``--max-model-len`` against the derived limit; a stray ``model_max_length`` in config.json."""
    cfg = ckpt.text_config
    if not cfg:
        return
    vllm = ctx.target.vllm_version
    limit, key, how = derived_max_len(cfg, vllm)
    stray = cfg.get("model_max_length")
    if isinstance(stray, int) and limit is not None and stray > limit:
        yield _finding("config.max_len.stray_model_max_length", Severity.INFO,
                       (f"config.json carries a second context key, model_max_length {stray}, that disagrees with "
                        f"the position limit {limit} ({key}); vLLM releases that honour it (the Cohere rule) would "
                        "accept a context the model was never trained on"),
                       "model_max_length", stray,
                       f"Keep one source of truth for the context length: remove model_max_length from config.json "
                       f"(it is a tokenizer key), or raise {key} only if the model supports it.", _SRC_LEN)
    if limit is None or ctx.target.max_model_len is None:
        return
    want = ctx.target.max_model_len
    if want > limit:
        field = key if key != "rope_scaling" else "rope_scaling.factor"
        yield _finding("config.max_len.exceeds_derived", Severity.ERROR,
                       (f"--max-model-len {want} is above the model's context limit {limit} "
                        f"({how or f'{key} {limit}, no rope scaling'}); vLLM refuses to start "
                        "(or, where an override applies, positions past the limit produce garbage)"),
                       field, cfg.get(key) if key in cfg else limit,
                       f"Serve with --max-model-len {limit} or less, or use a checkpoint with rope scaling for {want}.",
                       _SRC_LEN)
    elif how and how.startswith("yarn") and vllm is None and isinstance(cfg.get("max_position_embeddings"), int) \
            and want > cfg["max_position_embeddings"]:
        yield _finding("config.max_len.yarn_runtime_dependent", Severity.INFO,
                       (f"--max-model-len {want} fits the yarn limit {limit} ({how}); vLLM 0.32 no longer scales "
                        f"yarn and would derive max_position_embeddings {cfg['max_position_embeddings']}"),
                       "rope_scaling", cfg.get("rope_scaling") or cfg.get("rope_parameters"),
                       f"On vLLM >= 0.32 set max_position_embeddings to {limit} as the model card says.", _SRC_LEN)


def stored_dtype(ckpt: Checkpoint) -> str | None:
    """The torch dtype most weight bytes are stored in (bfloat16/float16/float32), counting only
    dense floating tensors (quantization scales and zero points excluded); None when unknown."""
    by_bytes: Counter[str] = Counter()
    for t in ckpt.tensors.values():
        if t.dtype in STORED_DTYPES and not t.name.endswith(QUANT_AUX_SUFFIXES):
            by_bytes[STORED_DTYPES[t.dtype]] += t.end - t.begin
    return by_bytes.most_common(1)[0][0] if by_bytes else None


def declared_dtype(cfg: dict[str, Any]) -> tuple[str | None, str]:
    """``(dtype, key)`` from ``torch_dtype`` (transformers 4) or ``dtype`` (transformers 5)."""
    for key in ("torch_dtype", "dtype"):
        v = cfg.get(key)
        if isinstance(v, str):
            return _DTYPE_ALIASES.get(v, v), key
    return None, "torch_dtype"


@check("config")
def dtype(ckpt: Checkpoint, ctx: CheckContext) -> Iterator[Finding]:
    """Declared dtype against the stored tensors and against the target ``--dtype``."""
    cfg = ckpt.config
    if not isinstance(cfg, dict):
        return
    text = ckpt.text_config
    declared, key = declared_dtype(cfg)
    if declared is None:
        declared, key = declared_dtype(text)
    stored = stored_dtype(ckpt)
    src = "vLLM ModelConfig dtype='auto' follows config torch_dtype; vllm-project/vllm#17154"
    if declared is None and stored:
        yield _finding("config.dtype.missing", Severity.WARNING,
                       (f"config.json does not say which dtype the weights are in (they are stored as {stored}); "
                        "with --dtype auto the runtime may pick float32 (twice the memory) or float16"),
                       "torch_dtype", None, f"Add \"torch_dtype\": \"{stored}\" to config.json.", src)
    elif declared and stored and declared != stored and "quantization_config" not in cfg:
        yield _finding("config.dtype.mismatch", Severity.WARNING,
                       (f"config.json declares {key} {declared} but the weights are stored as {stored}; --dtype auto "
                        f"would serve them as {declared} and size memory on a wrong assumption"),
                       key, declared, f"Set {key} to \"{stored}\" to match the tensors.", src)
    want = _DTYPE_ALIASES.get(ctx.target.dtype or "", ctx.target.dtype)
    forced = "the target forces --dtype float16"
    if want in (None, "auto") and (declared or stored) == "bfloat16" and ctx.target.gpu_cc \
            and version_lt(ctx.target.gpu_cc, "8.0"):
        # vLLM _get_and_verify_dtype: 'auto' on a GPU without bf16 (compute capability < 8.0) falls back to float16.
        want, forced = "float16", f"--dtype auto falls back to float16 on compute capability {ctx.target.gpu_cc}"
    if want != "float16":
        return
    mtype = text.get("model_type") or cfg.get("model_type")
    if mtype in FP16_UNSTABLE_MODEL_TYPES:
        yield _finding("config.dtype.fp16_unstable_family", Severity.ERROR,
                       (f"model_type {mtype} is on vLLM's list of architectures numerically unstable in float16 "
                        f"and {forced}; vLLM refuses it (or the output turns to NaN)"),
                       "model_type", mtype, "Serve with --dtype bfloat16 (or float32).",
                       "vLLM _FLOAT16_NOT_SUPPORTED_MODELS (config/model.py); vllm-project/vllm#17154")
    src_dtype = stored or declared
    if src_dtype in ("bfloat16", "float32"):
        yield _finding("config.dtype.half_precision_overflow", Severity.WARNING,
                       (f"the weights are {src_dtype} and {forced}: activations of "
                        "models trained in bf16 can exceed float16's range (65504) and become NaN (all-'!' output)"),
                       key, declared, "Serve with --dtype bfloat16 on GPUs that support it (compute capability >= 8.0).",
                       "vllm-project/vllm#17154, allenai/olmo-cookbook#60")


#: model_types whose vLLM MLP accepts only ``hidden_act`` "silu" ("Unsupported activation: ... Only silu is
#: supported for now": vLLM 0.32 model_executor/models llama.py, mistral.py, qwen2.py, qwen2_moe.py,
#: qwen3_moe.py, granite.py, internlm2.py, exaone.py, deepseek_v2.py and others; transformers accepts any ACT2FN name).
SILU_ONLY_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "granite",
                                   "internlm2", "exaone", "deepseek_v2", "deepseek_v3", "solar", "orion", "glm4_moe"})


@check("config")
def activation(ckpt: Checkpoint, ctx: CheckContext) -> Iterator[Finding]:
    """``hidden_act`` is one vLLM's MLP implements for this family (silu only for the Llama-style MLPs)."""
    cfg = ckpt.text_config
    mtype, act = cfg.get("model_type"), cfg.get("hidden_act")
    if mtype in SILU_ONLY_MODEL_TYPES and act is not None and act != "silu":
        yield _finding("config.hidden_act.unsupported", Severity.ERROR,
                       (f"config.json hidden_act is {act!r}, but vLLM's {mtype} MLP implements only silu: startup "
                        f"fails with 'Unsupported activation: {act}. Only silu is supported for now'"),
                       "hidden_act", act, "Set hidden_act to \"silu\" if the model was trained with it; otherwise "
                       "this config does not describe the weights.",
                       "vLLM LlamaMLP/Qwen2MLP (model_executor/models/llama.py, qwen2.py)")


#: config keys transformers' config classes type as ``int`` (sizes, counts, lengths).
INT_FIELDS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "num_hidden_layers",
              "vocab_size", "max_position_embeddings", "head_dim")


def _int_fields(cfg: dict[str, Any]) -> list[Finding]:
    """Sizes written as strings or fractions: transformers >= 5.19 (the runtime venv's) refuses them in its strict
    config dataclasses (``StrictDataclassFieldValidationError``), older ones pass them on to a crash."""
    out = []
    for k in INT_FIELDS:
        v = cfg.get(k)
        if k in cfg and v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            fixed = int(v) if isinstance(v, float) and v.is_integer() else \
                int(v) if isinstance(v, str) and v.strip().isdigit() else None
            out.append(_finding("config.field.wrong_type", Severity.ERROR,
                                f"config.json {k} is {v!r} ({type(v).__name__}), not an integer: vLLM's transformers "
                                "refuses the config at startup", k, v,
                                f"Write {k} as an integer" + (f": {fixed}." if fixed is not None else "."),
                                "transformers strict config validation (StrictDataclassFieldValidationError, >= 5.19)"))
    return out
