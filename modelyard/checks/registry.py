"""The check registry: each check is a small function ``(checkpoint, context) -> Iterable[Finding]``.

Register with ``@check("concern")``; :func:`run_checks` runs all of them (or one concern), in
:data:`CONCERN_ORDER` (files first, tokenizer last) and, within a concern, in definition order,
whichever module happened to be imported first, and turns a crash inside a check into an ``internal.check_crashed`` error
finding instead of a traceback: a checker bug must never pass a model silently.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from modelyard.checks.findings import CheckContext, Finding, Severity

if TYPE_CHECKING:
    from modelyard.checkpoint import Checkpoint

CheckFn = Callable[["Checkpoint", CheckContext], Iterable[Finding]]


@dataclass(frozen=True)
class RegisteredCheck:
    concern: str
    name: str
    fn: CheckFn


_REGISTRY: list[RegisteredCheck] = []


def check(concern: str) -> Callable[[CheckFn], CheckFn]:
    """Decorator registering ``fn`` under ``concern`` (files, safetensors, config, tokenizer, ...)."""

    def deco(fn: CheckFn) -> CheckFn:
        _REGISTRY.append(RegisteredCheck(concern, fn.__name__, fn))
        return fn

    return deco


#: the order concerns run in: cheap file-level checks first; each later concern may rely on earlier ones.
CONCERN_ORDER = ("files", "safetensors", "config", "architecture", "parallelism", "quantization", "tokenizer")


def registered() -> tuple[RegisteredCheck, ...]:
    _load_all()
    rank = {c: i for i, c in enumerate(CONCERN_ORDER)}
    return tuple(sorted(_REGISTRY, key=lambda r: rank.get(r.concern, len(rank))))  # stable within a concern


def _load_all() -> None:
    # Importing the modules registers their checks, in this order (files first, tokenizer last).
    import modelyard.checks.files
    import modelyard.checks.safetensors
    import modelyard.checks.config
    import modelyard.checks.architecture
    import modelyard.checks.parallelism
    import modelyard.checks.quantization
    import modelyard.checks.tokenizer  # noqa: F401


def run_checks(ckpt: Checkpoint, ctx: CheckContext) -> list[Finding]:
    """Run every registered check on ``ckpt``; returns findings in :func:`registered` order."""
    out: list[Finding] = []
    for rc in registered():
        try:
            out.extend(rc.fn(ckpt, ctx))
        except Exception as exc:  # a checker bug must surface as an error, not pass the model
            out.append(
                Finding(
                    code="internal.check_crashed",
                    severity=Severity.ERROR,
                    message=f"check {rc.concern}.{rc.name} crashed: {type(exc).__name__}: {exc}",
                    fix="Report this to the modelyard maintainers with the model's config.json.",
                    source="modelyard",
                )
            )
    return out
