"""Stage cache keys: what a cached stage result depends on, hashed into one key.

The cache itself is Prefect's task cache: a task with a ``cache_key_fn`` and ``persist_result=True``
stores its result under the key in its result storage; a later run whose key matches gets the stored
result and Prefect marks the task run ``Cached``, in its logs and UI. modelyard keeps those results
in ``<MODELYARD_HOME>/.cache/stages`` (:func:`folder`), beside the digest cache, and decides only the
keys. A key is the SHA256 of:

- the stage's name and its **inputs by content**: the tree digest of the files it reads (path, size,
  sha256 of each, see :func:`modelyard.model.digest.tree_digest`) and its options;
- the **code** that computes it: a digest of every file of the installed ``modelyard`` package
  (:func:`code_digest`), so a changed check invalidates every cached report;
- the **library versions** whose behaviour the stage reproduces (transformers parses config.json,
  tokenizers reads the tokenizer, safetensors the headers, huggingface_hub downloads).

What is never in a key: a token or password (a key is a file name on disk), a path to the user's files
(content is), a time. A result that cannot be read back (corrupt, from another Python) is a miss.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from modelyard.version import code_digest
from modelyard.version import library_versions as _versions

if TYPE_CHECKING:
    from modelyard.settings import Settings

#: distributions whose versions are part of every key
LIBRARIES = ("transformers", "tokenizers", "safetensors", "huggingface_hub")


def library_versions() -> dict[str, str | None]:
    """Installed versions of :data:`LIBRARIES` (None when one is not installed)."""
    return _versions(LIBRARIES)


def stage_key(stage: str, **inputs: Any) -> str:
    """The cache key of ``stage`` given its ``inputs`` (JSON-serialisable values; ``str()`` for the
    rest): ``modelyard-<stage>-<sha256 hex>``. Equal inputs, code and library versions give equal keys."""
    payload = json.dumps({"stage": stage, "inputs": inputs, "code": code_digest(), "libraries": library_versions()},
                         sort_keys=True, default=str)
    return f"modelyard-{stage}-{hashlib.sha256(payload.encode()).hexdigest()}"


def folder(settings: Settings) -> Path:
    """Where the cached stage results of ``settings``' home live: ``<MODELYARD_HOME>/.cache/stages``."""
    return settings.cache_dir() / "stages"
