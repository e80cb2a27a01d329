"""Adapter ↔ base: whether vLLM can apply a PEFT LoRA adapter folder to a base model.

A LoRA artifact holds ``adapter_config.json`` and ``adapter_model.safetensors`` and names its base
artifact by digest (:mod:`modelyard.artifact.manifest`). These checks judge the pair from the adapter's
config and tensor headers and the base's ``config.json`` and tensor headers; no weight byte is read.

Rules and their sources (vLLM 0.32, the runtime this repository pins):

- the base architecture must be one whose LoRA modules are known (:data:`LORA_MODULES`); the adapter's
  ``base_model_name_or_path`` is informative only (a hub id or a training machine's path), so the
  match is judged by shapes: every ``lora_A`` ``(r, in)`` / ``lora_B`` ``(out, r)`` pair must sit on a
  base ``weight`` of shape ``(out, in)`` (PEFT ``LoraLayer``: ``lora_A = Linear(in, r)``,
  ``lora_B = Linear(r, out)``). A module the base lacks (a layer index past ``num_hidden_layers``,
  another family's module names) or a shape that differs (another ``hidden_size``) fails there;
- every adapted module's last name must be one vLLM applies LoRA to for that architecture
  (``vllm/lora/lora_model.py`` ``LoRAModel.from_local_checkpoint``: "expected target modules in ...");
- ``r`` (and every ``rank_pattern`` rank) must not exceed ``--max-lora-rank``, one of
  :data:`MAX_LORA_RANKS`, default 16 (``vllm/config/lora.py`` ``MaxLoRARanks``, ``LoRAConfig.max_lora_rank``);
- ``modules_to_save`` other than ``classifier``/``score`` and the PEFT features vLLM refuses (DoRA, LoRA
  bias, PiSSA-style inits, aLoRA, layer replication, BD-LoRA, QALoRA) fail
  (``vllm/lora/peft_helper.py`` ``PEFTHelper._validate_features``);
- adapter tensors in another dtype than the base are cast to the base's (``LoRAConfig.lora_dtype`` "auto" =
  the model dtype): an info finding.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelyard.checks.base import Finding, Severity
from modelyard.errors import SafetensorsHeaderError
from modelyard.model.checkpoint import Checkpoint, TensorInfo

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
#: vLLM's allowed ``--max-lora-rank`` values and its default (``vllm/config/lora.py``, ``MaxLoRARanks``)
MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
DEFAULT_MAX_LORA_RANK = 16
_LLAMA_LINEAR = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
_PACKED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def _supported(linear: tuple[str, ...], embedding: tuple[str, ...]) -> frozenset[str]:
    """vLLM's expected LoRA module names: every linear layer's last name (``vllm/lora/utils.py``
    ``get_supported_lora_modules``: "all linear layers support LoRA"), the model's ``embedding_modules``,
    and each packed module's parts (``vllm/lora/worker_manager.py``: ``packed_modules_mapping`` expanded)."""
    return frozenset((*linear, *embedding, *(p for m in linear for p in _PACKED.get(m, ()))))


#: architecture → the module names vLLM 0.32 applies LoRA to. Sources: ``vllm/model_executor/models/llama.py``
#: ``LlamaForCausalLM.packed_modules_mapping`` {qkv_proj: [q,k,v]_proj, gate_up_proj: [gate,up]_proj} and
#: ``embedding_modules`` {embed_tokens, lm_head}; its linear layers qkv_proj, o_proj, gate_up_proj, down_proj;
#: ``mistral.py`` ``MistralForCausalLM(LlamaForCausalLM)`` with ``embedding_modules = {}``; ``qwen2.py`` the same
#: packed mapping and no embedding modules.
LORA_MODULES: dict[str, frozenset[str]] = {
    "LlamaForCausalLM": _supported(_LLAMA_LINEAR, ("embed_tokens", "lm_head")),
    "MistralForCausalLM": _supported(_LLAMA_LINEAR, ()),
    "Qwen2ForCausalLM": _supported(_LLAMA_LINEAR, ()),
}
_VLLM_SRC = "vLLM 0.32 vllm/lora/lora_model.py LoRAModel.from_local_checkpoint"
_PEFT_PREFIX = "base_model.model."
_LORA_NAME = re.compile(r"^(?P<module>.+)\.lora_(?P<ab>A|B|embedding_A|embedding_B)(?:\.[^.]+)?\.weight$")


@dataclass(frozen=True)
class Adapter:
    """A PEFT adapter folder, read header-only: ``config`` (adapter_config.json, ``{}`` when unreadable),
    its ``tensors`` (name → :class:`TensorInfo`, shapes in elements) and what could not be read (``problem``)."""

    root: Path
    config: dict[str, Any]
    tensors: dict[str, TensorInfo]
    problem: str | None = None

    @property
    def rank(self) -> int | None:
        r = self.config.get("r")
        return r if isinstance(r, int) and not isinstance(r, bool) else None

    @property
    def max_rank(self) -> int | None:
        """The largest rank of any module: ``r`` and every ``rank_pattern`` value."""
        ranks = [self.rank or 0, *(v for v in (self.config.get("rank_pattern") or {}).values() if isinstance(v, int))]
        return max(ranks) or None

    @property
    def base_hint(self) -> str | None:
        """``base_model_name_or_path``: what the adapter was trained on, as written (informative only)."""
        b = self.config.get("base_model_name_or_path")
        return b if isinstance(b, str) and b else None


def is_adapter(folder: Path) -> bool:
    """True when ``folder`` is a PEFT adapter folder: adapter_config.json and no config.json."""
    return (folder / ADAPTER_CONFIG).is_file() and not (folder / "config.json").is_file()


def read_adapter(folder: Path) -> Adapter:
    """Read ``folder``'s adapter_config.json and adapter_model.safetensors header (no weight bytes)."""
    ckpt = Checkpoint(folder)
    data, err = ckpt.json(ADAPTER_CONFIG)
    if not isinstance(data, dict):
        return Adapter(folder, {}, {}, f"{ADAPTER_CONFIG} is not a JSON object" + (f": {err}" if err else ""))
    if ADAPTER_WEIGHTS not in ckpt.files:
        return Adapter(folder, data, {}, f"no {ADAPTER_WEIGHTS}"
                       + (" (only adapter_model.bin, a pickle)" if "adapter_model.bin" in ckpt.files else ""))
    try:
        return Adapter(folder, data, dict(ckpt.header(ADAPTER_WEIGHTS).tensors))
    except (SafetensorsHeaderError, OSError) as exc:
        return Adapter(folder, data, {}, f"{ADAPTER_WEIGHTS} header cannot be read: {exc}")


def _f(code: str, severity: Severity, message: str, fix: str, source: str, **kw: Any) -> Finding:
    return Finding(code=code, severity=severity, message=message, fix=fix, source=source, **kw)


def check_adapter(adapter: Adapter, base: Checkpoint, *, max_lora_rank: int | None = None) -> list[Finding]:
    """Every finding of ``adapter`` against ``base`` (module docstring). ``max_lora_rank``: the
    ``--max-lora-rank`` it will be served with (None: the smallest allowed value that holds the rank,
    which the serve plan then writes)."""
    return [*_config(adapter, max_lora_rank), *_tensors(adapter, base)]


def serve_rank(adapter: Adapter, max_lora_rank: int | None = None) -> int:
    """The ``--max-lora-rank`` to serve ``adapter`` with: ``max_lora_rank`` when given, else the
    smallest of :data:`MAX_LORA_RANKS` at or above its largest rank, at least vLLM's default 16."""
    if max_lora_rank is not None:
        return max_lora_rank
    need = max(adapter.max_rank or 1, DEFAULT_MAX_LORA_RANK)
    return next((r for r in MAX_LORA_RANKS if r >= need), MAX_LORA_RANKS[-1])


def _config(adapter: Adapter, max_lora_rank: int | None) -> Iterator[Finding]:
    cfg = adapter.config
    if adapter.problem:
        yield _f("adapter.unreadable", Severity.ERROR, f"the adapter cannot be read: {adapter.problem}",
                 "Save the adapter with peft save_pretrained(safe_serialization=True): adapter_config.json and "
                 "adapter_model.safetensors.", "vLLM reads adapter_model.safetensors (or .bin) beside adapter_config.json",
                 file=ADAPTER_CONFIG)
    kind = cfg.get("peft_type")
    if cfg and kind != "LORA":
        yield _f("adapter.not_lora", Severity.ERROR, f"peft_type is {kind!r}; vLLM serves LoRA adapters only",
                 "Serve a LoRA adapter, or merge this adapter into the base (peft merge_and_unload) and ingest the "
                 "merged model.", "vLLM --enable-lora loads PEFT LoRA adapters only (vllm/lora/peft_helper.py)",
                 file=ADAPTER_CONFIG, field="peft_type", value=kind)
    yield from _declared_ranks(cfg)
    rank = adapter.max_rank
    limit = serve_rank(adapter, max_lora_rank)
    if rank is not None and rank > limit:
        yield _f("adapter.rank_too_high", Severity.ERROR,
                 f"the adapter's rank {rank} is above --max-lora-rank {limit}; vLLM refuses to load it",
                 f"Serve with --max-lora-rank {next((r for r in MAX_LORA_RANKS if r >= rank), MAX_LORA_RANKS[-1])} "
                 f"(allowed: {', '.join(map(str, MAX_LORA_RANKS))})" if rank <= MAX_LORA_RANKS[-1] else
                 f"Retrain with r <= {MAX_LORA_RANKS[-1]}, the largest --max-lora-rank vLLM allows.",
                 "vLLM 0.32 vllm/config/lora.py MaxLoRARanks and max_lora_rank (default 16); the LoRA manager "
                 "refuses a rank above it", file=ADAPTER_CONFIG, field="r", value=rank, limit=limit)
    saved = [m for m in cfg.get("modules_to_save") or () if m not in ("classifier", "score")]
    if saved:
        yield _f("adapter.modules_to_save", Severity.ERROR,
                 f"modules_to_save {saved}: the adapter carries full trained copies of these modules, which vLLM "
                 "does not load for a generative model", "Merge the adapter into the base (peft merge_and_unload) "
                 "and ingest the merged model, or retrain without modules_to_save.",
                 "vLLM 0.32 vllm/lora/peft_helper.py: modules_to_save must be None or [\"classifier\", \"score\"]",
                 file=ADAPTER_CONFIG, field="modules_to_save", value=saved)
    init = cfg.get("init_lora_weights", True)
    feats = [name for name, on in (("use_dora", cfg.get("use_dora")), ("lora_bias", cfg.get("lora_bias")),
                                   ("alora_invocation_tokens", cfg.get("alora_invocation_tokens")),
                                   ("layer_replication", cfg.get("layer_replication")),
                                   ("use_bdlora", cfg.get("use_bdlora")), ("use_qalora", cfg.get("use_qalora")),
                                   ("init_lora_weights", isinstance(init, str) and init.lower() not in
                                    ("gaussian", "eva", "orthogonal", "mica", "lora_ga"))) if on]
    if feats:
        yield _f("adapter.unsupported_feature", Severity.ERROR,
                 f"the adapter uses PEFT features vLLM does not implement: {', '.join(feats)}",
                 "Merge the adapter into the base (peft merge_and_unload) and ingest the merged model.",
                 "vLLM 0.32 vllm/lora/peft_helper.py PEFTHelper._validate_features", file=ADAPTER_CONFIG,
                 field=feats[0], value=feats)


def _positive_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _declared_ranks(cfg: dict[str, Any]) -> Iterator[Finding]:
    """``r`` and ``lora_alpha`` present, ``r`` and every ``rank_pattern`` value a positive integer, as vLLM's
    ``PEFTHelper`` requires (a float, string, zero or negative ``r`` loaded nowhere)."""
    if not cfg:
        return
    missing = [k for k in ("r", "lora_alpha") if k not in cfg]
    bad = [(k, v) for k, v in [("r", cfg.get("r")), *((f"rank_pattern.{p}", v) for p, v in
                                                       (cfg.get("rank_pattern") or {}).items())]
           if k not in missing and not _positive_int(v)]
    if missing or bad:
        what = [f"{k} is missing" for k in missing] + [f"{k} is {v!r}" for k, v in bad]
        yield _f("adapter.rank_invalid", Severity.ERROR,
                 f"adapter_config.json: {'; '.join(what)}; vLLM needs r and lora_alpha, and every rank a positive "
                 "integer", "Save the adapter with peft (LoraConfig(r=<a positive integer>, lora_alpha=...)); "
                 "r must be the rank its lora_A / lora_B tensors have.",
                 "vLLM 0.32 vllm/lora/peft_helper.py PEFTHelper.from_dict (required fields) and __post_init__ "
                 "('LoRA rank `r` must be a positive integer')", file=ADAPTER_CONFIG,
                 field=(missing or [bad[0][0]])[0], value=None if missing else bad[0][1])


def declared_rank(cfg: dict[str, Any], module: str) -> int | None:
    """The rank ``cfg`` declares for ``module`` (the tensor name's module, without ``base_model.model.``): the
    first ``rank_pattern`` key that is a dot-bounded suffix of it, else ``r``, as vLLM's
    ``PEFTHelper.get_rank_and_scaling`` (and PEFT's ``get_pattern_key``) read it; None when not an integer."""
    for key, value in (cfg.get("rank_pattern") or {}).items():
        try:
            if re.match(rf"(.*\.)?({key})$", module):
                return value if _positive_int(value) else None
        except re.error:
            return None
    r = cfg.get("r")
    return r if _positive_int(r) else None


def _tied_lm_head(base: Checkpoint) -> bool:
    """The base ties ``lm_head`` to ``embed_tokens`` (``tie_word_embeddings``, transformers' default True when the
    checkpoint holds no ``lm_head.weight``)."""
    tie = base.text_config.get("tie_word_embeddings", (base.config or {}).get("tie_word_embeddings"))
    return bool(tie) if tie is not None else not any(n.endswith("lm_head.weight") for n in base.tensors)


def _tensors(adapter: Adapter, base: Checkpoint) -> Iterator[Finding]:
    arch = next(iter((base.config or {}).get("architectures") or ()), None)
    supported = LORA_MODULES.get(arch or "")
    if supported is None:
        yield _f("adapter.architecture_unknown", Severity.WARNING,
                 f"the base architecture {arch} is not in modelyard's table of vLLM LoRA modules; the target "
                 "modules are not judged (shapes still are)", "Smoke the adapter (the load smoke applies it in vLLM).",
                 "modelyard.checks.adapter.LORA_MODULES (from vLLM 0.32's model classes)", file="config.json",
                 field="architectures", value=arch)
    weights = base.tensors
    base_dtype = next((t.dtype for t in weights.values()), None)
    layers = base.text_config.get("num_hidden_layers")
    seen_bad: set[str] = set()
    dtypes: set[str] = set()
    lora_tensors = 0
    for name, t in sorted(adapter.tensors.items()):
        m = _LORA_NAME.match(name)
        if not m:
            continue
        lora_tensors += 1
        dtypes.add(t.dtype)
        module = m.group("module").removeprefix(_PEFT_PREFIX)
        last = module.rsplit(".", 1)[-1]
        if last == "lm_head" and _tied_lm_head(base):
            if last not in seen_bad:
                seen_bad.add(last)
                yield _f("adapter.target_module_unsupported", Severity.ERROR,
                         f"the adapter adapts lm_head ({name}); the base ties lm_head to embed_tokens "
                         "(tie_word_embeddings), and vLLM does not apply LoRA to a tied lm_head",
                         "Retrain without lm_head in target_modules, or merge the adapter into the base (peft "
                         "merge_and_unload) and ingest the merged model.",
                         f"{_VLLM_SRC}: a tied lm_head is the embedding's weight, which gets no LoRA layer",
                         file=ADAPTER_WEIGHTS, field=name, value=last)
            continue
        if supported is not None and last not in supported:
            if last not in seen_bad:
                seen_bad.add(last)
                yield _f("adapter.target_module_unsupported", Severity.ERROR,
                         f"the adapter adapts {last} ({name}); vLLM applies LoRA to {arch} only on "
                         f"{', '.join(sorted(supported))}", "Retrain with target_modules among those, or merge "
                         "the adapter into the base (peft merge_and_unload) and ingest the merged model.",
                         f"{_VLLM_SRC}: 'expected target modules in ...'", file=ADAPTER_WEIGHTS, field=name,
                         value=last, limit=sorted(supported))
            continue
        yield from _shape(name, m.group("ab"), module, t, weights, layers)
        yield from _rank_dim(name, m.group("ab"), module, t, adapter.config)
    if not lora_tensors and not adapter.problem:
        yield _f("adapter.no_lora_tensors", Severity.ERROR,
                 f"{ADAPTER_WEIGHTS} holds no LoRA tensor (no *.lora_A / *.lora_B weight among its "
                 f"{len(adapter.tensors)} tensor(s)); there is nothing for vLLM to apply",
                 "Save the trained adapter with peft save_pretrained (it writes base_model.model.<module>.lora_A.weight "
                 "and .lora_B.weight).", f"{_VLLM_SRC}: the LoRA weights are read by their lora_A / lora_B names",
                 file=ADAPTER_WEIGHTS, value=len(adapter.tensors))
    if base_dtype and dtypes and dtypes != {base_dtype}:
        yield _f("adapter.dtype_cast", Severity.INFO,
                 f"adapter tensors are {', '.join(sorted(dtypes))}, the base is {base_dtype}: vLLM casts them to the "
                 "base's dtype", "Nothing to do; save the adapter in the base's dtype to ship fewer bytes.",
                 "vLLM 0.32 vllm/config/lora.py: lora_dtype 'auto' is the model dtype", file=ADAPTER_WEIGHTS,
                 value=sorted(dtypes), limit=base_dtype)


_LAYER = re.compile(r"\.layers\.(\d+)\.")


def _shape(name: str, ab: str, module: str, t: TensorInfo, weights: dict[str, TensorInfo],
           layers: Any) -> Iterator[Finding]:
    """The shape rule of one ``lora_A`` / ``lora_B`` tensor against the base module's ``weight``."""
    target = weights.get(f"{module}.weight")
    if target is None:
        li = _LAYER.search(f".{module}.")
        why = (f"layer {li.group(1)} is past the base's {layers} layers" if li and isinstance(layers, int)
               and int(li.group(1)) >= layers else "the base has no such module")
        yield _f("adapter.module_missing", Severity.ERROR, f"{name} adapts {module}, and {why}",
                 "Use the base the adapter was trained on (adapter_config.json base_model_name_or_path names it).",
                 "PEFT LoraLayer wraps a base module of the same name; vLLM then finds no layer to apply it to",
                 file=ADAPTER_WEIGHTS, field=name, value=module, limit=layers)
        return
    if len(t.shape) != 2 or len(target.shape) != 2:
        return
    out, inp = target.shape
    # lora_A: (r, in); lora_B: (out, r); the embedding's lora_embedding_A: (r, vocab), _B: (hidden, r)
    want, got = {"A": (1, inp), "B": (0, out), "embedding_A": (1, out), "embedding_B": (0, inp)}[ab], t.shape
    if got[want[0]] != want[1]:
        yield _f("adapter.shape_mismatch", Severity.ERROR,
                 f"{name} has shape {list(got)}; the base's {module}.weight is {list(target.shape)}, so the adapter "
                 f"was trained on another model (dimension {want[0]} is {got[want[0]]}, the base has {want[1]})",
                 "Use the base the adapter was trained on (same hidden_size and layer shapes).",
                 "PEFT LoraLayer: lora_A = Linear(in_features, r), lora_B = Linear(r, out_features)",
                 file=ADAPTER_WEIGHTS, field=name, value=list(got), limit=list(target.shape))


def _rank_dim(name: str, ab: str, module: str, t: TensorInfo, cfg: dict[str, Any]) -> Iterator[Finding]:
    """The rank dimension of one ``lora_A`` (dimension 0) / ``lora_B`` (dimension 1) tensor against the rank
    adapter_config.json declares for its module (:func:`declared_rank`): vLLM sizes its LoRA buffers from the
    declared ranks (``max_lora_rank``) and scales by ``lora_alpha / r``, so a tensor of another rank does not load
    (rank-512 tensors under ``r: 8``: "size 16 must match 512")."""
    want = declared_rank(cfg, module)
    if want is None or len(t.shape) != 2:
        return
    dim = {"A": 0, "B": 1, "embedding_A": 0, "embedding_B": 1}[ab]
    if t.shape[dim] != want:
        yield _f("adapter.rank_mismatch", Severity.ERROR,
                 f"{name} has rank {t.shape[dim]} (shape {list(t.shape)}), adapter_config.json declares rank {want} "
                 f"for {module}", "Save the adapter's config and tensors together (peft save_pretrained); r (or its "
                 "rank_pattern entry) must be the tensors' rank.",
                 "vLLM 0.32 vllm/lora: the LoRA buffers are max_lora_rank wide, planned from r; a bigger tensor "
                 "fails to load ('size 16 must match 512')", file=ADAPTER_WEIGHTS, field=name,
                 value=t.shape[dim], limit=want)
