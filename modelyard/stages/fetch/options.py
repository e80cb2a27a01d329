"""What a user asks of the fetch stage: which source files to take (``ingest --include/--exclude``, a watch
YAML's ``allow_patterns``/``ignore_patterns``) and which card licenses to refuse (``--refuse-license``)."""

from __future__ import annotations

from typing import Annotated, Optional

from pydantic import BaseModel, ConfigDict, Field

from modelyard.model.options import Flag


class FetchFlags(BaseModel):
    """Hub allow/ignore patterns, globs, added to the fetch stage's defaults (the files a runtime reads and the
    license files; pickle weights, GGUF files and partial downloads are ignored unless included by name)."""

    model_config = ConfigDict(frozen=True)

    allow_patterns: Annotated[Optional[tuple[str, ...]], Flag("--include", empty_none=True)] = Field(
        None, description="more source files to take into model/, a glob (repeatable), beside the files a runtime reads "
                          "and the license files, which are always taken")
    ignore_patterns: Annotated[Optional[tuple[str, ...]], Flag("--exclude", empty_none=True)] = Field(
        None, description="source files not to take, a glob (repeatable)")
    refuse_licenses: Annotated[Optional[tuple[str, ...]], Flag("--refuse-license", empty_none=True)] = Field(
        None, description="refuse a model whose card (README.md) names this license, as the Hub's license id "
                          "(e.g. cc-by-nc-4.0, or the license_name of an 'other' one); 'unknown' refuses a card "
                          "that names none (repeatable). Checked before any weight byte is downloaded")
