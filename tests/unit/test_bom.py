"""modelyard bom: a CycloneDX 1.6 ML-BOM of an artifact, valid against the CycloneDX schema, with the model,
its files and hashes, the base model and calibration data of a derived artifact, and the toolchain."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from modelyard.artifact.bom import build_bom, validate_bom
from modelyard.artifact.manifest import Manifest
from modelyard.cli import app
from modelyard.errors import ManifestError
from modelyard.stages.quantize import Preflight, Quality, QuantizeResult, Recipe, manifest_record
from tests.unit.test_bundle import _build_artifact


@pytest.fixture(scope="module")
def artifact(tiny_llama_dir, tmp_path_factory):
    return _build_artifact(tiny_llama_dir, tmp_path_factory.mktemp("bom-store"), hub=True)


def test_bom_of_a_hub_checkpoint_names_it_by_purl_and_hashes_every_file(artifact, tmp_path):
    r = CliRunner().invoke(app, ["bom", str(artifact), "-o", str(tmp_path / "bom.json")])
    assert r.exit_code == 0, r.output
    doc = json.loads((tmp_path / "bom.json").read_text())
    validate_bom(doc)
    m = Manifest.load(artifact)
    assert (doc["bomFormat"], doc["specVersion"]) == ("CycloneDX", "1.6")
    model = doc["metadata"]["component"]
    assert (model["type"], model["name"], model["version"]) == ("machine-learning-model", "tiny", m.revision)
    assert model["purl"] == f"pkg:huggingface/org/tiny@{m.source.commit}"
    files = {c["name"]: c["hashes"][0]["content"] for c in model["components"]}
    assert {k: v for k, v in files.items() if k.startswith("model/")} == {f.path: f.sha256 for f in m.files}
    assert sorted(k for k in files if not k.startswith("model/")) == ["manifest.json", "report.json", "serve/vllm.yaml"]
    assert model["modelCard"]["modelParameters"] == {"task": "text-generation", "architectureFamily": "llama",
                                                     "modelArchitecture": "LlamaForCausalLM"}
    assert "pedigree" not in model and "components" not in doc
    tools = {t["name"]: t.get("purl") for t in doc["metadata"]["tools"]["components"]}
    assert tools["transformers"] == f"pkg:pypi/transformers@{m.tools['transformers']}"
    assert "modelyard" in tools
    assert doc == build_bom(artifact)  # deterministic: same serial number and timestamp on every run


def test_bom_of_a_quantized_artifact_carries_its_base_model_and_calibration_data(artifact, tmp_path):
    import shutil

    q = tmp_path / "q"
    shutil.copytree(artifact, q)
    m = Manifest.load(q)
    rec = QuantizeResult(scheme="w4a16", model_dir=q / "model", recipe=Recipe("text", "ab" * 32, "modelyard/recipes/w4a16.yaml"),
                         calibration={"samples": 8, "max_seq_len": 128, "sha256": "cd" * 32, "used": True,
                                      "source": "modelyard/data/calibration.txt"},
                         quality=Quality(10.0, 10.5, 1.05, 0.01, 100, 1.1, 0.05, True, "ef" * 32),
                         preflight=Preflight(100, 200, 300, 400, 500), seconds=3.0).record()
    (q / "manifest.json").unlink()
    Manifest.from_dict({**m.to_dict(), "quantization": manifest_record(rec)}).save(q)
    doc = build_bom(q)
    validate_bom(doc)
    model = doc["metadata"]["component"]
    assert "purl" not in model  # a derived artifact is not the hub's checkpoint
    (base,) = model["pedigree"]["ancestors"]
    assert (base["name"], base["version"], base["purl"]) == ("org/tiny", m.source.commit,
                                                              f"pkg:huggingface/org/tiny@{m.source.commit}")
    (data,) = doc["components"]
    assert (data["type"], data["name"], data["hashes"]) == ("data", "modelyard/data/calibration.txt",
                                                             [{"alg": "SHA-256", "content": "cd" * 32}])
    assert model["modelCard"]["modelParameters"]["datasets"] == [{"ref": "data:calibration"}]
    assert model["modelCard"]["quantitativeAnalysis"]["performanceMetrics"][0] == {
        "type": "perplexity ratio (quantized / parent)", "value": "1.05", "slice": "held-out text"}
    assert {"name": "modelyard:quantization.scheme", "value": "w4a16"} in model["properties"]
    assert {"ref": model["bom-ref"], "dependsOn": ["data:calibration"]} in doc["dependencies"]


def test_a_bom_that_breaks_the_schema_is_refused(artifact):
    doc = build_bom(artifact)
    doc["metadata"]["component"]["type"] = "neural-network"
    with pytest.raises(ManifestError) as e:
        validate_bom(doc)
    assert e.value.message.startswith("the AI-BOM does not follow the CycloneDX 1.6 schema: ")


def test_a_malformed_created_at_is_exit_2_naming_the_field(artifact, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(artifact, copy)
    (copy / "manifest.json").chmod(0o644)
    m = json.loads((copy / "manifest.json").read_text())
    (copy / "manifest.json").write_text(json.dumps({**m, "created_at": "yesterday"}))
    r = CliRunner().invoke(app, ["bom", str(copy), "--json"])
    assert r.exit_code == 2, r.output
    err = json.loads(r.output)["error"]
    assert (err["type"], err["message"]) == (
        "ManifestError", f"{copy / 'manifest.json'}: created_at is 'yesterday', not an ISO 8601 time")


@pytest.mark.parametrize(("card", "licenses"), [
    ({"license": "apache-2.0"}, [{"license": {"id": "Apache-2.0"}}]),  # an SPDX id is given as one
    ({"license": "other", "license_name": "llama3.1", "license_link": "https://example.org/LICENSE"},
     [{"license": {"name": "llama3.1", "url": "https://example.org/LICENSE"}}]),  # the card's link kept
    ({"license": "apache-2.0", "license_link": "https://example.org/L"},
     [{"license": {"id": "Apache-2.0", "url": "https://example.org/L"}}]),
    ({}, None),
])
def test_the_cards_license_recorded_by_the_fetch_is_the_models_license(artifact, tmp_path, card, licenses):
    import shutil

    copy = tmp_path / "a"
    shutil.copytree(artifact, copy)
    doc = json.loads((copy / "manifest.json").read_text())
    doc["source"].update(card)
    (copy / "manifest.json").chmod(0o644)
    (copy / "manifest.json").write_text(json.dumps(doc))
    bom = build_bom(copy)
    validate_bom(bom)
    assert bom["metadata"]["component"].get("licenses") == licenses
