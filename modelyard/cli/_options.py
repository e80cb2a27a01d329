"""The CLI's stage flags, built from the options each stage declares (:mod:`modelyard.model.options`):
one declaration gives the flag, its help, its bounds and its choices, and the command receives the values
under the stages' own field names.

A command declares a parameter ``options`` where the flags go in ``--help``, and is decorated with
:func:`stage_flags`: typer sees one option per declared field in its place; the command receives
``options``, a dict of field name to value (a ``--no-x`` flag already turned into ``x``, a ``Path`` into
a ``str``, a repeated option into a tuple), ready for the stage's model or :class:`IngestOptions`."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Optional, Union, get_args, get_origin

import annotated_types
import typer
from pydantic import BaseModel

from modelyard.cli._common import choice
from modelyard.model.options import Flag, flag_of

#: the default of a command's ``options`` parameter (replaced by the flags; never seen by typer)
STAGE_OPTIONS: dict[str, Any] = {}


def _optional(annotation: Any) -> bool:
    return get_origin(annotation) is Union and type(None) in get_args(annotation)


def _bare(annotation: Any) -> Any:
    """``T`` of ``Optional[T]``; ``annotation`` itself otherwise."""
    if _optional(annotation):
        (inner,) = [a for a in get_args(annotation) if a is not type(None)]
        return inner
    return annotation


def _cli_annotation(field: Any, flag: Flag) -> Any:
    bare = _bare(field.annotation)
    if flag.negate:
        return bool
    if get_origin(bare) is tuple:
        return list[str]
    cli = choice(flag.choices) if flag.choices else (flag.cli_type or bare)
    return Optional[cli] if _optional(field.annotation) else cli


def _cli_default(field: Any, flag: Flag) -> Any:
    if field.is_required():
        return ...
    if flag.negate:
        return False
    if get_origin(_bare(field.annotation)) is tuple:
        return []
    return field.default


def _bounds(field: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for m in field.metadata:
        if isinstance(m, annotated_types.Gt) and isinstance(m.gt, int):
            out["min"] = m.gt + 1  # an integer above gt
        elif isinstance(m, annotated_types.Ge):
            out["min"] = m.ge
        elif isinstance(m, annotated_types.Le):
            out["max"] = m.le
    return out


def _to_field(value: Any, field: Any, flag: Flag) -> Any:
    if flag.negate:
        return not value
    if get_origin(_bare(field.annotation)) is tuple:
        return (tuple(value) or None) if flag.empty_none else tuple(value)
    if flag.cli_type is Path and value is not None:
        return str(value)
    return value


def declared_flags(models: Iterable[type[BaseModel]], exclude: Iterable[str] = ()) -> list[tuple[str, Any, Flag]]:
    """``(field name, FieldInfo, Flag)`` of every field of ``models`` that has a :class:`Flag`, in
    declaration order, less ``exclude``."""
    skip = set(exclude)
    return [(name, f, flag) for m in models for name, f in m.model_fields.items()
            if name not in skip and (flag := flag_of(f)) is not None]


def stage_flags(*models: type[BaseModel], exclude: Iterable[str] = ()) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a command whose parameter ``options`` stands for the flags of ``models`` (pydantic models
    whose fields carry a :class:`~modelyard.model.options.Flag`), less the fields named in ``exclude``."""
    flags = declared_flags(models, exclude)

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        sig = inspect.signature(fn)
        params: list[inspect.Parameter] = []
        for p in sig.parameters.values():
            if p.name != "options":
                params.append(p.replace(kind=inspect.Parameter.POSITIONAL_OR_KEYWORD))
                continue
            for name, field, flag in flags:
                option = typer.Option(_cli_default(field, flag), *flag.decls, help=field.description,
                                      show_default=flag.show_default, **_bounds(field))
                params.append(inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=option,
                                                annotation=_cli_annotation(field, flag)))

        @functools.wraps(fn)
        def command(**kwargs: Any) -> Any:
            options = {name: _to_field(kwargs.pop(name), field, flag) for name, field, flag in flags}
            return fn(**kwargs, options=options)

        command.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
        return command

    return deco
