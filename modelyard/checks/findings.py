"""The Finding and Target types every check speaks.

A finding is what a user acts on: a stable dotted ``code``, a ``severity``, a one-line ``message``,
where it is (``file``, ``field``), the offending ``value``, the ``fix`` and the ``source`` of the
rule (the runtime behaviour or public issue it comes from). Shape from ``../shared/DESIGN.md``.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Any


class Severity(str, enum.Enum):
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


@dataclass(frozen=True)
class Finding:
    code: str
    severity: Severity
    message: str
    file: str | None = None
    field: str | None = None
    value: Any = None
    fix: str | None = None
    source: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["severity"] = self.severity.value
        return d


@dataclass(frozen=True)
class Target:
    """What the model is judged against (vLLM's own option names).

    ``max_model_len`` in tokens; ``tensor_parallel_size`` ranks; ``dtype`` as vLLM's ``--dtype``;
    ``serve`` is ``chat``, ``completion`` or None (unspecified); ``vllm_version`` the runtime that will serve it.
    """

    tensor_parallel_size: int = 1
    max_model_len: int | None = None
    dtype: str | None = None
    serve: str | None = None
    vllm_version: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class CheckContext:
    """Everything a check may look at besides the checkpoint."""

    target: Target = field(default_factory=Target)
