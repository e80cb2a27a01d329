"""The CLI reference page (``docs/reference/cli-options.md``), generated from the typer app itself: every
command, its usage, its help and every argument and option with its metavar, default and help text.

``tests/unit/test_cli_reference.py`` asserts that the page is this module's output
(``MODELYARD_UPDATE_GOLDEN=1`` rewrites it), so a flag cannot change without its documentation.

typer vendors click (its classes are not ``click``'s), so the command tree is read through the methods both
share (``list_commands``, ``params``, ``make_metavar``), never through a private typer module."""

from __future__ import annotations

from typing import Any

import typer
from typer.core import TyperGroup


def _cell(text: object) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _rows(cmd: Any, ctx: Any) -> list[str]:
    rows = ["| argument or option | help |", "|---|---|"]
    for p in cmd.params:
        if getattr(p, "hidden", False):
            continue
        if p.param_type_name == "argument":
            rows.append(f"| `{(p.name or '').upper()}` ({'required' if p.required else 'optional'}) | {_cell(p.help or '')} |")
            continue
        record = p.get_help_record(ctx)
        if record:
            rows.append(f"| `{_cell(record[0])}` | {_cell(record[1])} |")
    return rows


def _section(cmd: Any, path: list[str], parent: Any) -> list[str]:
    ctx = type(parent)(cmd, info_name=path[-1], parent=parent)
    out = ["", f"## `{' '.join(path)}`", ""]
    if hasattr(cmd, "list_commands"):
        out += [_cell((cmd.help or "").strip().split("\n\n")[0]), ""]
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                out += _section(sub, [*path, name], ctx)
        return out
    usage = " ".join(cmd.collect_usage_pieces(ctx))
    out += [f"`{' '.join(path)} {usage}`", ""]
    help_text = (cmd.help or "").strip()
    if help_text:
        out += [p.strip() for p in help_text.split("\n\n")[:2]]
        out.append("")
    out += _rows(cmd, ctx)
    return out


def markdown(app: typer.Typer) -> str:
    """The reference page of ``app``: one section per command, in ``--help`` order."""
    root = typer.main.get_command(app)
    assert isinstance(root, TyperGroup)  # an app of several commands
    ctx = root.context_class(root, info_name="modelyard")
    lines = ["# CLI reference", "",
             "Every command and flag, generated from the CLI itself (`modelyard/cli/reference.py`; do not edit by hand:",
             "`MODELYARD_UPDATE_GOLDEN=1 pytest tests/unit/test_cli_reference.py` rewrites it). What the commands are",
             "for, exit codes and the shared flags: [CLI commands and flags](cli.md)."]
    for name in root.list_commands(ctx):
        sub = root.get_command(ctx, name)
        if sub is not None and not sub.hidden:
            lines += _section(sub, ["modelyard", name], ctx)
    return "\n".join(lines) + "\n"
