"""IngestOptions: what a caller can ask of one ingest run (CLI flags map 1:1)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from modelyard.model.modes import DEFAULT_SERVE, default_prompt


class IngestOptions(BaseModel):
    """``max_model_len`` in tokens; ``tensor_parallel_size`` in ranks (judged by the checks; the CPU
    smoke always loads with one rank); ``smoke_max_tokens`` in tokens."""

    model_config = {"frozen": True}

    name: str | None = None
    max_model_len: int | None = Field(default=None, gt=0)
    tensor_parallel_size: int = Field(default=1, gt=0)
    smoke: bool = True
    smoke_level: Literal["load", "server", "bench"] = "load"  # pipeline.serve_smoke.LEVELS
    golden: str | None = None  # YAML of golden prompts (server/bench); default modelyard/data/golden-demo.yaml
    gpu: str | None = None  # serve plan target (pipeline.gpus); None = H100-80GB on the fewest GPUs that fit
    gpus: int | None = Field(default=None, gt=0)
    publish: tuple[str, ...] = ()  # oci://host/repo[:tag] or s3://bucket/prefix, after the store
    serve: str = DEFAULT_SERVE  # modes.SERVE_MODES; the verify target and the smoke follow it
    dtype: str | None = None
    vllm_version: str | None = None
    question: str | None = None  # the smoke prompt; None = the serving mode's (modes.DEFAULT_PROMPTS)
    smoke_max_tokens: int = Field(default=64, gt=0)
    patch: bool = True
    add_special_tokens: tuple[str, ...] = ()
    chat_template: str | None = None  # path of a Jinja file to install as chat_template.jinja
    quantize: str | None = None  # a scheme of pipeline.quantize.SCHEMES
    recipe: str | None = None
    calibration: str | None = None
    num_samples: int = Field(default=64, gt=0)
    max_seq_len: int = Field(default=512, gt=0)
    accept_quality_loss: bool = False
    runtime: str | None = None  # a key of pipeline.compat.RUNTIME_SUPPORT; None = the local vLLM runtime
    allow_patterns: tuple[str, ...] | None = None
    ignore_patterns: tuple[str, ...] | None = None

    def smoke_prompt(self) -> str:
        """The smoke's question (chat) or plain-text prompt (completion): ``question``, else the
        default of the serving mode ``serve``."""
        return self.question or default_prompt(self.serve)
