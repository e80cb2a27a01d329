"""The report's JSON follows the published schema (report.schema.json) and its Markdown escapes cells."""

import json
from pathlib import Path

import jsonschema

from modelyard.artifact.schemas import REPORT_SCHEMA
from modelyard.checks import Target
from modelyard.stages.verify import verify_folder
from tests.conftest import json_result, run_cli
from tests.unit.test_checks_defects import copy, edit_json


def test_json_report_matches_schema_and_counts(tiny_llama_dir, tmp_path):
    d = copy(tiny_llama_dir, tmp_path / "m")
    edit_json(d / "generation_config.json", eos_token_id=1)
    edit_json(d / "config.json", eos_token_id=1)
    edit_json(d / "tokenizer_config.json", eos_token="<s>")
    r = verify_folder(d, Target(serve="chat", vllm_version="0.6.3", gpu_cc="8.0"))
    doc = json.loads(r.to_json())
    jsonschema.validate(doc, json.loads(REPORT_SCHEMA.read_text()))
    assert doc["summary"] == {"errors": 1, "warnings": 0, "infos": 0, "not_judged": 0, "passed": False}
    assert doc["target"] == {"tensor_parallel_size": 1, "max_model_len": None, "dtype": None, "serve": "chat",
                             "vllm_version": "0.6.3", "transformers_version": None, "gpu_cc": "8.0",
                             "require_judged": False}
    (f,) = doc["findings"]
    assert (f["code"], f["file"], f["field"], f["value"]) == (
        "tokenizer.stop_tokens.missing_turn_terminator", "generation_config.json", "eos_token_id", 1)
    assert f["source"] == "vllm-project/vllm#4180, vllm-project/vllm#4182"
    md = r.to_markdown("t")
    assert "| error | `tokenizer.stop_tokens.missing_turn_terminator` | generation_config.json `eos_token_id` |" in md
    assert "<\\|im_end\\|> (id 2)" in md  # pipes inside cells are escaped


def test_cli_json_and_usage_errors(tiny_llama_dir):
    ok = run_cli("verify", str(tiny_llama_dir), "--json")
    assert ok.returncode == 0
    jsonschema.validate(json_result(ok.stdout, "verify"), json.loads(REPORT_SCHEMA.read_text()))
    bad = run_cli("verify", str(tiny_llama_dir), "--vllm-version", "latest")
    assert bad.returncode == 2 and "--vllm-version" in bad.stderr and "Traceback" not in bad.stderr
    bad = run_cli("verify", str(tiny_llama_dir), "--dtype", "fp8")
    assert bad.returncode == 2 and bad.stderr.splitlines() == [
        "error[usage]: Invalid value for '--dtype': 'fp8' is not one of 'auto', 'half', 'float16', 'bfloat16', "
        "'float', 'float32'.", "fix: See `modelyard verify --help`."]


def test_check_order_does_not_depend_on_import_order():
    """Regression: importing a check module early (as pipeline/serve.py does) reordered every report."""
    import subprocess
    import sys

    code = ("import modelyard.checks.tokenizer, modelyard.checks.parallelism\n"
            "from modelyard.checks.suite import registered\n"
            "print(','.join(dict.fromkeys(r.concern for r in registered())))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "files,safetensors,config,architecture,parallelism,quantization,tokenizer,security"


def test_stored_report_reads_back_to_the_same_report(tiny_llama_dir, tmp_path):
    """report.json goes through one parser (artifact/report_record.py): what it reads back writes the same bytes."""
    from modelyard.artifact.report_record import ReportRecord

    d = copy(tiny_llama_dir, tmp_path / "m")
    edit_json(d / "generation_config.json", eos_token_id=1)
    edit_json(d / "config.json", eos_token_id=1)
    r = verify_folder(d, Target(serve="chat", max_model_len=1024)).with_smoke({"passed": True, "vllm_version": "0.32.0"})
    record = ReportRecord.from_bytes(r.to_json().encode())
    assert record.summary.errors == 1 and record.target.serve == "chat" and record.smoke.to_dict() == {"passed": True, "vllm_version": "0.32.0"}
    assert record.to_report().to_json() == r.to_json()


def test_stored_report_of_the_wrong_shape_names_the_field():
    import pytest

    from modelyard.artifact.report_record import ReportRecord
    from modelyard.errors import ManifestError

    good = {"schema_version": "1", "summary": {"errors": 0, "warnings": 0, "infos": 0, "passed": True}, "findings": []}
    with pytest.raises(ManifestError) as e:
        ReportRecord.from_bytes(json.dumps({**good, "findings": [{"code": "a.b", "severity": "fatal", "message": "m"}]}))
    assert e.value.message.startswith("report.json: findings.0.severity: Input should be 'error', 'warning', 'info' or "
                                     "'not_judged'")
    with pytest.raises(ManifestError) as e:
        ReportRecord.from_bytes(b"{not json")
    assert e.value.message.startswith("report.json: (the document): Invalid JSON")


def test_a_rebuilt_tokenizer_is_named_in_the_report_with_why_and_the_evidence():
    from modelyard.checks.report import Report, replaced_files

    check = {"model": "llama", "checked": 31, "reference": "llama.cpp (llama-cpp-python 0.3.36)", "repaired": True,
             "findings": [{"code": "tokenizer.gguf.bos_policy", "message": "the converted tokenizer does not add <bos>"}],
             "after": []}
    source = {"uri": "gguf:///m.gguf", "kind": "gguf", "tokenizer_check": check}
    assert replaced_files(source) == [{
        "file": "tokenizer.json", "by": "rebuilt from the GGUF's tokenizer.ggml.* arrays",
        "why": "tokenizer.gguf.bos_policy: the converted tokenizer does not add <bos>",
        "evidence": "after the rebuild it reads the 31 probe texts as llama.cpp (llama-cpp-python 0.3.36) does"}]
    md = Report(target=Target(), findings=()).with_source(source).to_markdown("t")
    assert ("## Files written instead of the source's\n\n- `tokenizer.json` rebuilt from the GGUF's tokenizer.ggml.* "
            "arrays: after the rebuild it reads the 31 probe texts as llama.cpp (llama-cpp-python 0.3.36) does. Why: "
            "tokenizer.gguf.bos_policy: the converted tokenizer does not add <bos>\n") in md
    assert replaced_files({**source, "tokenizer_check": {**check, "repaired": False}}) == []
    assert "Files written instead" not in Report(target=Target(), findings=()).with_source({"uri": "x"}).to_markdown()
    # and in the manifest's patch list, beside the plan's ops (none here)
    from modelyard.artifact.manifest import build_manifest
    from modelyard.model.snapshot import Snapshot

    snap = Snapshot(root=Path("/m"), source="gguf:///m.gguf", kind="gguf", files=(),
                    provenance={"tokenizer_check": check})
    report = Report(target=Target(), findings=())
    m = build_manifest(name="m", revision="r", snapshot=snap, report=report, report_json=b"{}", smoke=None)
    assert m.patches is not None and (m.patches.count, m.patches.sha256, m.patches.ops) == (0, None, ())
    assert [r.model_dump() for r in m.patches.replaced] == replaced_files(source)
    assert m.modified is True
    plain = Snapshot(root=Path("/m"), source="gguf:///m.gguf", kind="gguf", files=())
    assert build_manifest(name="m", revision="r", snapshot=plain, report=report, report_json=b"{}",
                          smoke=None).patches is None


def test_not_judged_is_its_own_state_and_require_judged_makes_it_an_error():
    """What the local CPU runtime could not decide (here an FP8 dry load without the kernel) is neither a warning
    nor a pass: counted apart, in its own section of report.md, an error only with --require-judged."""
    from modelyard.checks import Finding, Report, Severity
    from modelyard.checks.base import REQUIRED_NOTE, require_judged
    from modelyard.checks.sarif import to_sarif

    nj = Finding("runtime.dry_load.not_judged", Severity.NOT_JUDGED,
                 "vLLM 0.32.0's dry load (cpu, tensor_parallel_size 1) was not judged at its build step: no FP8 kernel",
                 fix="Judge it on the target (`modelyard smoke` there), or trust the hand-written rules.")
    info = Finding("files.left_out", Severity.INFO, "not read by vLLM or transformers: left out of model/", file="README.md")
    r = Report(findings=(nj, info), target=Target())
    d = r.to_dict()
    assert (d["summary"], r.passed) == ({"errors": 0, "warnings": 0, "infos": 1, "not_judged": 1, "passed": True}, True)
    assert d["findings"][0]["severity"] == "not_judged"
    md = r.to_markdown("t")
    assert "**Verdict:** PASS (0 errors, 0 warnings; 1 check not judged here)" in md
    assert ("## Not judged here\n\nWhat this host's runtime could not decide (neither a pass nor a defect; "
            "`--require-judged` makes each an error):\n\n- `runtime.dry_load.not_judged`: vLLM 0.32.0's dry load (cpu, "
            "tensor_parallel_size 1) was not judged at its build step: no FP8 kernel Fix: Judge it on the target") in md
    assert "| not_judged |" not in md  # not in the table of findings
    assert [x["level"] for x in to_sarif(r)["runs"][0]["results"]] == ["note", "note"]
    strict = Target(require_judged=True)
    (e, i) = require_judged(r.findings, strict)
    assert (e.severity, e.message, i) == (Severity.ERROR, nj.message + REQUIRED_NOTE, info)
    assert Report(findings=(e, i), target=strict).passed is False
    assert require_judged(r.findings, Target()) == [nj, info]
