"""Options declared once: each stage declares the options a user gives it as a pydantic model whose
fields carry their command-line spelling (:class:`Flag`), help text (the field's ``description``) and
validation (the field's type and bounds). The CLI builds its flags from these models
(:mod:`modelyard.cli._options`), ingest's options compose them (:class:`modelyard.flows.options.IngestOptions`),
and a watch YAML uses the same field names."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Flag:
    """A field's command line: ``decls`` (``"--max-model-len"``, aliases after it), ``cli_type`` when the
    command line reads another type than the field holds (a ``Path`` for a ``str`` path), ``choices`` the
    values the command line accepts (from the registry that owns them; the field itself stays a ``str`` that
    the stage validates with its own message, as a watch YAML is), ``negate`` for a
    ``--no-x`` flag that sets the field ``x`` to False, ``empty_none`` for a repeatable option whose empty
    list means None (the stage's default), and ``show_default`` as typer's."""

    decls: tuple[str, ...]
    cli_type: Any = None
    choices: tuple[str, ...] | None = None
    negate: bool = False
    empty_none: bool = False
    show_default: bool = True

    def __init__(self, *decls: str, cli_type: Any = None, choices: Iterable[str] | None = None, negate: bool = False,
                 empty_none: bool = False, show_default: bool = True) -> None:
        object.__setattr__(self, "decls", decls)
        object.__setattr__(self, "cli_type", cli_type)
        object.__setattr__(self, "choices", tuple(choices) if choices is not None else None)
        object.__setattr__(self, "negate", negate)
        object.__setattr__(self, "empty_none", empty_none)
        object.__setattr__(self, "show_default", show_default)


def flag_of(field: Any) -> Flag | None:
    """The :class:`Flag` in a pydantic ``FieldInfo``'s metadata (``Annotated[T, Flag(...)]``), or None."""
    return next((m for m in field.metadata if isinstance(m, Flag)), None)
