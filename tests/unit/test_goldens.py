"""Golden files for the serialized formats: manifest.json, report.json, bundle.json and serve/*.yaml of the
tiny test model (tests/golden/). A change of format shows as a diff here before it reaches a user's store.
``MODELYARD_UPDATE_GOLDEN=1`` rewrites them (review the diff). Values that differ between machines and runs
(the creation time, library versions, temp paths) are replaced by ``<…>`` before comparing."""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
from pathlib import Path

import pytest
import zstandard

from modelyard.stages.serve import ServeTarget, plan_serve, write_serve_files
from modelyard.transport.refs import bundle_artifact
from tests.conftest import ROOT
from tests.unit.test_bundle import _build_artifact

GOLDEN = ROOT / "tests" / "golden"


def _same_as_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("MODELYARD_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.read_text() == text, f"{name} changed: review the diff, then MODELYARD_UPDATE_GOLDEN=1"


def _normalised(doc: dict, tmp: Path) -> str:
    """``doc`` as stable JSON: ``created_at`` and every library version replaced, temp paths named."""
    def walk(v, key=None):  # noqa: ANN001, ANN202
        if isinstance(v, dict):
            return {k: walk(x, k) for k, x in v.items()}
        if isinstance(v, list):
            return [walk(x) for x in v]
        if key == "created_at" and v is not None:
            return "<time>"
        if isinstance(v, str) and str(tmp) in v:
            return v.replace(str(tmp), "<tmp>")
        return v
    out = walk(doc)
    if isinstance(out.get("tools"), dict):
        out["tools"] = {k: "<version>" for k in sorted(out["tools"])}
    if isinstance(out.get("tool"), dict):
        out["tool"] = {**out["tool"], "version": "<version>"}
    return json.dumps(out, indent=2) + "\n"


@pytest.fixture(scope="module")
def golden_artifact(tiny_llama_dir, tmp_path_factory) -> tuple[Path, Path]:
    home = tmp_path_factory.mktemp("golden-store")
    return _build_artifact(tiny_llama_dir, home, hub=True), home


def test_manifest_and_report_match_their_goldens(golden_artifact):
    art, home = golden_artifact
    _same_as_golden("manifest.json", _normalised(json.loads((art / "manifest.json").read_text()), home))
    _same_as_golden("report.json", _normalised(json.loads((art / "report.json").read_text()), home))


def test_bundle_index_matches_its_golden(golden_artifact, tmp_path):
    art, home = golden_artifact
    out = bundle_artifact(art, tmp_path / "tiny.tar.zst").path
    with open(out, "rb") as fh, zstandard.ZstdDecompressor().stream_reader(fh) as z, \
            tarfile.open(fileobj=z, mode="r|") as tf:
        names = []
        for member in tf:
            names.append(member.name)
            if member.name == "bundle.json":
                index = json.loads(tf.extractfile(member).read())
                break
    assert names == ["manifest.json", "bundle.json"]
    assert index["manifest_sha256"] == hashlib.sha256((art / "manifest.json").read_bytes()).hexdigest()
    index["manifest_sha256"] = "<sha256 of manifest.json: it holds the creation time>"
    _same_as_golden("bundle.json", _normalised(index, home))


def test_serve_files_match_their_goldens(golden_artifact, tmp_path):
    art, _ = golden_artifact
    plan = plan_serve(art / "model", ServeTarget("H100-80GB", gpus=2), name="tiny")
    files = write_serve_files(tmp_path, plan, proxy=True)
    written = sorted(p.name for p in (tmp_path / "serve").iterdir() if p.suffix in (".yaml", ".yml"))
    assert written == ["compose.yaml", "prometheus.yml", "vllm.yaml"]
    for name in written:
        _same_as_golden(f"serve/{name}", (tmp_path / "serve" / name).read_text().replace(str(tmp_path), "<tmp>"))
    assert files is not None
