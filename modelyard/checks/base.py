"""The Finding and Target types every check speaks.

A finding is what a user acts on: a stable dotted ``code``, a ``severity``, a one-line ``message``,
where it is (``file``, ``field``), the offending ``value``, the ``fix`` and the ``source`` of the
rule (the runtime behaviour or public issue it comes from).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from modelyard.checks.versions import parse_version
from modelyard.errors import InvalidTargetError

if TYPE_CHECKING:
    from modelyard.model.checkpoint import Checkpoint


class Severity(str, enum.Enum):
    """How a finding weighs. ``NOT_JUDGED``: a check this host could not decide (a kernel or an optional package
    the local CPU runtime lacks, a shape-only load): neither a pass nor a defect, reported in its own section and
    counted apart; ``Target.require_judged`` (``--require-judged``) makes it an error (:func:`require_judged`)."""

    ERROR = "error"
    WARNING = "warning"
    INFO = "info"
    NOT_JUDGED = "not_judged"


@dataclass(frozen=True)
class Finding:
    """One verdict: a stable dotted ``code`` (declared in ``checks/findings.yaml``), its ``severity``, the
    ``message``, where (``file``, ``field``), the measured or offending ``value``, the ``fix`` and the rule's
    ``source``. A finding judged by a number also carries the ``limit`` it was held to (same shape as
    ``value``: a number, or an object of named figures), so a report says the number and its limit."""

    code: str
    severity: Severity
    message: str
    file: str | None = None
    field: str | None = None
    value: Any = None
    fix: str | None = None
    source: str | None = None
    limit: Any = None

    def to_dict(self) -> dict[str, Any]:
        """The stored form; ``limit`` only where the finding has one."""
        d = asdict(self)
        d["severity"] = self.severity.value
        if d["limit"] is None:
            del d["limit"]
        return d


@dataclass(frozen=True)
class Target:
    """What the model is judged against (vLLM's own option names).

    ``max_model_len`` in tokens; ``tensor_parallel_size`` ranks; ``dtype`` as vLLM's ``--dtype``;
    ``serve`` is ``chat``, ``completion`` or None (unspecified); ``vllm_version`` the runtime that will serve it
    (None: unknown, version-gated rules warn); ``transformers_version`` the transformers beside it;
    ``gpu_cc`` the GPU's CUDA compute capability (``"8.0"``; below 8.0 there is no bfloat16).
    """

    tensor_parallel_size: int = 1
    max_model_len: int | None = None
    dtype: str | None = None
    serve: str | None = None
    vllm_version: str | None = None
    transformers_version: str | None = None
    gpu_cc: str | None = None
    #: a check the local runtime could not judge (:attr:`Severity.NOT_JUDGED`) is an error (``--require-judged``)
    require_judged: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def create(cls, *, tensor_parallel_size: int = 1, max_model_len: int | None = None, dtype: str | None = None,
               serve: str | None = None, vllm_version: str | None = None, transformers_version: str | None = None,
               gpu_cc: str | None = None, require_judged: bool = False) -> Target:
        """Validated constructor for user input; raises :class:`~modelyard.errors.InvalidTargetError`
        (exit 2) naming the option, the value and the accepted values."""

        if serve not in (None, "chat", "completion"):
            raise InvalidTargetError(f"--serve {serve!r} is not chat or completion",
                                     fix="Use --serve chat or --serve completion.")
        if dtype is not None and dtype not in VLLM_DTYPES:
            raise InvalidTargetError(f"--dtype {dtype!r} is not a vLLM dtype",
                                     fix=f"Use one of: {', '.join(VLLM_DTYPES)}.")
        for opt, v in (("--vllm-version", vllm_version), ("--transformers-version", transformers_version),
                       ("--gpu-cc", gpu_cc)):
            if v is not None:
                try:
                    parse_version(v)
                except ValueError as exc:
                    raise InvalidTargetError(f"{opt}: {exc}", fix=f"Pass {opt} as numbers, e.g. "
                                             + ("8.0" if opt == "--gpu-cc" else "0.6.3") + ".") from exc
        if tensor_parallel_size < 1 or (max_model_len is not None and max_model_len < 1):
            raise InvalidTargetError("--tensor-parallel-size and --max-model-len must be positive",
                                     fix="Pass a positive number of ranks and tokens.")
        return cls(tensor_parallel_size=tensor_parallel_size, max_model_len=max_model_len, dtype=dtype, serve=serve,
                   vllm_version=vllm_version, transformers_version=transformers_version, gpu_cc=gpu_cc,
                   require_judged=require_judged)


#: spellings of one torch dtype in config.json (``torch_dtype`` / ``dtype``) and their canonical name
DTYPE_ALIASES = {"half": "float16", "fp16": "float16", "bf16": "bfloat16", "float": "float32", "fp32": "float32",
                 "torch.float16": "float16", "torch.bfloat16": "bfloat16", "torch.float32": "float32"}

#: vLLM ``--dtype`` choices (vLLM ``ModelDType``).
VLLM_DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")


@dataclass(frozen=True)
class CheckContext:
    """Everything a check may look at besides the checkpoint."""

    target: Target = field(default_factory=Target)


CheckFn = Callable[["Checkpoint", CheckContext], Iterable[Finding]]


@dataclass(frozen=True)
class RegisteredCheck:
    concern: str
    name: str
    fn: CheckFn


#: every check, in registration order (``checks.suite`` imports the concern modules, which fills it)
REGISTERED: list[RegisteredCheck] = []


def check(concern: str) -> Callable[[CheckFn], CheckFn]:
    """Decorator registering ``fn`` under ``concern`` (files, safetensors, config, tokenizer, ...)."""

    def deco(fn: CheckFn) -> CheckFn:
        REGISTERED.append(RegisteredCheck(concern, fn.__name__, fn))
        return fn

    return deco


#: what :func:`require_judged` adds to the message of a not-judged finding it makes an error
REQUIRED_NOTE = " (--require-judged: a check this host could not judge is an error)"


def require_judged(findings: Sequence[Finding], target: Target) -> list[Finding]:
    """``findings`` with each :attr:`Severity.NOT_JUDGED` one made an error when ``target.require_judged`` (the
    message says why), else unchanged. For those who publish only what was judged: a CPU host without the kernel
    of an FP8 checkpoint then refuses it instead of passing it with "1 check not judged here"."""
    if not target.require_judged:
        return list(findings)
    return [replace(f, severity=Severity.ERROR, message=f.message + REQUIRED_NOTE)
            if f.severity == Severity.NOT_JUDGED else f for f in findings]
