"""The ``modelyard`` command: parse, call, render, exit code. Thin on purpose.

Exit codes: 0 success; 1 a gate failed (verification errors, hash mismatch, smoke failure);
2 bad usage or unreadable input (missing source, no config.json, unreachable endpoint, pickle-only
weights, store conflict); 3 an internal error; 130 interrupted.

One module a concern: ``_common`` (consoles, progress, failures), ``ingest``, ``checks`` (verify, patch,
quantize), ``serving`` (smoke, serve-plan, doctor), ``artifacts`` (bundle ... show) and ``orchestration``
(watch ... deploy). Commands are registered here, in the order ``--help`` lists them. Heavy modules are
imported inside the commands, so that ``modelyard --help`` stays fast.
"""

from __future__ import annotations

import typer

from modelyard.cli import artifacts, checks, ingest, orchestration, serving
from modelyard.cli.ingest import demo_gguf_path

__all__ = ["app", "demo_gguf_path", "main"]

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="Turn an LLM checkpoint into a verified, servable artifact for vLLM.")

for _name, _command in (
    ("ingest", ingest.ingest),
    ("verify", checks.verify),
    ("patch", checks.patch_cmd),
    ("quantize", checks.quantize_cmd),
    ("smoke", serving.smoke_cmd),
    ("serve-plan", serving.serve_plan_cmd),
    ("bundle", artifacts.bundle_cmd),
    ("unbundle", artifacts.unbundle_cmd),
    ("doctor", serving.doctor),
    ("publish", artifacts.publish_cmd),
    ("pull", artifacts.pull_cmd),
    ("sign", artifacts.sign_cmd),
    ("verify-signature", artifacts.verify_signature_cmd),
    ("list", artifacts.list_cmd),
    ("show", artifacts.show_cmd),
    ("demo", ingest.demo),
    ("watch", orchestration.watch),
    ("promote", orchestration.promote),
    ("approve", orchestration.approve),
    ("deploy", orchestration.deploy),
):
    app.command(_name)(_command)


def main() -> None:
    app()
