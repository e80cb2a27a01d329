"""Golden files for the serialized formats: manifest.json, report.json, bundle.json and serve/*.yaml of the
tiny test model (tests/golden/), and the JSON Schemas of manifest.json and report.json generated from their records. A change of format shows as a diff here before it reaches a user's store.
``MODELYARD_UPDATE_GOLDEN=1`` rewrites them (review the diff). Values that differ between machines and runs
(the creation time, library versions, temp paths) are replaced by ``<…>`` before comparing."""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
from pathlib import Path

import jsonschema
import pytest
import zstandard

from modelyard.artifact.manifest import Manifest
from modelyard.artifact.schemas import MANIFEST_SCHEMA, REPORT_SCHEMA, SCHEMAS, render
from modelyard.artifact.schemas import load as load_schema
from modelyard.errors import ManifestError
from modelyard.settings import Settings
from modelyard.stages.quantize import Preflight, Quality, QuantizeResult, Recipe, manifest_record
from modelyard.stages.serve import ServeTarget, plan_serve, write_serve_files
from modelyard.stages.smoke import SmokeResult
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
    """``doc`` as stable JSON: ``created_at``, every library version (and so the report's sha256) replaced, temp
    paths named."""
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
    if isinstance(out.get("artifact"), dict) and isinstance(out["artifact"].get("tools"), dict):  # report.json's claims
        out["artifact"]["tools"] = {k: "<version>" for k in sorted(out["artifact"]["tools"])}
    if isinstance(out.get("verification"), dict) and out["verification"].get("report_sha256"):  # over those versions
        out["verification"]["report_sha256"] = "<sha256 of report.json>"
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
    out = bundle_artifact(art, tmp_path / "tiny.tar.zst", settings=Settings()).path
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
    assert written == ["alerts.yml", "compose.yaml", "prometheus.yml", "vllm.yaml"]
    for name in written:
        _same_as_golden(f"serve/{name}", (tmp_path / "serve" / name).read_text().replace(str(tmp_path), "<tmp>"))
    assert files is not None


def test_published_schemas_are_the_ones_the_records_generate():
    for path, model in SCHEMAS.items():
        if os.environ.get("MODELYARD_UPDATE_GOLDEN") == "1":
            path.write_text(render(model))
        assert path.read_text() == render(model), f"{path.name} is stale: MODELYARD_UPDATE_GOLDEN=1 rewrites it"


def test_stored_manifest_and_report_follow_the_generated_schemas(golden_artifact):
    art, _ = golden_artifact
    jsonschema.validate(json.loads((art / "manifest.json").read_text()), load_schema(MANIFEST_SCHEMA))
    jsonschema.validate(json.loads((art / "report.json").read_text()), load_schema(REPORT_SCHEMA))


def _every_record(golden_artifact) -> dict:  # noqa: ANN001
    """The golden manifest with every optional record filled the way its stage writes it."""
    art, _ = golden_artifact
    doc = json.loads((art / "manifest.json").read_text())
    load = SmokeResult(passed=True, vllm_version="0.32.0", question="Capital of France?", text="Paris.",
                       finish_reason="stop", last_token="<|im_end|>", prompt_tokens=31, completion_tokens=3,
                       load_seconds=12.5, generate_seconds=0.25, tokens_per_second=12.0, max_model_len=2048,
                       enforce_eager=True, wall_seconds=20, numeric={"passed": True, "kl_mean": 0.0},
                       findings=({"code": "smoke.numeric.compared", "severity": "info", "message": "m", "file": None,
                                  "field": None, "value": 0.0, "fix": None, "source": None, "limit": 0.05},))
    quant = QuantizeResult(scheme="w4a16", model_dir=art / "model", recipe=Recipe("text", "ab" * 32, "modelyard/recipes/w4a16.yaml"),
                           calibration={"samples": 8, "max_seq_len": 128, "sha256": "cd" * 32, "used": True},
                           quality=Quality(10.0, 10.5, 1.05, 0.01, 100, 1.1, 0.05, True, "ef" * 32),
                           preflight=Preflight(100, 200, 300, 400, 500), seconds=3.0, tools={"llmcompressor": "0.9.0"})
    plan = plan_serve(art / "model", ServeTarget("H100-80GB", gpus=2), name="tiny")
    return {**doc, "patches": {"count": 1, "sha256": "12" * 32, "ops": [
                {"file": "generation_config.json", "pointer": "/eos_token_id", "old": 2, "new": [2, 7],
                 "code": "tokenizer.stop_tokens.missing_turn_terminator", "reason": "r"}]},
            "quantization": manifest_record(quant.record()), "smoke": load.to_dict(), "serve": plan.to_dict(),
            "promotion": {"approved_by": "alice", "approved_at": "2026-12-03T10:00:00+00:00", "note": "",
                          "from": "/stores/staging", "to": ["/stores/prod"], "flow_run_id": None, "evidence": {}},
            "promotions": [{"approved_by": "bob"}]}


def test_every_stage_record_reads_back_byte_for_byte_and_follows_the_schema(golden_artifact):
    doc = _every_record(golden_artifact)
    data = (json.dumps(doc, indent=2) + "\n").encode()
    m = Manifest.from_bytes(data)
    assert m.to_bytes() == data
    jsonschema.validate(json.loads(data), load_schema(MANIFEST_SCHEMA))
    assert (m.scheme, m.quantization.quality.ppl_ratio, m.smoke.level_name, m.smoke.numeric_passed) == ("w4a16", 1.05, "load", True)
    assert (m.smoke.wall_seconds, m.smoke.findings[0].limit, m.serve.tensor_parallel_size, m.patches.ops[0].new) == (20, 0.05, 2, [2, 7])
    assert (m.promotion.from_, m.promotion.to, m.promotions[0].approved_by) == ("/stores/staging", ("/stores/prod",), "bob")


def test_a_record_of_the_wrong_type_is_refused_by_the_parser_and_the_schema(golden_artifact):
    doc = _every_record(golden_artifact)
    doc["files"][0]["size"] = "158"
    with pytest.raises(ManifestError) as e:
        Manifest.from_bytes(json.dumps(doc).encode())
    assert e.value.message == "manifest.json: files.0.size: Input should be a valid integer"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, load_schema(MANIFEST_SCHEMA))
    doc["files"][0]["size"] = 158
    doc["smoke"]["level"] = "soak"
    with pytest.raises(ManifestError) as e:
        Manifest.from_bytes(json.dumps(doc).encode())
    assert e.value.message == "manifest.json: smoke.level: Input should be 'load', 'server' or 'bench'"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, load_schema(MANIFEST_SCHEMA))
