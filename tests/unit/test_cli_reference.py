"""docs/reference/cli-options.md is generated from the typer app (modelyard/cli/reference.py)."""

from __future__ import annotations

from modelyard.cli import app
from modelyard.cli.reference import markdown
from tests.conftest import ROOT, generated_doc

DOC = ROOT / "docs" / "reference" / "cli-options.md"


def test_cli_reference_is_generated_from_the_app():
    text = markdown(app)
    generated_doc(DOC, text)
    sections = [line for line in text.splitlines() if line.startswith("## `modelyard ")]
    assert len(sections) == 28  # 24 commands, the server group and its start, stop, status
    assert "| `--tensor-parallel-size, --tp <int range>` | target TP size [default: 1; x>=1] |" in text
