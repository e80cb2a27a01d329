"""serve: size a checkpoint for vLLM on a target (GPU model x count) and say what fits.

All sizes are bytes, all lengths tokens. The memory model, per tensor-parallel rank, follows vLLM's
own accounting (``Worker.determine_available_memory`` then ``KVCacheManager`` block allocation):

- **usable** = the GPU's driver-reported memory (:mod:`modelyard.stages.serve.gpus`) x
  ``--gpu-memory-utilization`` (vLLM default 0.9). vLLM caps its whole footprint at that fraction.
- **weights per rank** = weight bytes / tp (rounded up). vLLM shards every large matrix over the
  ranks, embeddings and ``lm_head`` included (``VocabParallelEmbedding`` / ``ParallelLMHead`` split
  the vocabulary); what stays replicated (norms, and the K/V projections when tp > KV heads) is
  small and falls inside the overhead allowance.
- **overhead** = :data:`OVERHEAD_BYTES` (3 GiB) per rank, a fixed allowance for what vLLM's profile
  run measures besides weights: ~1 GiB non-torch memory (CUDA context, NCCL and cuBLAS workspaces),
  ~1 GiB activation peak of a prefill of ``max_num_batched_tokens`` (8192) tokens plus the
  sampler's fp32 logits, ~1 GiB CUDA graphs (vLLM logs "Graph capturing finished ... took
  0.5-1.5 GiB" for Llama-class models). An estimate, not a measurement: for a tight plan, start
  vLLM and read its "Available KV cache memory" log line.
- **KV budget** = usable - weights per rank - overhead.
- **KV bytes per token per rank** = 2 (K and V) x layers x KV heads on the rank x head_dim x KV
  dtype bytes. vLLM gives each rank ``max(1, num_key_value_heads // tp)`` KV heads: when tp exceeds
  the KV heads they are replicated, not split further (``ModelConfig.get_num_kv_heads``).
  KV dtype: the model dtype (``--kv-cache-dtype auto``), or 1 byte for ``fp8``.
- **tokens that fit** = KV budget // KV bytes per token per rank (every rank holds the same tokens).

Pipeline parallelism (several nodes): tensor parallelism stays inside a node (its NVLink domain) and
the decoder layers are split into ``pipeline_parallel_size`` stages, one per node (vLLM's multi-node
recipe: TP = GPUs per node, PP = nodes). Stage ``i`` holds the layers vLLM's ``get_pp_indices``
gives it (an even split; a remainder goes one by one to the stages before the last), the embeddings on the
first stage and the final norm and ``lm_head`` on the last (with ``tie_word_embeddings`` the last
stage holds its own copy of the embedding matrix: vLLM builds ``embed_tokens`` on the last rank too).
Each stage is sized like a one-node plan with its own weights and only its layers' KV cache; vLLM
allocates the same number of KV blocks on every worker (the minimum over them), so **tokens that fit**
is the worst stage's. With several nodes available the plan takes the fewest nodes that hold the
context asked for (``max_model_len``, else the model's derived limit): a model that fits one node
stays on one node.

Suggestions: ``max_model_len`` = min(the length vLLM derives from config.json,
:func:`~modelyard.checks.config.derived_max_len`; tokens that fit, rounded down to a multiple of
1024). ``max_num_seqs`` = tokens that fit // min(max_model_len, 2048) (how many requests of a
typical 2048-token context fit at once), between 1 and vLLM's default 256.

A plan is refused (:class:`~modelyard.errors.ServePlanError`) when the weights and overhead do not
fit in usable memory, or the KV budget cannot hold one sequence of :data:`MIN_MODEL_LEN` tokens
(or of the ``max_model_len`` asked for): vLLM itself refuses to start with "To serve at least one
request with the models's max seq len ... KV cache is needed, which is larger than the available
KV cache memory".
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from modelyard.artifact.layout import model_root
from modelyard.artifact.manifest import Manifest
from modelyard.checks.parallelism import tp_problems, valid_tp_sizes
from modelyard.errors import InvalidTargetError, ServePlanError
from modelyard.model.checkpoint import Checkpoint
from modelyard.stages.serve.gpus import GIB, GPUS, GpuSpec, gpu_spec
from modelyard.stages.serve.sizing import (
    DTYPE_BYTES,
    ModelSize,
    kv_bytes_per_token,
    model_size,
)

#: per-rank allowance (bytes) for non-torch memory, activation peak and CUDA graphs (see module doc).
OVERHEAD_BYTES = 3 * GIB
#: vLLM ``--gpu-memory-utilization`` default.
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
#: the target ingest writes serve/ for when none is given (the most common serving GPU).
DEFAULT_GPU = "H100-80GB"
#: shortest context (tokens) a plan may offer; below it the plan is refused.
MIN_MODEL_LEN = 2048
#: the context (tokens) of a "typical" request, for max_num_seqs.
TYPICAL_REQUEST_TOKENS = 2048
#: vLLM's default ``--max-num-seqs`` for the OpenAI server; the plan never suggests more.
MAX_NUM_SEQS_CAP = 256
#: suggested max_model_len below the derived limit is rounded down to a multiple of this (tokens).
LEN_ROUND = 1024
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16", "float16")
#: GPUs of one node when the target does not say (an HGX/DGX board: 8 GPUs on one NVLink switch); the
#: node size suggestions assume for a one-node target.
NODE_GPUS = 8
#: the most nodes a refusal searches for the smallest plan that fits.
MAX_NODES = 64


@dataclass(frozen=True)
class ServeTarget:
    """Where the model will run: ``nodes`` hosts of ``gpus`` GPUs each (``gpus`` = GPUs per node).
    ``tensor_parallel_size`` None = the largest valid size <= ``gpus``; ``pipeline_parallel_size``
    None = one stage per node used, on the fewest of ``nodes`` that hold the context (1 for one node);
    ``max_model_len`` None = suggested by the plan."""

    gpu: str
    gpus: int = 1
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION
    kv_cache_dtype: str = "auto"
    tensor_parallel_size: int | None = None
    max_model_len: int | None = None
    nodes: int = 1
    pipeline_parallel_size: int | None = None


@dataclass(frozen=True)
class ServePlan:
    """A sized serving plan. Bytes are per rank unless named otherwise; lengths are tokens."""

    served_model_name: str
    gpu: str
    gpu_memory_bytes: int
    gpus: int
    gpu_memory_utilization: float
    tensor_parallel_size: int
    valid_tp_sizes: tuple[int, ...]
    dtype: str
    quantization: str | None
    kv_cache_dtype: str
    kv_dtype_bytes: int
    weight_bytes: int  # the whole model
    weight_source: str
    param_count: int | None
    weight_bytes_per_rank: int
    usable_bytes_per_rank: int
    overhead_bytes_per_rank: int
    kv_budget_bytes_per_rank: int
    kv_heads_per_rank: int
    kv_bytes_per_token: int  # the whole model, all KV heads
    kv_bytes_per_token_per_rank: int
    tokens_fit: int
    derived_max_len: int | None
    max_model_len: int
    max_num_seqs: int
    notes: tuple[str, ...] = field(default=())
    #: nodes the plan uses (``gpus`` is GPUs per node) and nodes the target offered
    nodes: int = 1
    nodes_available: int = 1
    pipeline_parallel_size: int = 1
    #: decoder layers per pipeline stage; the per-rank figures above are the worst stage's
    layers_per_stage: tuple[int, ...] = ()
    worst_stage: int = 0

    @property
    def multi_node(self) -> bool:
        """True when the plan spans nodes: vLLM runs it on a Ray cluster (serve/ray-*.sh)."""
        return self.nodes > 1

    @property
    def world_size(self) -> int:
        """GPUs the plan uses: tensor x pipeline parallel size."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def gpus_used_per_node(self) -> int:
        """GPUs of a node the plan's ranks occupy: tensor parallel size x the pipeline stages on that node
        (the busiest node); fewer than ``gpus`` when no valid tensor-parallel size uses them all."""
        return min(self.gpus, self.tensor_parallel_size * -(-self.pipeline_parallel_size // self.nodes))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["valid_tp_sizes"] = list(self.valid_tp_sizes)
        d["notes"] = list(self.notes)
        d["layers_per_stage"] = list(self.layers_per_stage)
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    def target_label(self) -> str:
        """``8 x H100-80GB`` on one node, ``2 x 8 x H100-80GB`` (nodes x GPUs per node) on several; ``3 of 4 x
        H100-80GB`` when the plan's ranks leave GPUs of a node idle (tensor parallel 3 on 4 GPUs)."""
        used = self.gpus_used_per_node
        per_node = f"{used} of {self.gpus}" if used < self.gpus else str(self.gpus)
        return f"{self.nodes} x {per_node} x {self.gpu}" if self.multi_node else f"{per_node} x {self.gpu}"

    def rows(self) -> list[tuple[str, str, str]]:
        """``(quantity, value, how)`` rows for the CLI table and serve/README.md."""
        pp = self.pipeline_parallel_size
        stages = []
        if pp > 1:
            stages = [("pipeline_parallel_size", str(pp),
                       f"{self.nodes} node(s); layers per stage {'/'.join(map(str, self.layers_per_stage))}"),
                      ("worst stage", str(self.worst_stage), "the stage with the fewest tokens of KV cache; "
                       "the per-rank figures below are its")]
        w_how = (f"weights / {self.tensor_parallel_size} (vocab-parallel embeddings and lm_head split too)" if pp == 1
                 else f"stage {self.worst_stage}'s weights ({self.layers_per_stage[self.worst_stage]} layers"
                 + (", embeddings" if self.worst_stage == 0 else "")
                 + (", norm and lm_head" if self.worst_stage == pp - 1 else "") + f") / {self.tensor_parallel_size}")
        return [
            ("target", self.target_label(),
             f"{_gib(self.gpu_memory_bytes)} each (driver-reported), utilization {self.gpu_memory_utilization:g}"),
            ("tensor_parallel_size", str(self.tensor_parallel_size),
             f"valid: {', '.join(map(str, self.valid_tp_sizes))}" + (" (inside each node)" if pp > 1 else "")),
            *stages,
            ("weights", _gib(self.weight_bytes), self.weight_source),
            ("weights per rank", _gib(self.weight_bytes_per_rank), w_how),
            ("usable per rank", _gib(self.usable_bytes_per_rank), f"{_gib(self.gpu_memory_bytes)} x {self.gpu_memory_utilization:g}"),
            ("overhead per rank", _gib(self.overhead_bytes_per_rank), "activations + CUDA graphs + non-torch (fixed allowance)"),
            ("KV budget per rank", _gib(self.kv_budget_bytes_per_rank), "usable - weights - overhead"),
            ("KV bytes per token", f"{self.kv_bytes_per_token:,}",
             f"2 x layers x kv_heads x head_dim x {self.kv_dtype_bytes} B (kv-cache-dtype {self.kv_cache_dtype}"
             + (f" = {self.dtype})" if self.kv_cache_dtype == "auto" else ")")),
            ("KV bytes per token per rank", f"{self.kv_bytes_per_token_per_rank:,}",
             f"{self.kv_heads_per_rank} KV head(s) per rank"
             + (f", {self.layers_per_stage[self.worst_stage]} layers in the stage" if pp > 1 else "")),
            ("tokens that fit", f"{self.tokens_fit:,}", "KV budget / KV bytes per token per rank"),
            ("max_model_len", f"{self.max_model_len:,}",
             f"min(derived {self.derived_max_len:,}, tokens that fit)" if self.derived_max_len else "tokens that fit"),
            ("max_num_seqs", str(self.max_num_seqs),
             f"tokens that fit / {min(self.max_model_len, TYPICAL_REQUEST_TOKENS)}, capped at {MAX_NUM_SEQS_CAP}"),
        ]


def _gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB"


@dataclass(frozen=True)
class _Fit:
    """The worst pipeline stage of a layout, per rank: weights, KV budget, KV bytes per token, tokens."""

    stage: int
    weight_bytes: int
    budget: int
    kv_per_token: int
    tokens: int


def _worst_stage(size: ModelSize, gpu: GpuSpec, util: float, tp: int, pp: int, kv_bytes: int,
                 weight_scale: float = 1.0) -> _Fit:
    """Each of the ``pp`` stages on ``tp`` ranks of ``gpu``; the one with the fewest tokens of KV cache
    (a budget of 0 or less counts as -1 tokens). ``weight_scale`` scales the weights (0.5 = an fp8 variant)."""
    usable = int(gpu.memory_bytes * util)
    fits = []
    for i, (n_layers, w) in enumerate(zip(size.stage_layers(pp), size.stage_weight_bytes(pp))):
        w_rank = -(-int(w * weight_scale) // tp)
        budget = usable - w_rank - OVERHEAD_BYTES
        kvt = kv_bytes_per_token(n_layers, size.kv_heads, size.head_dim, kv_bytes, tp)
        fits.append(_Fit(i, w_rank, budget, kvt, budget // kvt if budget > 0 else -1))
    return min(fits, key=lambda f: (f.tokens, f.budget))


def _fits(size: ModelSize, gpu: GpuSpec, util: float, tp: int, kv_bytes: int, weight_scale: float = 1.0,
          length: int = MIN_MODEL_LEN, pp: int = 1) -> bool:
    """True when ``pp`` stages of ``tp`` ranks of ``gpu`` hold the weights (x ``weight_scale``) and
    ``length`` tokens of KV."""
    return _worst_stage(size, gpu, util, tp, pp, kv_bytes, weight_scale).tokens >= length


def rank_need_bytes(size: ModelSize, tp: int, pp: int, kv_bytes: int, length: int) -> int:
    """GPU bytes one rank of the heaviest pipeline stage needs to serve one ``length``-token sequence:
    its weights / ``tp`` + :data:`OVERHEAD_BYTES` + ``length`` x its KV bytes per token (``kv_bytes``
    per element). Compare with a GPU's memory x ``--gpu-memory-utilization``."""
    need = 0
    for n_layers, w in zip(size.stage_layers(pp), size.stage_weight_bytes(pp)):
        need = max(need, -(-w // tp) + OVERHEAD_BYTES
                   + length * kv_bytes_per_token(n_layers, size.kv_heads, size.head_dim, kv_bytes, tp))
    return need


def _largest_tp(valid: list[int], gpus: int) -> int:
    return max([t for t in valid if t <= gpus] or [1])


def smallest_multinode(size: ModelSize, gpu: GpuSpec, util: float, kv_bytes: int, valid: list[int],  # noqa: PLR0913
                       gpus_per_node: int, length: int, *, min_nodes: int = 2,
                       weight_scale: float = 1.0) -> tuple[int, int, int] | None:
    """``(nodes, tp, pp)`` of the fewest nodes of ``gpus_per_node`` ``gpu`` (from ``min_nodes`` up to
    :data:`MAX_NODES`) that hold the weights and ``length`` tokens: tensor parallel = the largest valid
    size in a node, one pipeline stage per ``tp`` GPUs of each node; None when none does."""
    tp = _largest_tp(valid, gpus_per_node)
    per_node = max(1, gpus_per_node // tp)
    for n in range(max(1, min_nodes), MAX_NODES + 1):
        pp = n * per_node
        if pp > size.layers:
            return None
        if _fits(size, gpu, util, tp, kv_bytes, weight_scale, length, pp):
            return n, tp, pp
    return None


def _multinode_idea(found: tuple[int, int, int] | None, gpus_per_node: int, gpu: GpuSpec) -> str | None:
    if found is None:
        return None
    n, tp, pp = found
    return (f"use --gpus-per-node {gpus_per_node} --nodes {n} (tensor parallel {tp} inside each node x pipeline "
            f"parallel {pp} across nodes = {tp * pp} x {gpu.name}, served through Ray)")


def _fix(size: ModelSize, gpu: GpuSpec, target: ServeTarget, kv_bytes: int, valid: list[int],
         kv_short: bool = False, tp_now: int | None = None, pp_now: int = 1) -> str:
    """The cheapest ways out: more GPUs in the node (a valid TP size), more nodes (the smallest
    multi-node plan), an fp8 variant, a larger GPU, and (when only the KV cache is short) an fp8 KV cache."""
    util, n = target.gpu_memory_utilization, target.max_model_len or MIN_MODEL_LEN
    ideas = []
    node = target.gpus if target.nodes > 1 or target.gpus >= NODE_GPUS else NODE_GPUS
    more = None
    if target.nodes == 1:
        more = next((t for t in valid if target.gpus < t <= node and _fits(size, gpu, util, t, kv_bytes, length=n)),
                    None)
        if more:
            ideas.append(f"use --gpus {more}")
    if more is None:
        idea = _multinode_idea(smallest_multinode(size, gpu, util, kv_bytes, valid, node, n,
                                                  min_nodes=target.nodes + 1), node, gpu)
        if idea:
            ideas.append(idea)
    tp_now = tp_now or _largest_tp(valid, target.gpus)
    if size.quantization is None and DTYPE_BYTES.get(size.dtype, 2) >= 2:
        fp8 = next((t for t in valid if t <= node and _fits(size, gpu, util, t, kv_bytes, 0.5, n)), None)
        if fp8 and (more is None or fp8 < more):
            ideas.append(f"or an fp8 variant (modelyard ingest ... --quantize fp8-dynamic) on --gpus {fp8}, about "
                         f"{_gib(size.weight_bytes // 2 // fp8)} of weights per rank")
    bigger = next((g.name for g in sorted(GPUS.values(), key=lambda g: g.memory_bytes)
                   if g.memory_bytes > gpu.memory_bytes and _fits(size, g, util, tp_now, kv_bytes, length=n, pp=pp_now)),
                  None)
    if bigger:
        ideas.append(f"or --gpu {bigger}")
    if kv_short and target.kv_cache_dtype == "auto" and kv_bytes >= 2 \
            and _fits(size, gpu, util, tp_now, 1, length=n, pp=pp_now):
        ideas.append("or --kv-cache-dtype fp8 to halve the KV cache")
    if util < 0.9 and _fits(size, gpu, 0.9, tp_now, kv_bytes, length=n, pp=pp_now):
        ideas.insert(0, f"raise --gpu-memory-utilization from {util:g} to 0.9 (vLLM's default)")
    if not ideas:
        return "No table GPU count fits this model; quantize it (w4a16) first."
    text = "; ".join(ideas)
    return (text.removeprefix("or ") if text.startswith("or ") else text) + "."


def _check_target(target: ServeTarget) -> None:
    if target.gpus < 1:
        raise InvalidTargetError(f"--gpus {target.gpus} is not a GPU count", fix="Use --gpus 1 or more.")
    if target.nodes < 1:
        raise InvalidTargetError(f"--nodes {target.nodes} is not a node count", fix="Use --nodes 1 or more.")
    if not 0 < target.gpu_memory_utilization <= 1:
        raise InvalidTargetError(f"--gpu-memory-utilization {target.gpu_memory_utilization} is not in (0, 1]",
                                 fix="Use a fraction such as 0.9 (vLLM's default).")
    if target.kv_cache_dtype not in KV_CACHE_DTYPES:
        raise InvalidTargetError(f"--kv-cache-dtype {target.kv_cache_dtype!r} is not supported by the plan",
                                 fix=f"Use one of: {', '.join(KV_CACHE_DTYPES)}.")


def _pick_pp(size: ModelSize, gpu: GpuSpec, target: ServeTarget, tp: int, kv_bytes: int) -> int:
    """The pipeline parallel size: as asked (checked against the layers and the GPUs), 1 on one node,
    else one stage per ``tp`` GPUs of each node on the fewest nodes that hold the context wanted
    (``max_model_len``, else the derived limit, else :data:`MIN_MODEL_LEN`); all nodes when none does."""
    per_node = max(1, target.gpus // tp)
    pp = target.pipeline_parallel_size
    if pp is not None:
        if pp < 1 or pp > size.layers:
            raise InvalidTargetError(f"--pipeline-parallel-size {pp}: the model has {size.layers} decoder layers, "
                                     "and every stage needs at least one", fix=f"Use 1 to {size.layers}.")
        have = per_node * target.nodes
        if pp > have:
            raise InvalidTargetError(f"--pipeline-parallel-size {pp} x --tensor-parallel-size {tp} needs {pp * tp} GPUs "
                                     f"({-(-pp // per_node)} node(s) of {target.gpus}); the target has {target.nodes}",
                                     fix=f"Use --nodes {-(-pp // per_node)} or --pipeline-parallel-size {have} or less.")
        return pp
    if target.nodes == 1:
        return 1
    want = target.max_model_len or size.derived_max_len or MIN_MODEL_LEN
    max_n = max(1, min(target.nodes, size.layers // per_node))

    def pp_for(n: int) -> int:
        return n * per_node if n > 1 else 1

    for n in range(1, max_n + 1):
        if _fits(size, gpu, target.gpu_memory_utilization, tp, kv_bytes, length=want, pp=pp_for(n)):
            return pp_for(n)
    return pp_for(max_n)


def plan_serve(model: Path | Checkpoint, target: ServeTarget, *, name: str | None = None) -> ServePlan:
    """Size ``model`` (a model folder, an artifact folder with ``model/``, or a Checkpoint) for
    ``target`` (``target.nodes`` nodes of ``target.gpus`` GPUs). Raises :class:`InvalidTargetError`
    for a bad target (unknown GPU, invalid TP size, a pipeline size the layers or GPUs cannot take, a
    ``max_model_len`` above the model's limit) and :class:`ServePlanError` when it does not fit; its
    ``fix`` names the smallest plan that does (more GPUs, more nodes, fp8, a larger GPU)."""

    if not isinstance(model, Checkpoint):
        root = Path(model)
        name = name or _artifact_name(root)
        model = Checkpoint(model_root(root))
    name = name or model.root.resolve().name
    gpu = gpu_spec(target.gpu)
    _check_target(target)
    size = model_size(model)
    cfg = model.text_config
    valid = valid_tp_sizes(cfg)
    if target.tensor_parallel_size is not None:
        tp = target.tensor_parallel_size
        probs = tp_problems(cfg, tp)
        if probs or tp > target.gpus:
            why = probs[0][2] if probs else f"it needs {tp} GPUs and the target has {target.gpus}" + (
                " per node (tensor parallelism stays inside a node)" if target.nodes > 1 else "")
            raise InvalidTargetError(f"--tensor-parallel-size {tp}: {why}",
                                     fix=f"Use one of {', '.join(str(t) for t in valid if t <= target.gpus) or '1'}.")
    else:
        tp = _largest_tp(valid, target.gpus)
    kv_bytes = (DTYPE_BYTES.get(size.dtype, 2) if target.kv_cache_dtype == "auto"
                else DTYPE_BYTES[target.kv_cache_dtype])
    pp = _pick_pp(size, gpu, target, tp, kv_bytes)
    per_node = max(1, target.gpus // tp)
    nodes = -(-pp // per_node)
    notes = []
    idle = target.gpus - tp * min(pp, per_node)
    if idle > 0:
        notes.append(f"{target.gpus} GPUs{' per node' if nodes > 1 else ''} but tensor_parallel_size {tp} "
                     f"(valid: {', '.join(map(str, valid))}); the other {idle} stay idle unless you add "
                     "pipeline parallelism")
    if target.nodes > nodes:
        notes.append(f"{target.nodes} nodes offered, {nodes} used: "
                     + ("the model and its context fit one node" if nodes == 1 else
                        f"{nodes} nodes hold the model and its context")
                     + f"; run the other {target.nodes - nodes} node(s) as replicas behind a load balancer")
    usable = int(gpu.memory_bytes * target.gpu_memory_utilization)
    worst = _worst_stage(size, gpu, target.gpu_memory_utilization, tp, pp, kv_bytes)
    w_rank, budget, kv_rank = worst.weight_bytes, worst.budget, worst.kv_per_token
    kv_tok = kv_bytes_per_token(size.layers, size.kv_heads, size.head_dim, kv_bytes)
    where = (f"{nodes} x {target.gpus} x {gpu.name} (tensor parallel {tp} x pipeline parallel {pp}"
             if nodes > 1 or pp > 1 else f"{target.gpus} x {gpu.name} (tensor parallel {tp}")
    where += f", utilization {target.gpu_memory_utilization:g})"
    stage = f" in pipeline stage {worst.stage}" if pp > 1 else ""
    if budget <= 0:
        raise ServePlanError(
            f"{name} does not fit on {where}: it needs {_gib(w_rank)} of weights + {_gib(OVERHEAD_BYTES)} overhead per "
            f"rank{stage}, and only {_gib(usable)} is usable per GPU",
            fix=_fix(size, gpu, target, kv_bytes, valid, tp_now=tp, pp_now=pp))
    tokens = worst.tokens
    need_len = target.max_model_len or MIN_MODEL_LEN
    if tokens < need_len:
        raise ServePlanError(
            f"{name} on {where}: the KV cache holds {tokens:,} tokens{stage} ({_gib(budget)} per rank after "
            f"{_gib(w_rank)} of weights and {_gib(OVERHEAD_BYTES)} overhead), fewer than one {need_len:,}-token "
            f"sequence ({_gib(need_len * kv_rank)} per rank)",
            fix=_fix(size, gpu, target, kv_bytes, valid, kv_short=True, tp_now=tp, pp_now=pp))
    limit = size.derived_max_len
    if target.max_model_len is not None:
        if limit is not None and target.max_model_len > limit:
            raise InvalidTargetError(f"--max-model-len {target.max_model_len} exceeds the {limit} tokens vLLM derives "
                                     f"from config.json ({size.derived_max_len_source})",
                                     fix=f"Use --max-model-len {limit} or less.")
        max_len = target.max_model_len
    elif limit is not None and limit <= tokens:
        max_len = limit
    else:
        max_len = max(MIN_MODEL_LEN, tokens // LEN_ROUND * LEN_ROUND)
        if limit is not None:
            notes.append(f"max_model_len {max_len:,} < the model's {limit:,}: the KV cache holds {tokens:,} tokens; "
                         "more GPUs or --kv-cache-dtype fp8 allow longer contexts")
    if limit is None:
        notes.append("config.json has no context length key; max_model_len comes from memory alone")
    seqs = max(1, min(MAX_NUM_SEQS_CAP, tokens // min(max_len, TYPICAL_REQUEST_TOKENS)))
    return ServePlan(
        served_model_name=name, gpu=gpu.name, gpu_memory_bytes=gpu.memory_bytes, gpus=target.gpus,
        gpu_memory_utilization=target.gpu_memory_utilization, tensor_parallel_size=tp, valid_tp_sizes=tuple(valid),
        dtype=size.dtype, quantization=size.quantization, kv_cache_dtype=target.kv_cache_dtype, kv_dtype_bytes=kv_bytes,
        weight_bytes=size.weight_bytes, weight_source=size.weight_source, param_count=size.param_count,
        weight_bytes_per_rank=w_rank, usable_bytes_per_rank=usable, overhead_bytes_per_rank=OVERHEAD_BYTES,
        kv_budget_bytes_per_rank=budget, kv_heads_per_rank=max(1, size.kv_heads // tp), kv_bytes_per_token=kv_tok,
        kv_bytes_per_token_per_rank=kv_rank, tokens_fit=tokens, derived_max_len=limit, max_model_len=max_len,
        max_num_seqs=seqs, notes=tuple(notes), nodes=nodes, nodes_available=target.nodes, pipeline_parallel_size=pp,
        layers_per_stage=size.stage_layers(pp), worst_stage=worst.stage)


def _artifact_name(root: Path) -> str | None:
    """The artifact's name from ``manifest.json`` (None for a plain model folder)."""
    try:
        return Manifest.load(root).name or None
    except (OSError, ValueError):
        return None
