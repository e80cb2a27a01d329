"""The typed records an artifact stores: one pydantic model per stage result, used to read
``manifest.json`` and ``report.json`` back (``model_validate``) and to generate their JSON Schemas.

Every record keeps what it was given: keys a newer writer adds are kept (``extra="allow"``), the keys
come back in the order they were read, and a key the document did not have is not written back (a
stored manifest survives a read-modify-write, a promotion, byte for byte apart from the change). A key
of the wrong type is refused when read, with the file and the field named (:func:`validate`).

Numbers that a writer may store as an int or a float are typed ``int | float`` so that ``3`` stays
``3`` and ``3.0`` stays ``3.0`` on a round trip."""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SerializerFunctionWrapHandler,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    model_serializer,
    model_validator,
)

from modelyard.errors import ManifestError

Number = int | float
R = TypeVar("R", bound="Record")
#: validation context key: the data is a stored document, keep its keys and their order
STORED = "stored"


class Record(BaseModel):
    """Base of every stored record: unknown keys kept; read through :func:`validate`, its keys' order
    and absent keys are kept on a round trip (built in memory, it writes every field in declaration order)."""

    model_config = ConfigDict(extra="allow", frozen=True, populate_by_name=True)
    _keys: tuple[str, ...] | None = PrivateAttr(default=None)

    @model_validator(mode="wrap")
    @classmethod
    def _remember_keys(cls, data: Any, handler: ValidatorFunctionWrapHandler, info: ValidationInfo) -> Any:
        record = handler(data)
        stored = isinstance(info.context, dict) and info.context.get(STORED)
        if stored and isinstance(data, dict) and isinstance(record, Record) and record._keys is None:
            private = record.__pydantic_private__
            assert private is not None  # a model with a PrivateAttr always has its private dict
            private["_keys"] = tuple(data)  # frozen model: private state set once, here
        return record

    @model_serializer(mode="wrap")
    def _in_read_order(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        if self._keys is None:
            return out
        return {k: out[k] for k in self._keys if k in out}

    @property
    def present(self) -> frozenset[str]:
        """The keys the stored document had (all declared fields for a record built in memory)."""
        if self._keys is None:
            return frozenset(f.alias or n for n, f in type(self).model_fields.items())
        return frozenset(self._keys)

    def to_dict(self) -> dict[str, Any]:
        """The stored (JSON) form: aliases as keys, lists for tuples."""
        return self.model_dump(mode="json", by_alias=True)


def validate(model: type[R], data: Any, where: str, fix: str) -> R:
    """``model.model_validate(data)`` (``model_validate_json`` for ``bytes``/``str``); raises
    :class:`~modelyard.errors.ManifestError` (a ``ValueError``, exit 2) naming ``where`` and the first wrong
    field (``files.3.size: Input should be a valid integer``; ``(the document): Invalid JSON`` for bytes
    that are not JSON)."""
    try:
        if isinstance(data, (bytes, str)):
            return model.model_validate_json(data, context={STORED: True})
        return model.model_validate(data, context={STORED: True})
    except ValidationError as exc:
        err = exc.errors()[0]
        at = ".".join(str(p) for p in err.get("loc", ())) or "(the document)"
        raise ManifestError(f"{where}: {at}: {err.get('msg')}", fix=fix) from exc


# --- what was judged ---------------------------------------------------------------------------
class TargetRecord(Record):
    """What the findings were judged against (:class:`~modelyard.checks.base.Target`), vLLM's option names."""

    tensor_parallel_size: int = Field(1, ge=1)
    max_model_len: int | None = Field(None, ge=1, description="tokens")
    dtype: Literal["auto", "half", "float16", "bfloat16", "float", "float32"] | None = None
    serve: Literal["chat", "completion"] | None = None
    vllm_version: str | None = None
    transformers_version: str | None = None
    gpu_cc: str | None = Field(None, description='CUDA compute capability, e.g. "8.0"')
    require_judged: bool = Field(False, description="a check this host could not judge is an error")


class FindingRecord(Record):
    """One finding (:class:`~modelyard.checks.base.Finding` as ``to_dict`` writes it)."""

    code: str = Field(pattern=r"^[a-z0-9_]+(\.[a-z0-9_]+)+$",
                      description="stable dotted code, e.g. tokenizer.stop_tokens.missing_turn_terminator")
    severity: Literal["error", "warning", "info", "not_judged"]
    message: str = Field(min_length=1)
    file: str | None = Field(None, description="path relative to the model folder")
    field: str | None = Field(None, description="dotted field in file (JSON key path) or tensor name")
    value: Any = Field(None, description="the offending or measured value, any JSON")
    fix: str | None = None
    source: str | None = Field(None, description="the runtime behaviour or public issue the rule comes from")
    limit: Any = Field(None, description="for a finding judged by a number: the limit the value was held to")


class SummaryRecord(Record):
    """The counts by severity and the verdict (``passed``: no error)."""

    errors: int = Field(ge=0)
    warnings: int = Field(ge=0)
    infos: int = Field(ge=0)
    not_judged: int = Field(0, ge=0, description="checks this host could not judge (neither passed nor failed)")
    passed: bool = Field(description="true when errors is 0")


class VerificationRecord(Record):
    """The manifest's summary of ``report.json`` and that file's sha256 (hex)."""

    passed: bool = False
    errors: int = Field(0, ge=0)
    warnings: int = Field(0, ge=0)
    report_sha256: str | None = None


# --- where it came from --------------------------------------------------------------------------
class SourceRecord(Record):
    """Where the checkpoint came from: ``uri`` as given, ``kind`` (hf, local, tar, gguf), the hub's
    ``repo_id``/``revision``/``commit`` when it has them; provenance keys of the fetcher follow
    (``endpoint``, ``offline``, ``gguf_sha256``, ``bundle_of``, ...)."""

    uri: str | None = None
    kind: str | None = None
    repo_id: str | None = None
    revision: str | None = None
    commit: str | None = None


class FileRecord(Record):
    """One ``files[]`` entry: ``path`` (``model/...``), ``size`` in bytes, ``sha256`` (hex), ``origin`` of the
    trusted digest (``hub-lfs``, ``hub-git``, ``computed``, ``patched``, ``quantized``, ...); a patched or
    created file also has ``original_sha256`` (null for a created one)."""

    path: str
    size: int = Field(ge=0, strict=True)
    sha256: str
    origin: str | None = None
    original_sha256: str | None = None

    @property
    def patched(self) -> bool:
        return "original_sha256" in self.present


class PatchOpRecord(Record):
    """One repair: a JSON pointer in a file, its old and new value, the finding code and why."""

    file: str
    pointer: str
    old: Any = None
    new: Any = None
    code: str | None = None
    reason: str | None = None


class ReplacedFileRecord(Record):
    """A file of ``model/`` that modelyard wrote instead of the source's (a GGUF import's ``tokenizer.json`` rebuilt
    from the GGUF's own arrays): the file, what wrote it, why (the findings) and the evidence it is right."""

    file: str
    by: str | None = None
    why: str | None = None
    evidence: str | None = None


class PatchesRecord(Record):
    """The patch plan the artifact's ``model/`` was made with (``patches.json``) and its sha256; ``replaced``: the
    files written instead of the source's (:class:`ReplacedFileRecord`), whole files no op of the plan describes."""

    count: int = Field(0, ge=0)
    sha256: str | None = None
    ops: tuple[PatchOpRecord, ...] = ()
    replaced: tuple[ReplacedFileRecord, ...] = ()


# --- quantization --------------------------------------------------------------------------------
class RecipeRecord(Record):
    """The effective llm-compressor recipe: its sha256, where it came from, what was adjusted to fit."""

    sha256: str | None = None
    source: str | None = None
    adjustments: tuple[str, ...] = ()


class QualityRecord(Record):
    """The quantize stage's quality gate: perplexity of parent and quantized model on held-out text and
    mean per-token KL(parent || quantized) in nats over ``tokens`` tokens, the limits and the verdict."""

    ppl_parent: Number | None = None
    ppl_quantized: Number | None = None
    ppl_ratio: Number | None = None
    kl_mean: Number | None = None
    tokens: int | None = None
    max_ppl_ratio: Number | None = None
    max_kl: Number | None = None
    passed: bool = False
    text_sha256: str | None = None


class QuantizationRecord(Record):
    """What the quantize stage did (``quantization.json`` without the recipe's text): scheme, backend,
    recipe, calibration data, quality gate, preflight estimates (bytes), seconds, tool versions."""

    scheme: str
    backend: str | None = None
    loaded_with: str | None = None
    recipe: RecipeRecord = RecipeRecord()
    calibration: dict[str, Any] = {}
    quality: QualityRecord | None = None
    preflight: dict[str, Any] = {}
    seconds: Number | None = None
    tools: dict[str, str | None] = {}


# --- the vLLM smoke ------------------------------------------------------------------------------
class SmokeRecord(Record):
    """What the vLLM smoke saw, at ``level`` load (the key is absent there), server or bench: the answer
    and how it stopped, timings (seconds), token counts, the numerical gate (``numeric``) and its
    findings; server/bench add ``checks``, ``golden``, ``bench``, ``config``."""

    passed: bool = False
    level: Literal["load", "server", "bench"] | None = None
    vllm_version: str | None = None
    mode: Literal["chat", "completion"] | None = None
    question: str | None = None
    text: str | None = None
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    load_seconds: Number | None = None
    startup_seconds: Number | None = None
    tokens_per_second: Number | None = None
    max_model_len: int | None = None
    wall_seconds: Number | None = None
    error: str | None = None
    numeric: dict[str, Any] | None = None
    findings: tuple[FindingRecord, ...] = ()

    @property
    def level_name(self) -> str:
        """``load`` when the record has no level (a load smoke writes none)."""
        return self.level or "load"

    @property
    def numeric_passed(self) -> bool:
        return bool((self.numeric or {}).get("passed"))


# --- serving and promotion -----------------------------------------------------------------------
class BaseRecord(Record):
    """The base artifact a LoRA artifact applies to: its ``name``, ``revision`` and ``content_digest``
    (``sha256:<hex>`` over its ``model/``), the identity the adapter was verified and smoked against."""

    name: str
    revision: str
    digest: str = Field(description="the base artifact's content_digest, sha256:<hex>")


class ClaimsRecord(Record):
    """What ``manifest.json`` says of the artifact itself, copied into the signed ``report.json`` (its ``artifact``
    key) so that an edit of the unsigned manifest is caught (:func:`modelyard.transport.signing.manifest_agrees`):
    ``name``, ``revision``, ``kind``, ``content_digest``, a LoRA artifact's ``base`` and the ``tools`` versions."""

    name: str
    revision: str
    kind: Literal["model", "lora"] = "model"
    content_digest: str = ""
    base: BaseRecord | None = None
    tools: dict[str, str | None] = {}


class ServePlanRecord(Record):
    """The serve plan ``serve/`` was written for (:class:`~modelyard.stages.serve.plan.ServePlan`): bytes
    per rank unless named otherwise, lengths in tokens."""

    served_model_name: str | None = None
    gpu: str | None = None
    gpus: int | None = None
    tensor_parallel_size: int | None = None
    pipeline_parallel_size: int | None = None
    nodes: int | None = None
    dtype: str | None = None
    quantization: str | None = None
    kv_cache_dtype: str | None = None
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    gpu_memory_utilization: Number | None = None


class PromotionRecord(Record):
    """Who approved a promotion, when (UTC ISO-8601), from which store to which, and the evidence they saw."""

    approved_by: str | None = None
    approved_at: str | None = None
    note: str | None = None
    from_: str | None = Field(None, alias="from")
    to: tuple[str, ...] = ()
    flow_run_id: str | None = None
    evidence: dict[str, Any] = {}
