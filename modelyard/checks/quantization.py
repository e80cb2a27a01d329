"""quantization: ``quantization_config`` is present exactly when the tensors are quantized, names a
method the target vLLM loads, and the tensors match the method.

Rules and their sources:

- vLLM reads ``config.json`` ``quantization_config.quant_method`` (``get_quant_config``); a block
  without it fails with ``KeyError 'quant_method'`` (vllm-project/vllm#1912, unslothai/unsloth#482).
- The method must be in the target's ``QUANTIZATION_METHODS`` ("Unknown quantization method");
  the table below gives the release that added each method (vLLM release notes; bitsandbytes:
  vllm-project/vllm#4776 in 0.5.0) and vLLM 0.32's own list.
- Quantized-looking tensors (``qweight``, ``weight_packed``, FP8/INT8 weights with scales) with no
  declaration are loaded as dense and fail on shape, or produce garbage (vllm-project/vllm#2170).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from modelyard.checks.base import CheckContext, Finding, Severity, check
from modelyard.checks.versions import version_lt
from modelyard.model.checkpoint import Checkpoint

#: vLLM 0.32 ``QuantizationMethods`` (model_executor/layers/quantization/__init__.py).
VLLM_LATEST = "0.32"
VLLM_LATEST_METHODS = frozenset({
    "awq", "auto_awq", "fp8", "fbgemm_fp8", "fp_quant", "modelopt", "modelopt_fp4", "modelopt_mxfp8",
    "modelopt_mixed", "auto_gptq", "gptq", "gptq_marlin", "awq_marlin", "humming", "compressed-tensors",
    "experts_int8", "quark", "moe_wna16", "torchao", "inc", "mxfp4", "gpt_oss_mxfp4", "deepseek_v4_fp8", "online",
})
#: quant_method -> first vLLM release that loads it (release notes; approximate for the newer ones).
QUANT_METHOD_SINCE: dict[str, str] = {
    "awq": "0.2.0", "squeezellm": "0.2.0", "gptq": "0.2.2", "marlin": "0.3.3", "fp8": "0.4.1",
    "gptq_marlin": "0.4.3", "deepspeedfp": "0.4.3", "compressed-tensors": "0.5.0", "bitsandbytes": "0.5.0",
    "awq_marlin": "0.5.1", "fbgemm_fp8": "0.5.2", "experts_int8": "0.5.4", "gguf": "0.5.5", "modelopt": "0.6.4",
    "hqq": "0.6.4", "ipex": "0.6.3", "quark": "0.7.0", "torchao": "0.7.0", "moe_wna16": "0.7.2",
    "modelopt_fp4": "0.8.5", "inc": "0.8.0", "mxfp4": "0.10.1",
}
#: suffixes / dtypes that only a quantized checkpoint stores.
_PACKED = (".qweight", ".weight_packed")
_QUANT_DTYPES = {"F8_E4M3", "F8_E5M2", "F4"}
_SRC_METHOD = "vLLM get_quant_config / QUANTIZATION_METHODS; vllm-project/vllm#1912, #2170"


def _f(code: str, severity: Severity, message: str, field: str | None, value: Any, fix: str, source: str) -> Finding:
    return Finding(code=code, severity=severity, message=message, file="config.json", field=field, value=value,
                   fix=fix, source=source)


def quantized_tensors(ckpt: Checkpoint) -> list[str]:
    """Names of tensors whose name or dtype only a quantized export produces: packed weights, FP8/FP4
    weights, and INT8 weights that carry a ``weight_scale`` beside them (W8A8 int8)."""
    names = ckpt.tensors
    return sorted(n for n, t in names.items()
                  if n.endswith(_PACKED) or (n.endswith(".weight") and t.dtype in _QUANT_DTYPES)
                  or (n.endswith(".weight") and t.dtype == "I8" and n[: -len(".weight")] + ".weight_scale" in names))


@check("quantization")
def quantization_config(ckpt: Checkpoint, ctx: CheckContext) -> Iterator[Finding]:
    cfg = ckpt.config
    if not isinstance(cfg, dict):
        return
    q = cfg.get("quantization_config", ckpt.text_config.get("quantization_config"))
    qt = quantized_tensors(ckpt)
    if q is None:
        if qt:
            yield _f("quantization.undeclared", Severity.ERROR,
                     (f"{len(qt)} tensor(s) are quantized (e.g. {qt[0]}, {ckpt.tensors[qt[0]].dtype}) but config.json "
                      "has no quantization_config: vLLM would load them as dense weights"),
                     "quantization_config", None,
                     "Restore quantization_config from the quantizer's output (or quantize_config.json).", _SRC_METHOD)
        return
    if not isinstance(q, dict):
        yield _f("quantization.invalid", Severity.ERROR, "config.json quantization_config is not an object",
                 "quantization_config", q, "Restore quantization_config from the quantizer's output.", _SRC_METHOD)
        return
    method = q.get("quant_method")
    if not isinstance(method, str):
        keys = ", ".join(sorted(q)[:6])
        yield _f("quantization.method_missing", Severity.ERROR,
                 (f"config.json has a quantization_config ({keys}) but no quant_method, so vLLM cannot tell which "
                  "quantization it is (KeyError 'quant_method')"
                  + ("; the stored weights are dense, so the block looks stale" if not qt else "")),
                 "quantization_config.quant_method", None,
                 "Remove the block if the weights are not pre-quantized (merge adapters to 16-bit before export); "
                 "otherwise set quant_method and its keys.", "vllm-project/vllm#1912, unslothai/unsloth#482")
        return
    known = method in VLLM_LATEST_METHODS or method in QUANT_METHOD_SINCE
    vllm = ctx.target.vllm_version
    field = "quantization_config.quant_method"
    if not known:
        yield _f("quantization.method_unknown", Severity.ERROR,
                 f"quant_method {method!r} is not a quantization method any vLLM release loads", field, method,
                 "Re-quantize with llm-compressor (compressed-tensors), AWQ or GPTQ.", _SRC_METHOD)
        return
    since = QUANT_METHOD_SINCE.get(method)
    if vllm is not None:
        if since and version_lt(vllm, since):
            yield _f("quantization.method_unsupported", Severity.ERROR,
                     (f"quant_method {method} is not among the quantization methods of vLLM {vllm} (added in {since}); "
                      "config parsing stops with an unknown-quantization-method error"), field, method,
                     f"Target vLLM >= {since}, or export unquantized 16-bit weights without the block.", _SRC_METHOD)
            return
        if not version_lt(vllm, VLLM_LATEST) and method not in VLLM_LATEST_METHODS:
            yield _f("quantization.method_unsupported", Severity.ERROR,
                     f"quant_method {method} is not among the quantization methods of vLLM {VLLM_LATEST}", field,
                     method, "Re-quantize to a method the target loads (compressed-tensors, awq, gptq, fp8).",
                     _SRC_METHOD)
            return
    elif method not in VLLM_LATEST_METHODS:
        yield _f("quantization.method_not_in_latest", Severity.INFO,
                 f"quant_method {method} is not in vLLM {VLLM_LATEST}'s list of quantization methods",
                 field, method, "State the serving runtime with --vllm-version to judge it.", _SRC_METHOD)
    yield from _tensors_match(ckpt, method, q, qt)
    if method == "compressed-tensors":
        yield from _compressed_tensors(ckpt, q, qt)
    yield from _quantized_lm_head(ckpt, method, vllm)


_SRC_CT = "compressed-tensors QuantizationConfig (the schema vLLM parses config_groups with); vLLM CompressedTensorsConfig"


def _compressed_tensors(ckpt: Checkpoint, q: dict[str, Any], qt: list[str]) -> Iterator[Finding]:
    """A compressed-tensors ``quantization_config`` the library's own schema accepts, whose groups target
    something, whose ``num_bits`` matches the stored integer dtype, and whose ``group_size`` divides the
    input widths (vLLM finds no compressed-tensors scheme for a layer otherwise)."""
    try:
        from compressed_tensors.quantization import QuantizationConfig  # noqa: PLC0415 - heavy: compressed-tensors, imported on first use
    except ImportError:  # the quantize extra is not installed: the runtime oracle judges the schema
        QuantizationConfig = None
    if QuantizationConfig is not None:
        # vLLM validates each group's weights/input_activations/output_activations with QuantizationArgs and
        # ignores other keys of a group (CompressedTensorsConfig._quantization_scheme_map_from_config; an extra
        # group key loads, measured by benchmarks/differential.py): validate what vLLM validates.
        from compressed_tensors.quantization import QuantizationScheme  # noqa: PLC0415 - heavy: compressed-tensors, imported on first use

        known = set(QuantizationScheme.model_fields)
        q = {**q, "config_groups": {k: ({kk: vv for kk, vv in g.items() if kk in known} if isinstance(g, dict) else g)
                                    for k, g in q["config_groups"].items()}} \
            if isinstance(q.get("config_groups"), dict) else q
        try:
            QuantizationConfig.model_validate(q)
        except Exception as exc:
            errs: list[dict[str, Any]] = getattr(exc, "errors", lambda: [])()
            where = ".".join(str(x) for x in errs[0]["loc"] if "function-after" not in str(x)) if errs else None
            why = errs[0]["msg"] if errs else str(exc).splitlines()[0]
            yield _f("quantization.config_invalid", Severity.ERROR,
                     f"quantization_config is not a valid compressed-tensors config: {where}: {why}",
                     f"quantization_config.{where}" if where else "quantization_config", where,
                     "Quantize again with llm-compressor (a release that matches the runtime's compressed-tensors), "
                     "or restore the block the quantizer wrote.", _SRC_CT)
            return
    groups: dict[str, Any] = q["config_groups"] if isinstance(q.get("config_groups"), dict) else {}
    if qt and groups and all(not (g or {}).get("targets") for g in groups.values()):
        yield _f("quantization.no_targets", Severity.ERROR,
                 f"every config group has an empty targets list, yet {len(qt)} tensor(s) are quantized (e.g. {qt[0]}): "
                 "vLLM builds dense layers and finds no parameter for the scales",
                 "quantization_config.config_groups", None,
                 "Restore the targets the quantizer wrote (usually [\"Linear\"]).", _SRC_CT)
    stored_int8 = any(t.dtype == "I8" for n, t in ckpt.tensors.items() if n in qt)
    widths = sorted({w for w in (ckpt.text_config.get("hidden_size"), ckpt.text_config.get("intermediate_size"))
                     if isinstance(w, int) and not isinstance(w, bool) and w > 0})
    for gname, g in groups.items():
        w = (g or {}).get("weights") or {}
        bits = w.get("num_bits")
        if stored_int8 and q.get("format") == "int-quantized" and isinstance(bits, int) and bits != 8:
            yield _f("quantization.num_bits_mismatch", Severity.ERROR,
                     f"config_groups.{gname} says {bits}-bit weights, but the stored weights are INT8 (int-quantized): "
                     "the runtime would unpack them with the wrong width and answer garbage",
                     f"quantization_config.config_groups.{gname}.weights.num_bits", bits,
                     "Set num_bits to 8, or restore the config the quantizer wrote.", _SRC_CT)
        gs = w.get("group_size")
        if w.get("strategy") == "group" and isinstance(gs, int) and gs > 0:
            bad = [x for x in widths if x % gs]
            if bad:
                yield _f("quantization.group_size_not_dividing", Severity.ERROR,
                         f"config_groups.{gname} group_size {gs} does not divide the input width(s) {bad} "
                         "(hidden_size / intermediate_size): vLLM finds no compressed-tensors scheme for those layers",
                         f"quantization_config.config_groups.{gname}.weights.group_size", gs,
                         f"Quantize with a group_size that divides {bad[0]} (e.g. 32, 64 or 128).", _SRC_CT)


#: quant_method -> first vLLM release that loads a quantized ``lm_head``. compressed-tensors: vLLM PR #37291
#: ("Handle ParallelLMHead in compressed-tensors get_quant_method", merged 2026-03-17; first release after it,
#: approximate); GPTQ's ``lm_head`` flag: vLLM PR #4442 (0.4.3).
LM_HEAD_QUANT_SINCE: dict[str, str] = {"compressed-tensors": "0.18.0", "gptq": "0.4.3", "gptq_marlin": "0.4.3"}


def _quantized_lm_head(ckpt: Checkpoint, method: str, vllm: str | None) -> Iterator[Finding]:
    """``lm_head`` stored quantized (packed, FP8, or with scales) instead of a dense ``lm_head.weight``."""
    head = sorted(n for n in ckpt.tensors if n.startswith("lm_head.") and (
        n != "lm_head.weight" or ckpt.tensors[n].dtype in _QUANT_DTYPES or ckpt.tensors[n].dtype in ("I8", "I32", "U8")))
    if not head:
        return
    since = LM_HEAD_QUANT_SINCE.get(method)
    src = ("vLLM ParallelLMHead quant_method (vllm-project/vllm#37291); vllm-project/llm-compressor#1820, "
           "sgl-project/sglang#35358")
    what = f"the weights hold {', '.join(head[:4])} instead of a dense lm_head.weight"
    fix = ("Re-run the quantization with lm_head in ignore (the llm-compressor default), so lm_head.weight stays "
           "dense; keep a quantized head only for a runtime known to support it.")
    if vllm is not None and (since is None or version_lt(vllm, since)):
        yield Finding("quantization.lm_head.unsupported", Severity.ERROR,
                      (f"lm_head is quantized ({what}), which vLLM {vllm} cannot load for {method}"
                       + (f" (first supported in {since})" if since else "")
                       + ": it stops with 'There is no module or parameter named lm_head.weight_packed'"),
                      file=ckpt.tensor_shard.get(head[0]), field="lm_head", value=head, fix=fix, source=src)
        return
    yield Finding("quantization.lm_head.quantized", Severity.WARNING,
                  (f"lm_head is quantized ({what}); vLLM's LM head is not a regular linear layer: "
                   f"{method} learned to load it only in vLLM {since or '(no release known)'}, older vLLM refuses it "
                   "and other runtimes (sglang before its fix) load it silently and answer '!!!!'"),
                  file=ckpt.tensor_shard.get(head[0]), field="lm_head", value=head, fix=fix, source=src)


def _tensors_match(ckpt: Checkpoint, method: str, q: dict[str, Any], qt: list[str]) -> Iterator[Finding]:
    if not ckpt.weights_readable:
        return
    names = ckpt.tensors
    need: str | None = None
    if method in ("awq", "gptq", "auto_awq", "auto_gptq", "awq_marlin", "gptq_marlin", "marlin"):
        if not any(n.endswith(".qweight") for n in names):
            need = "qweight/qzeros/scales tensors"
    elif method == "fp8":
        # vLLM Fp8Config: a quant_method "fp8" in config.json means is_checkpoint_fp8_serialized.
        if not any(t.dtype in ("F8_E4M3", "F8_E5M2") for t in names.values()):
            need = "FP8 (F8_E4M3) weights"
    elif method == "compressed-tensors":
        fmt = q.get("format")
        if fmt not in (None, "dense") and not qt and not any(n.endswith(".weight_scale") for n in names):
            need = f"{fmt} tensors (weight_packed or weight_scale)"
    if need:
        yield _f("quantization.tensors_not_quantized", Severity.ERROR,
                 f"quant_method is {method} but the weights have no {need}: they are dense, so the block is stale "
                 "or the quantized shards are missing", "quantization_config", method,
                 "Remove quantization_config if the weights are meant to be dense, or ship the quantized shards.",
                 _SRC_METHOD)
