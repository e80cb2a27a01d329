"""What a user asks of the quantize stage (``ingest --quantize ...``, ``quantize``, a watch YAML)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

from pydantic import BaseModel, ConfigDict, Field

from modelyard.model.options import Flag
from modelyard.stages.quantize import ALL_SCHEMES
from modelyard.stages.quantize.compat import RUNTIMES


class QuantizeFlags(BaseModel):
    """The scheme (None: no quantization), its recipe and calibration (``num_samples`` samples of at most
    ``max_seq_len`` tokens), the quality gate's override and the runtime whose support is judged."""

    model_config = ConfigDict(frozen=True)

    quantize: Annotated[Optional[str], Flag("--quantize", choices=ALL_SCHEMES)] = Field(
        None, description="quantize with this scheme (legacy formats: gptq with gptqmodel, awq-gemm with autoawq)")
    recipe: Annotated[Optional[str], Flag("--recipe", cli_type=Path)] = Field(
        None, description="recipe YAML (overrides the scheme's; see modelyard/recipes)")
    calibration: Annotated[Optional[str], Flag("--calibration", cli_type=Path)] = Field(
        None, description="local calibration text/JSONL file or datasets folder")
    num_samples: Annotated[int, Flag("--num-samples")] = Field(64, gt=0, description="calibration samples")
    max_seq_len: Annotated[int, Flag("--max-seq-len")] = Field(
        512, ge=8, description="calibration/evaluation window (tokens)")
    accept_quality_loss: Annotated[bool, Flag("--accept-quality-loss")] = Field(
        False, description="publish even if the quality gate fails")
    runtime: Annotated[Optional[str], Flag("--runtime", choices=RUNTIMES)] = Field(
        None, description="vLLM runtime to judge a quantized model's loadability for (default: the local one)")
