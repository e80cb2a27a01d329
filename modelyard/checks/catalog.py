"""The finding catalogue: every code a check, the runtime oracle or a gate emits, declared once (in
``findings.yaml`` beside this module) with its severity, a summary (the message with its measured parts as
…), the fix and the rule's source.

``tests/unit/test_findings_catalogue.py`` asserts that every code the package emits is declared here and
every code declared here is emitted, and that ``docs/reference/findings.md`` is :func:`markdown`'s output
(``MODELYARD_UPDATE_GOLDEN=1`` rewrites it). A code's message, fix and source at its call site carry the
measured values; this catalogue is what a reader looks a code up in."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml


@dataclass(frozen=True)
class Rule:
    """One finding code: ``severity`` as emitted (or how it depends on the target), ``summary`` the message
    with measured parts written as …, ``fix`` (None where the call site builds it from the values),
    ``source`` the behaviour or report the rule comes from (None where the message names it)."""

    code: str
    severity: str
    summary: str
    fix: str | None = None
    source: str | None = None


#: where the rules are declared (YAML: a list of {code, severity, summary, fix, source})
CATALOGUE = Path(__file__).with_name("findings.yaml")


def _load() -> tuple[Rule, ...]:
    with open(CATALOGUE, encoding="utf-8") as fh:
        return tuple(sorted((Rule(**d) for d in yaml.safe_load(fh)), key=lambda r: r.code))


RULES: tuple[Rule, ...] = _load()

#: code -> rule
BY_CODE: dict[str, Rule] = {r.code: r for r in RULES}
#: code families whose last part is another code (``runtime.disagrees.<code>``)
FAMILIES = tuple(r.code.removesuffix("<code>") for r in RULES if r.code.endswith("<code>"))


def declared(code: str) -> bool:
    """True when ``code`` is in the catalogue, itself or as a member of a family."""
    return rule_of(code) is not None


def rule_of(code: str) -> Rule | None:
    """The rule of ``code``: its own entry, or for a family member (``runtime.disagrees.<code>``) the
    family's entry; None when the catalogue does not declare it."""
    if code in BY_CODE:
        return BY_CODE[code]
    fam = next((f for f in FAMILIES if code.startswith(f) and code[len(f):] in BY_CODE), None)
    return BY_CODE[fam + "<code>"] if fam else None


def _cell(text: str | None) -> str:
    return (text or "").replace("|", "\\|").replace("\n", " ")


def markdown() -> str:
    """``docs/reference/findings.md``: one table per concern (the code's first part), codes sorted."""
    lines = ["# Findings", "",
             "Every finding code modelyard emits, generated from `modelyard/checks/findings.yaml` (do not edit by hand;",
             "`MODELYARD_UPDATE_GOLDEN=1 pytest tests/unit/test_findings_catalogue.py` rewrites it). A finding in a",
             "report carries the measured values, the file and the field; … here marks where they go.", ""]
    concern = None
    for r in RULES:
        head = r.code.split(".", 1)[0]
        if head != concern:
            concern = head
            lines += ["", f"## {head}", "", "| code | severity | summary | fix | source |", "|---|---|---|---|---|"]
        lines.append(f"| `{r.code}` | {_cell(r.severity)} | {_cell(r.summary)} | {_cell(r.fix)} | {_cell(r.source)} |")
    return "\n".join(lines) + "\n"
