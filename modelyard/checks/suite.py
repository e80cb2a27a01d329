"""The check suite: each check is a small function ``(checkpoint, context) -> Iterable[Finding]``.

Register with ``@check("concern")`` (in :mod:`modelyard.checks.base`); importing this module
imports every concern module, which registers their checks. :func:`run_checks` runs them in
:data:`CONCERN_ORDER` (files first, tokenizer last) and, within a concern, in definition order, and
turns a crash inside a check into an ``internal.check_crashed`` error finding instead of a
traceback: a checker bug must never pass a model silently.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

# Importing the concern modules registers their checks (files first, tokenizer last).
from modelyard.checks import (  # noqa: F401 - imported for their @check registrations
    architecture,
    config,
    files,
    hf,
    parallelism,
    principles,
    quantization,
    safetensors,
    template_baseline,
    template_risk,
    tokenizer,
)
from modelyard.checks.base import (
    REGISTERED,
    CheckContext,
    Finding,
    RegisteredCheck,
    Severity,
)

if TYPE_CHECKING:
    from modelyard.model.checkpoint import Checkpoint

#: the order concerns run in: cheap file-level checks first; each later concern may rely on earlier ones.
CONCERN_ORDER = ("files", "safetensors", "config", "architecture", "parallelism", "quantization", "tokenizer",
                 "security")


def registered() -> tuple[RegisteredCheck, ...]:
    """Every check, in :data:`CONCERN_ORDER`, and within a concern in definition order."""
    rank = {c: i for i, c in enumerate(CONCERN_ORDER)}
    return tuple(sorted(REGISTERED, key=lambda r: rank.get(r.concern, len(rank))))  # stable within a concern


def run_checks(ckpt: Checkpoint, ctx: CheckContext) -> list[Finding]:
    """Run every registered check on ``ckpt``; returns findings in :func:`registered` order. What the
    checks asked transformers is kept in the facts cache (:mod:`modelyard.checks.hf`) for the next run."""
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
    hf.save(ckpt)
    return out
