"""Serve planning: the plan (:mod:`.plan`), the files that carry it (:mod:`.files`), GPU specs (:mod:`.gpus`)."""

from __future__ import annotations

from modelyard.stages.serve.files import ServeFiles, write_serve_files
from modelyard.stages.serve.gpus import GIB, GPUS, GpuSpec, gpu_spec
from modelyard.stages.serve.plan import (
    DEFAULT_GPU,
    DEFAULT_GPU_MEMORY_UTILIZATION,
    KV_CACHE_DTYPES,
    LEN_ROUND,
    MAX_NUM_SEQS_CAP,
    MIN_MODEL_LEN,
    OVERHEAD_BYTES,
    TYPICAL_REQUEST_TOKENS,
    ServePlan,
    ServeTarget,
    plan_serve,
)
from modelyard.stages.serve.sizing import DTYPE_BYTES, ModelSize, kv_bytes_per_token, llama_param_count, model_size

__all__ = [
    "DEFAULT_GPU",
    "DEFAULT_GPU_MEMORY_UTILIZATION",
    "DTYPE_BYTES",
    "GIB",
    "gpu_spec",
    "GPUS",
    "GpuSpec",
    "kv_bytes_per_token",
    "KV_CACHE_DTYPES",
    "LEN_ROUND",
    "llama_param_count",
    "MAX_NUM_SEQS_CAP",
    "MIN_MODEL_LEN",
    "model_size",
    "ModelSize",
    "OVERHEAD_BYTES",
    "plan_serve",
    "ServeFiles",
    "ServePlan",
    "ServeTarget",
    "TYPICAL_REQUEST_TOKENS",
    "write_serve_files",
]
