"""What a user asks of the fetch stage: which source files to take (``ingest --include/--exclude``, a watch
YAML's ``allow_patterns``/``ignore_patterns``)."""

from __future__ import annotations

from typing import Annotated, Optional

from pydantic import BaseModel, ConfigDict, Field

from modelyard.model.options import Flag


class FetchFlags(BaseModel):
    """Hub allow/ignore patterns, globs (None: the fetch stage's defaults, the files a runtime reads)."""

    model_config = ConfigDict(frozen=True)

    allow_patterns: Annotated[Optional[tuple[str, ...]], Flag("--include", empty_none=True)] = Field(
        None, description="source files to take into model/, a glob (repeatable; default: the files a runtime reads)")
    ignore_patterns: Annotated[Optional[tuple[str, ...]], Flag("--exclude", empty_none=True)] = Field(
        None, description="source files not to take, a glob (repeatable)")
