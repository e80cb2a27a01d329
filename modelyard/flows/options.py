"""IngestOptions: what a caller can ask of one ingest run, composed of the options each stage declares
(CLI flags and watch YAML keys map 1:1 to its fields), and its per-stage groups
(:class:`FetchOptions`, :class:`PatchOptions`, :class:`QuantizeOptions`,
:class:`SmokeOptions`, :class:`ServeOptions`): each stage's task receives only its own group.

A group's fields carry the names of the declared options they hold and are read from them by one function
(:meth:`IngestOptions.group`), never copied by hand; only the values computed from several declarations are
named there (:data:`DERIVED`)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Optional, TypeVar

from pydantic import ConfigDict, Field

from modelyard.checks import Target
from modelyard.checks.adapter import MAX_LORA_RANKS
from modelyard.errors import InvalidTargetError
from modelyard.model.modes import DEFAULT_SERVE, default_prompt
from modelyard.stages.fetch.options import FetchFlags
from modelyard.stages.patch import PatchFlags
from modelyard.stages.quantize import scheme
from modelyard.stages.quantize.options import QuantizeFlags
from modelyard.stages.serve.gpus import gpu_spec
from modelyard.stages.serve.options import ServeFlags
from modelyard.stages.smoke.bench import parse_slo, slo_class
from modelyard.stages.smoke.options import SmokeFlags
from modelyard.stages.verify.options import TargetFlags


@dataclass(frozen=True)
class FetchOptions:
    """Hub allow/ignore patterns (None: the fetch stage's defaults)."""

    allow_patterns: tuple[str, ...] | None = None
    ignore_patterns: tuple[str, ...] | None = None


@dataclass(frozen=True)
class PatchOptions:
    """Whether to repair, which tokens to make special, a chat template file to install."""

    patch: bool = True
    add_special_tokens: tuple[str, ...] = ()
    chat_template: str | None = None


@dataclass(frozen=True)
class QuantizeOptions:
    """The scheme (None: no quantization), its recipe and calibration, the quality gate's override and
    the runtime whose support is judged. ``num_samples`` samples of at most ``max_seq_len`` tokens."""

    quantize: str | None = None  # the scheme's name (stages.quantize.SCHEMES), checked by IngestOptions.check
    recipe: str | None = None
    calibration: str | None = None
    num_samples: int = 64
    max_seq_len: int = 512
    accept_quality_loss: bool = False
    runtime: str | None = None


@dataclass(frozen=True)
class SmokeOptions:
    """The smoke: ``level`` (load, server, bench; None: no smoke), the serving mode ``serve``, the prompt, at
    most ``smoke_max_tokens`` tokens, golden prompts for server/bench, ``max_model_len`` in tokens."""

    level: str | None = "load"
    serve: str = DEFAULT_SERVE
    prompt: str = ""
    smoke_max_tokens: int = 64
    golden: str | None = None
    max_model_len: int | None = None
    slo: str | None = None  # bench targets, ``key=value,...`` (stages.smoke.bench.parse_slo)
    slo_class: str | None = None  # their default row; None: the runtime's device


@dataclass(frozen=True)
class ServeOptions:
    """The serve plan's target: GPU class and count (None: H100-80GB on the fewest that fit)."""

    gpu: str | None = None
    gpus: int | None = None
    max_model_len: int | None = None


class IngestOptions(TargetFlags, FetchFlags, PatchFlags, QuantizeFlags, SmokeFlags, ServeFlags):
    """What one ingest asks: the options each stage declares next to itself (their fields, flags, help and
    bounds: :class:`~modelyard.stages.verify.options.TargetFlags`, ``FetchFlags``, ``PatchFlags``,
    ``QuantizeFlags``, ``SmokeFlags``, ``ServeFlags``), plus the artifact's ``name``, where to ``publish``
    it after the store (``oci://host/repo[:tag]`` or ``s3://bucket/prefix``), the smoke's ``question``
    (None: the serving mode's, :data:`~modelyard.model.modes.DEFAULT_PROMPTS`) and ``smoke_max_tokens``
    (tokens). The CLI's flags and a watch YAML's keys are these field names."""

    model_config = ConfigDict(frozen=True)

    name: Optional[str] = None
    publish: tuple[str, ...] = ()
    question: Optional[str] = None
    smoke_max_tokens: int = Field(default=64, gt=0)
    #: a LoRA adapter's base artifact (NAME@REVISION or an artifact folder): the source is then a PEFT adapter
    #: folder, stored as a LoRA artifact (modelyard.flows.adapter)
    base: Optional[str] = None
    #: vLLM --max-lora-rank for the adapter (None: the smallest allowed value holding its rank, at least 16)
    max_lora_rank: Optional[int] = None

    def smoke_prompt(self) -> str:
        """The smoke's question (chat) or plain-text prompt (completion): ``question``, else the
        default of the serving mode ``serve``."""
        return self.question or default_prompt(self.serve)

    def check(self) -> None:
        """Refuse what no stage could do, before any work: the target's values, an unknown ``gpu``
        (:class:`~modelyard.errors.InvalidTargetError`) or quantization ``scheme``
        (:class:`~modelyard.errors.QuantizeError`), a bad ``slo``/``slo_class`` or one without the
        bench smoke (InvalidTargetError), a ``max_lora_rank`` vLLM does not allow or
        ``base`` with quantization (InvalidTargetError), all exit 2 naming the accepted values."""
        self.target()
        if self.gpu:
            gpu_spec(self.gpu)
        if self.quantize:
            scheme(self.quantize)
        if (self.slo or self.slo_class) and not (self.smoke and self.smoke_level == "bench"):
            raise InvalidTargetError("--slo and --slo-class judge the bench load", fix="Add --smoke bench.")
        parse_slo(self.slo)
        if self.slo_class:
            slo_class(self.slo_class)
        if self.max_lora_rank is not None and self.max_lora_rank not in MAX_LORA_RANKS:
            raise InvalidTargetError(f"--max-lora-rank {self.max_lora_rank} is not a value vLLM accepts",
                                     fix=f"Use one of {', '.join(map(str, MAX_LORA_RANKS))} (vLLM MaxLoRARanks).")
        if self.base and self.quantize:
            raise InvalidTargetError("--base ingests a LoRA adapter: it is not quantized",
                                     fix="Drop --quantize (quantize the base instead).")

    # --- per-stage groups ------------------------------------------------------------------------
    def target(self) -> Target:
        """What verify judges against (raises :class:`~modelyard.errors.InvalidTargetError` for a bad value)."""
        return Target.create(tensor_parallel_size=self.tensor_parallel_size, max_model_len=self.max_model_len,
                             serve=self.serve, dtype=self.dtype, vllm_version=self.vllm_version,
                             transformers_version=self.transformers_version, gpu_cc=self.gpu_cc,
                             require_judged=self.require_judged)

    def group(self, cls: type[G]) -> G:
        """The stage group ``cls``: each field read from the declared option of the same name, the fields of
        :data:`DERIVED` computed from several. A field that is neither raises AttributeError (a test holds every
        group to it)."""
        derived = DERIVED.get(cls, {})
        return cls(**{f.name: derived[f.name](self) if f.name in derived else getattr(self, f.name)
                      for f in fields(cls)})

    @property
    def fetching(self) -> FetchOptions:
        return self.group(FetchOptions)

    @property
    def patching(self) -> PatchOptions:
        return self.group(PatchOptions)

    @property
    def quantizing(self) -> QuantizeOptions:
        return self.group(QuantizeOptions)

    @property
    def smoking(self) -> SmokeOptions:
        return self.group(SmokeOptions)

    @property
    def serving(self) -> ServeOptions:
        return self.group(ServeOptions)


G = TypeVar("G", FetchOptions, PatchOptions, QuantizeOptions, SmokeOptions, ServeOptions)
#: group -> its fields computed from several declared options (every other field is the option of its name)
DERIVED: dict[type, dict[str, Any]] = {
    SmokeOptions: {"level": lambda o: o.smoke_level if o.smoke else None, "prompt": IngestOptions.smoke_prompt},
}
