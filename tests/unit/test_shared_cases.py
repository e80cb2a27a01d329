"""Every folder of ../shared/cases gets the verdict its EXPECTED.json gives (read in place, never copied).

For each case and each of its targets (``target`` and ``other_targets``): the worst severity equals
the expected verdict; a finding of that severity names the file or field ``about`` names; for an
error verdict, no error concerns anything else ("no unrelated error"); for a pass, nothing at all
above info. Cases listing several ``findings`` must have each of them.
"""

import json

import pytest

from modelyard.checks import Target
from modelyard.stages.verify import verify_folder
from tests.conftest import SHARED_CASES, run_cli

pytestmark = pytest.mark.skipif(not SHARED_CASES.is_dir(), reason="../shared/cases is not beside this checkout")

_RANK = {"pass": 0, "info": 0, "warning": 1, "error": 2}


def _cases():
    if not SHARED_CASES.is_dir():
        return []
    out = []
    for d in sorted(p for p in SHARED_CASES.iterdir() if (p / "EXPECTED.json").is_file()):
        exp = json.loads((d / "EXPECTED.json").read_text())
        out.append(pytest.param(d.name, exp["target"], exp["verdict"], exp.get("about"), id=d.name))
        for i, other in enumerate(exp.get("other_targets") or []):
            out.append(pytest.param(d.name, other["target"], other["verdict"], None, id=f"{d.name}-other{i}"))
    return out


def to_target(t: dict) -> Target:
    return Target(tensor_parallel_size=t.get("tensor_parallel_size") or 1, max_model_len=t.get("max_model_len"),
                  dtype=t.get("dtype"), serve=t.get("serve"), vllm_version=t.get("vllm_version"),
                  transformers_version=t.get("transformers_version"), gpu_cc=t.get("gpu_cc"))


def abouts(f) -> set[str]:
    """The names a finding can be referred to by: file, field, and ``<file stem>.<field>``."""
    out = {x for x in (f.file, f.field) if x}
    if f.file and f.field:
        out.add(f"{f.file.removesuffix('.json')}.{f.field}")
    if f.field and " -> " in f.field:  # index findings: "weight_map -> shard"
        out.add(f.field.split(" -> ")[1])
    return out


def verdict(report) -> str:
    sev = {f.severity.value for f in report.findings}
    return "error" if "error" in sev else "warning" if "warning" in sev else "pass"


@pytest.mark.parametrize(("case", "target", "expected", "about"), _cases())
def test_case_verdict(case, target, expected, about):
    r = verify_folder(SHARED_CASES / case, to_target(target))
    shown = [(f.severity.value, f.code, f.file, f.field) for f in r.findings if f.severity.value != "info"]
    assert verdict(r) == expected, shown
    if about and expected in ("error", "warning"):
        hits = [f for f in r.findings if f.severity.value == expected and about in abouts(f)]
        assert hits, (about, shown)
    if about and expected == "error":
        stray = [f for f in r.errors if about not in abouts(f)]
        assert not stray, [(f.code, f.file, f.field) for f in stray]


@pytest.mark.parametrize("case", [p.values[0] for p in _cases()
                                  if "findings" in json.loads((SHARED_CASES / p.values[0] / "EXPECTED.json").read_text())])
def test_case_listed_findings(case):
    exp = json.loads((SHARED_CASES / case / "EXPECTED.json").read_text())
    r = verify_folder(SHARED_CASES / case, to_target(exp["target"]))
    for want in exp["findings"]:
        sev = "info" if want["verdict"] == "info" else want["verdict"]
        assert any(f.severity.value == sev and want["about"] in abouts(f) for f in r.findings), want


def test_c07_missing_tensors_named():
    r = verify_folder(SHARED_CASES / "C07-index-missing-shard")
    assert [f.code for f in r.errors] == ["safetensors.index.missing_shard"]
    assert r.errors[0].value == ["lm_head.weight", "model.layers.0.mlp.down_proj.weight",
                                 "model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight"]


def test_c07b_names_fifteen_shards():
    r = verify_folder(SHARED_CASES / "C07b-index-30-shards-15-present")
    assert [f.field for f in r.errors] == [f"weight_map -> model-{i:05d}-of-00030.safetensors" for i in range(16, 31)]


def test_c15_lists_valid_sizes():
    r = verify_folder(SHARED_CASES / "C15-heads-vs-tp", Target(tensor_parallel_size=8))
    assert [f.code for f in r.errors] == ["parallelism.heads_not_divisible"]
    assert "valid sizes: 1, 2, 4, 28" in r.errors[0].message


def test_c14_group_size_names_per_rank_slice():
    r = verify_folder(SHARED_CASES / "C14-group-size-vs-tp", Target(tensor_parallel_size=2))
    assert [(f.code, f.field, f.value) for f in r.errors] == [
        ("parallelism.quant_group_not_divisible", "intermediate_size", 384)]
    assert "192 per rank" in r.errors[0].message and "valid sizes: 1;" in r.errors[0].message + ";"


def test_c01_fix_names_both_ids():
    r = verify_folder(SHARED_CASES / "C01-llama3-eot-not-stop", Target(serve="chat"))
    (f,) = r.errors
    assert f.code == "tokenizer.stop_tokens.missing_turn_terminator"
    assert f.value == 254 and "[254, 255]" in f.fix and "<|eot_id|> (id 255)" in f.message


def test_c05_derived_limit():
    r = verify_folder(SHARED_CASES / "C05-max-len-over-derived", Target(max_model_len=131072))
    assert [(f.code, f.field, f.value) for f in r.errors] == [
        ("config.max_len.exceeds_derived", "max_position_embeddings", 8192)]
    assert [f.code for f in r.findings if f.severity.value == "info"] == ["config.max_len.stray_model_max_length",
                                                                        "tokenizer.pad_token.missing"]


def test_cli_exit_codes_on_cases():
    bad = run_cli("verify", str(SHARED_CASES / "C07-index-missing-shard"))
    assert bad.returncode == 1
    assert "model-00002-of-00002.safetensors" in bad.stdout and "lm_head.weight" in bad.stdout
    good = run_cli("verify", str(SHARED_CASES / "B-healthy"))
    assert good.returncode == 0, good.stderr
    assert "PASS" in good.stdout
    rope = run_cli("verify", str(SHARED_CASES / "C04-rope-llama3-old-runtime"), "--vllm-version", "0.4.0")
    assert rope.returncode == 1 and "0.5.3.post1" in rope.stdout


def test_cli_verify_lists_findings_on_stdout_errors_first_then_the_verdict():
    """C01 reports an info before its error; the human output lists the error first, on stdout, and
    ends with the verdict on one line (not wrapped when piped)."""
    case = SHARED_CASES / "C01-llama3-eot-not-stop"
    r = run_cli("verify", str(case))
    lines = r.stdout.splitlines()
    severities = [ln.split()[0] for ln in lines if ln[:1] not in (" ", "") and ln.split()[0] in ("error", "warning", "info")]
    assert r.returncode == 1
    assert severities == sorted(severities, key=["error", "warning", "info"].index) and severities[0] == "error"
    assert lines[-1].startswith(f"FAIL {case}: ") and lines[-1].endswith(" warnings")
