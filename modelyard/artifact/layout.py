"""The artifact folder's layout: the only module that names its files.

An artifact is ``<store>/<name>/<revision>/`` holding::

    model/              what ``vllm serve model/`` loads (config, tokenizer, weights)
    manifest.json       identity, provenance, per-file size + sha256, stage results (written last)
    bundle.json         (in a bundle and an object store) the index of the other files, with sha256
    report.json         the verification report (schema ``artifact/report.schema.json``)
    report.md           the same, for people
    patches.json        the patch plan applied to model/ (when patched), with patch.diff
    quantization.json   the quantization record (when quantized), with recipe.yaml
    serve/              vllm.yaml, compose.yaml, README.md (and nginx.conf)
    model.sig           the model-signing bundle over model/ (when signed)

A ``modelyard patch`` output has the same ``model/`` + ``patches.json`` shape without a manifest.
"""

from __future__ import annotations

from pathlib import Path

MODEL_DIR = "model"
MANIFEST = "manifest.json"
#: the artifact's index of the files manifest.json does not list (modelyard.artifact.index)
INDEX = "bundle.json"
REPORT_JSON = "report.json"
REPORT_MD = "report.md"
PATCHES = "patches.json"
PATCH_DIFF = "patch.diff"
QUANTIZATION = "quantization.json"
RECIPE = "recipe.yaml"
SERVE_DIR = "serve"
SIGNATURE = "model.sig"


def is_artifact(path: Path) -> bool:
    """True when ``path`` is an artifact folder: ``manifest.json`` beside a ``model/`` folder."""
    return (path / MANIFEST).is_file() and (path / MODEL_DIR).is_dir()


def model_root(path: Path) -> Path:
    """The model folder inside ``path``: ``path/model`` for an artifact or a ``modelyard patch``
    output (``model/`` beside ``manifest.json`` or ``patches.json``), else ``path``."""
    if (path / MODEL_DIR).is_dir() and ((path / MANIFEST).is_file() or (path / PATCHES).is_file()):
        return path / MODEL_DIR
    return path
