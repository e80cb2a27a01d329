"""Runtime version comparisons for version-gated rules (PEP 440, via ``packaging``)."""

from __future__ import annotations

from packaging.version import InvalidVersion, Version

#: distributions whose behaviour the transformers facts (:mod:`modelyard.checks.hf`) are: their versions
#: are in every facts-cache key and every question to a facts worker
FACTS_LIBRARIES = ("transformers", "tokenizers", "torch", "huggingface_hub", "jinja2", "sentencepiece", "tiktoken",
                   "protobuf")


def parse_version(v: str) -> Version:
    """Parse ``v`` (e.g. ``"0.5.3.post1"``, ``"v0.6.3"``); raises ``ValueError`` when it is not a version."""
    try:
        return Version(v.strip().lstrip("v"))
    except InvalidVersion as exc:
        raise ValueError(f"{v!r} is not a version number (expected e.g. 0.6.3)") from exc


def version_lt(a: str, b: str) -> bool:
    """True when version ``a`` is older than ``b``."""
    return parse_version(a) < parse_version(b)
