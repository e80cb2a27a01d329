"""The target a model is judged against, as the user declares it (``ingest``, ``verify``, a watch YAML):
the field names are vLLM's option names, the flags its spelling (:mod:`modelyard.model.options`)."""

from __future__ import annotations

from typing import Annotated, Optional

from pydantic import BaseModel, ConfigDict, Field

from modelyard.checks.base import VLLM_DTYPES
from modelyard.model.modes import DEFAULT_SERVE, SERVE_MODES
from modelyard.model.options import Flag

#: ``--help`` text of ``--serve``: ``ingest`` and ``verify`` judge the same folder the same way by default
SERVE_HELP = (f"how it will be served: chat (needs a chat template) or completion (plain-text prompts); "
              f"default: {DEFAULT_SERVE}; use --serve completion for a base model")


class TargetFlags(BaseModel):
    """The serving target (:class:`~modelyard.checks.base.Target`): ``max_model_len`` in tokens,
    ``tensor_parallel_size`` in ranks, the serving mode, vLLM's ``--dtype``, and the releases and GPU
    that will serve it (None: unknown; version-gated rules then warn)."""

    model_config = ConfigDict(frozen=True)

    max_model_len: Annotated[Optional[int], Flag("--max-model-len")] = Field(
        None, gt=0, description="target context length (tokens)")
    tensor_parallel_size: Annotated[int, Flag("--tensor-parallel-size", "--tp")] = Field(
        1, gt=0, description="target TP size")
    serve: Annotated[str, Flag("--serve", choices=SERVE_MODES, show_default=False)] = Field(
        DEFAULT_SERVE, description=SERVE_HELP)
    dtype: Annotated[Optional[str], Flag("--dtype", choices=VLLM_DTYPES)] = Field(
        None, description="the vLLM --dtype it will be served with (judged by the checks)")
    vllm_version: Annotated[Optional[str], Flag("--vllm-version")] = Field(
        None, description="the vLLM that will serve it, e.g. 0.6.3")
    transformers_version: Annotated[Optional[str], Flag("--transformers-version")] = Field(
        None, description="the transformers beside it, e.g. 4.45.2")
    gpu_cc: Annotated[Optional[str], Flag("--gpu-cc")] = Field(
        None, description="the GPU's compute capability, e.g. 8.0")
    require_judged: Annotated[bool, Flag("--require-judged")] = Field(
        False, description="make every check this host's runtime could not judge an error (it is reported apart, "
                           "neither a pass nor a defect, by default)")
