"""Where the package's own files are: the package folder, its data and recipes, and the checkout
(the folder holding ``.venv-vllm`` and the legacy venvs when modelyard runs from a source tree)."""

from __future__ import annotations

from pathlib import Path

#: the installed ``modelyard`` package folder
PACKAGE = Path(__file__).resolve().parent
#: prompts, calibration and held-out text shipped in the wheel (``modelyard/data``)
DATA = PACKAGE / "data"
#: llm-compressor recipes shipped in the wheel (``modelyard/recipes``)
RECIPES = PACKAGE / "recipes"
#: the source checkout (one folder above the package); meaningful only for an editable install
CHECKOUT = PACKAGE.parent
