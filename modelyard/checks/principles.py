"""Rules by principle, from declared tables, so that kinds nobody listed are caught.

1. **Every fact stated twice must agree** (:data:`STATED_TWICE`): the same setting in two places or two
   spellings of ``config.json``, the transformers-4 and -5 keys (``torch_dtype`` / ``dtype``, ``rope_scaling`` /
   ``rope_theta`` / ``rope_parameters``) and a nested ``text_config`` against the top level. Which copy a runtime
   reads depends on the runtime and its version (vLLM builds the language model from ``text_config``,
   ``ModelConfig.hf_text_config``; transformers 5 reads ``dtype`` and ``rope_parameters``, transformers 4
   ``torch_dtype``, ``rope_scaling`` and ``rope_theta``), so two copies that disagree make two servers of one
   checkpoint compute different things. One copy alone is never a finding here. ``generation_config.json``'s
   ``do_sample: false`` beside sampling values (:data:`SAMPLING_DEFAULTS`) is the same shape: transformers decodes
   greedily and refuses to save such a file (``GenerationConfig.validate``), vLLM ignores ``do_sample`` and makes
   the values its default sampling parameters (``ModelConfig.get_diff_sampling_param``).
2. **Every name a file refers to must resolve** (:data:`NAME_LISTS`): the modules ``quantization_config`` keeps
   unquantized (compressed-tensors ``ignore``; ``modules_to_not_convert`` of AWQ, GPTQ, bitsandbytes and FP8)
   against the modules the checkpoint's tensors belong to. A name that matches no module keeps nothing
   unquantized: the layer it meant (under another spelling, e.g. another release's module names) is built
   quantized by vLLM while its weights are stored dense.

Each finding names the two places (or the dangling name) and the runtime behaviour that makes it matter.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from modelyard.checks.base import DTYPE_ALIASES, CheckContext, Finding, Severity, check

if TYPE_CHECKING:
    from modelyard.model.checkpoint import Checkpoint

_MISSING = object()


@dataclass(frozen=True)
class StatedTwice:
    """One fact ``config.json`` states in two places: its finding ``code`` (``config.stated_twice.<fact>``), the two dotted
    paths ``a`` and ``b`` (each a tuple of spellings, the first present one read), the ``severity`` of a
    disagreement, what each runtime reads (``matters``) and the ``source`` of that behaviour."""

    code: str
    a: tuple[str, ...]
    b: tuple[str, ...]
    severity: Severity
    matters: str
    source: str


_T4_T5 = "transformers PretrainedConfig (transformers 5 renamed torch_dtype to dtype and moved RoPE into rope_parameters)"
_TEXT = "vLLM ModelConfig.hf_text_config (get_hf_text_config); transformers composite configs (sub_configs)"

#: the facts config.json may state twice (principle 1)
STATED_TWICE: tuple[StatedTwice, ...] = (
    StatedTwice("config.stated_twice.dtype", ("torch_dtype",), ("dtype",), Severity.ERROR,
                "transformers 5 and vLLM on it read dtype, transformers 4 reads torch_dtype: the weights are served in "
                "a different precision by version", _T4_T5),
    StatedTwice("config.stated_twice.rope_theta", ("rope_theta",), ("rope_parameters.rope_theta",), Severity.ERROR,
                "transformers 5 reads rope_parameters, transformers 4 and vLLM's compatibility path rope_theta: "
                "positions rotate at a different base by version", _T4_T5 + "; vLLM patch_rope_parameters"),
    StatedTwice("config.stated_twice.rope_type", ("rope_scaling.rope_type", "rope_scaling.type"), ("rope_parameters.rope_type",),
                Severity.ERROR, "transformers 4 scales RoPE by rope_scaling, transformers 5 by rope_parameters: "
                "long contexts are scaled by another rule by version", _T4_T5 + "; vLLM patch_rope_parameters"),
    StatedTwice("config.stated_twice.rope_factor", ("rope_scaling.factor",), ("rope_parameters.factor",), Severity.ERROR,
                "transformers 4 scales RoPE by rope_scaling, transformers 5 by rope_parameters: long contexts are "
                "scaled by another factor by version", _T4_T5 + "; vLLM patch_rope_parameters"),
    StatedTwice("config.stated_twice.tie_word_embeddings", ("tie_word_embeddings",), ("text_config.tie_word_embeddings",), Severity.ERROR,
                "vLLM builds the language model from text_config, transformers ties a composite model's head by the "
                "top level: one serves lm_head tied to the embeddings, the other a separate head", _TEXT),
    StatedTwice("config.stated_twice.vocab_size", ("vocab_size",), ("text_config.vocab_size",), Severity.ERROR,
                "vLLM sizes the embeddings and logits from text_config, a reader of the top level from vocab_size",
                _TEXT),
    StatedTwice("config.stated_twice.max_position_embeddings", ("max_position_embeddings",), ("text_config.max_position_embeddings",),
                Severity.WARNING, "vLLM derives max_model_len from text_config, a reader of the top level from "
                "max_position_embeddings", _TEXT + "; vLLM _get_and_verify_max_len"),
    StatedTwice("config.stated_twice.rope_theta_text", ("rope_theta",), ("text_config.rope_theta",), Severity.ERROR,
                "vLLM builds the language model's rotary embedding from text_config, a reader of the top level from "
                "rope_theta", _TEXT),
)

#: transformers' GenerationConfig defaults of the values only sampling reads (a value equal to its default is no
#: second statement)
SAMPLING_DEFAULTS: dict[str, float | None] = {"temperature": 1.0, "top_p": 1.0, "top_k": 50, "min_p": None,
                                               "typical_p": 1.0}

#: quantization_config lists of module names kept unquantized, and how the loader matches an entry (principle 2):
#: ``exact`` a module name or ``re:<regex>`` (compressed-tensors ``should_ignore_layer``: also the fused q/k/v and
#: gate/up names), ``substring`` any module whose name contains the entry (transformers' and AutoAWQ's
#: ``modules_to_not_convert``)
NAME_LISTS: dict[str, str] = {"ignore": "exact", "modules_to_not_convert": "substring"}

#: parameter suffixes of a module's tensors (a tensor ``<module>.<suffix>``)
_PARAM = re.compile(r"\.(weight|bias|weight_scale|weight_zero_point|weight_g_idx|weight_shape|weight_packed|"
                    r"input_scale|qweight|qzeros|scales|g_idx|SCB|weight_format|absmax|quant_map|quant_state.*)$")
#: a fused module vLLM builds from these checkpoint modules (an ignore entry may name either side)
_FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def _get(doc: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(doc, dict) or part not in doc:
            return _MISSING
        doc = doc[part]
    return doc


def _first(doc: dict[str, Any], spellings: tuple[str, ...]) -> tuple[str, Any]:
    for p in spellings:
        v = _get(doc, p)
        if v is not _MISSING:
            return p, v
    return spellings[0], _MISSING


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool) and not isinstance(b, bool):
        return float(a) == float(b)
    if isinstance(a, str) and isinstance(b, str):  # "bf16" / "bfloat16", "torch.bfloat16" / "bfloat16"
        return _norm(a) == _norm(b)
    return bool(a == b)


def _norm(s: str) -> str:
    return DTYPE_ALIASES.get(s, s)


@check("config")
def stated_twice(ckpt: Checkpoint, ctx: CheckContext) -> Iterator[Finding]:
    """Principle 1 over :data:`STATED_TWICE` (codes ``config.stated_twice.<fact>``) and ``generation_config.json``'s
    ``do_sample: false`` beside sampling values (``config.stated_twice.do_sample``)."""
    cfg = ckpt.config
    if isinstance(cfg, dict):
        for t in STATED_TWICE:
            pa, va = _first(cfg, t.a)
            pb, vb = _first(cfg, t.b)
            if va is _MISSING or vb is _MISSING or _same(va, vb):
                continue
            fact = t.code.rpartition(".")[2]
            yield Finding(t.code, t.severity,
                          f"config.json states {fact} twice and the two disagree: {pa} is {va!r}, {pb} is {vb!r}; "
                          f"{t.matters}", file="config.json", field=pb, value={pa: va, pb: vb},
                          fix=f"Keep one value in both places (the one the weights were trained with), or drop {pa}.",
                          source=t.source)
    gen = ckpt.generation_config
    if isinstance(gen, dict) and gen.get("do_sample") is False:
        stated = {k: gen[k] for k, d in SAMPLING_DEFAULTS.items() if gen.get(k) is not None and gen[k] != d}
        if stated:
            values = ", ".join(f"{k} {v}" for k, v in stated.items())
            yield Finding("config.stated_twice.do_sample", Severity.WARNING,
                          f"generation_config.json says do_sample false (greedy) and also {values}: transformers decodes "
                          "greedily and refuses to save this file, vLLM ignores do_sample and makes these the default "
                          "sampling parameters of every request that does not set them",
                          file="generation_config.json", field="do_sample", value={"do_sample": False, **stated},
                          fix="Drop the sampling values (greedy) or set do_sample true (sampling); or serve with "
                              "--generation-config vllm to ignore the file's defaults.",
                          source="transformers GenerationConfig.validate; vLLM ModelConfig.get_diff_sampling_param")


def module_names(tensor_names: Any) -> set[str]:
    """The modules the runtime builds for ``tensor_names``: the modules they belong to
    (``model.layers.0.mlp.down_proj.weight`` -> ``model.layers.0.mlp.down_proj``), each fused name vLLM builds from
    them (``qkv_proj`` beside ``q_proj``, :data:`_FUSED`), and ``lm_head``, which a causal LM builds whether its
    weight is stored or tied to the embeddings (llm-compressor's default ``ignore: [lm_head]``)."""
    mods = {_PARAM.sub("", n) for n in tensor_names} | {"lm_head"}
    for m in list(mods):
        head, _, last = m.rpartition(".")
        for fused, parts in _FUSED.items():
            if last in parts:
                mods.add(f"{head}.{fused}" if head else fused)
    return mods


def resolves(entry: str, how: str, modules: set[str]) -> bool:
    """Whether the quantization list entry ``entry`` names a module of ``modules`` as the loader matches it
    (``how``: :data:`NAME_LISTS`). A class name (``Linear``) or a regex that compiles is taken as resolving when it
    matches any module; a plain ``exact`` name must be a module or a dotted suffix of one."""
    if entry.startswith("re:"):
        try:
            rx = re.compile(entry[3:])
        except re.error:
            return False
        return any(rx.match(m) for m in modules)
    if how == "substring":
        return any(entry in m for m in modules)
    return entry in modules or any(m.endswith("." + entry) for m in modules)


@check("quantization")
def names_resolve(ckpt: Checkpoint, ctx: CheckContext) -> Iterator[Finding]:
    """Principle 2 over :data:`NAME_LISTS` (``quantization.name_unresolved``): every entry of
    ``quantization_config.ignore`` / ``modules_to_not_convert`` must name a module of the checkpoint's tensors.
    Class names (an upper-case first letter, compressed-tensors' ``Linear``) are not module names and are left."""
    cfg = ckpt.config
    if not isinstance(cfg, dict):
        return
    q = cfg.get("quantization_config", ckpt.text_config.get("quantization_config"))
    if not isinstance(q, dict) or not ckpt.tensors:
        return
    modules = module_names(ckpt.tensors)
    for key, how in NAME_LISTS.items():
        entries = q.get(key)
        if not isinstance(entries, list):
            continue
        dangling = [e for e in entries if isinstance(e, str) and e and not e[:1].isupper() and not resolves(e, how, modules)]
        if not dangling:
            continue
        shown = ", ".join(repr(e) for e in dangling[:5]) + (f" and {len(dangling) - 5} more" if len(dangling) > 5 else "")
        yield Finding("quantization.name_unresolved", Severity.WARNING,
                      f"quantization_config.{key} names {len(dangling)} module(s) the checkpoint's tensors do not have: "
                      f"{shown}; such an entry keeps nothing unquantized, so a layer it meant under another name is "
                      "built quantized by vLLM while its weights are stored dense (a load error or wrong outputs)",
                      file="config.json", field=f"quantization_config.{key}", value=dangling,
                      fix="Write the module names as the tensors spell them (e.g. lm_head, "
                          "model.layers.0.mlp.down_proj) or as re:<regex>; drop names of other architectures.",
                      source="compressed-tensors / vLLM CompressedTensorsConfig ignore (should_ignore_layer); "
                             "transformers and AutoAWQ modules_to_not_convert")
