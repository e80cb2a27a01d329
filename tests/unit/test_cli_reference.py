"""docs/reference/cli-options.md is generated from the typer app (modelyard/cli/reference.py)."""

from __future__ import annotations

import os

from modelyard.cli import app
from modelyard.cli.reference import markdown
from tests.conftest import ROOT

DOC = ROOT / "docs" / "reference" / "cli-options.md"


def test_cli_reference_is_generated_from_the_app():
    text = markdown(app)
    if os.environ.get("MODELYARD_UPDATE_GOLDEN") == "1":
        DOC.write_text(text)
    assert DOC.read_text() == text
    sections = [line for line in text.splitlines() if line.startswith("## `modelyard ")]
    assert len(sections) == 28  # 24 commands, the server group and its start, stop, status
    assert "| `--tensor-parallel-size, --tp <int range>` | target TP size [default: 1; x>=1] |" in text
