"""Legacy checkpoint formats: GPTQ through gptqmodel, AutoAWQ GEMM through autoawq, each
run for real in its own venv (.venv-gptq, .venv-awq) on the tiny model; outputs verified, loaded
back with transformers for the quality gate, and judged against the runtime table."""

from __future__ import annotations

import json

import pytest

from modelyard.errors import RuntimeNotFoundError
from modelyard.model.checkpoint import Checkpoint
from modelyard.settings import Settings
from modelyard.stages import quantize as q
from modelyard.stages.quantize import compat
from modelyard.stages.verify import verify_folder

SMOLLM2 = {"hidden_size": 576, "num_attention_heads": 9, "intermediate_size": 1536}


@pytest.mark.quantize
@pytest.mark.parametrize("scheme", list(q.LEGACY_SCHEMES))
def test_legacy_format_quantizes_verifies_and_loads_back(legacy_quantized, scheme, tiny128):
    res = legacy_quantized[scheme]
    cfg = json.loads((res.model_dir / "config.json").read_text())
    qc = cfg.pop("quantization_config")
    # The verified parent config travels unchanged; only quantization_config is added.
    assert cfg == json.loads((tiny128 / "config.json").read_text())
    ckpt = Checkpoint(res.model_dir)
    qweight = ckpt.tensors["model.layers.0.self_attn.q_proj.qweight"]
    if scheme == "gptq":
        assert (qc["quant_method"], qc["bits"], qc["group_size"], qc["sym"], qc["desc_act"]) == ("gptq", 4, 128, True, False)
        assert "offload_to_disk_path" not in qc.get("meta", {})
        assert (qweight.dtype, qweight.shape) == ("I32", (16, 128))  # in/8 x out: GPTQ packs along the input
        assert ckpt.tensors["model.layers.0.self_attn.q_proj.g_idx"].shape == (128,)
    else:
        assert (qc["quant_method"], qc["version"], qc["bits"], qc["group_size"], qc["zero_point"]) == ("awq", "gemm", 4, 128, True)
        assert (qweight.dtype, qweight.shape) == ("I32", (128, 16))  # in x out/8: AWQ packs along the output
    assert [f.code for f in verify_folder(res.model_dir).findings if f.severity.value != "info"] == []
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja"):
        assert (res.model_dir / name).read_bytes() == (tiny128 / name).read_bytes()
    assert not (res.model_dir / "quant_log.csv").exists()
    rec = res.record()
    assert rec["backend"] == q.LEGACY_SCHEMES[scheme].backend
    assert rec["recipe"]["source"] == f"modelyard/recipes/{scheme}.yaml"
    assert rec["tools"][{"gptq": "gptqmodel", "awq-gemm": "autoawq"}[scheme]] == {"gptq": "7.6.0", "awq-gemm": "0.2.9"}[scheme]
    assert rec["tools"]["evaluate:transformers"] == "5.24.0"
    # Loaded back with plain transformers through gptqmodel's CPU kernels.
    kernel = {"gptq": "TorchAtenLinear)", "awq-gemm": "TorchAtenAwqLinear)"}[scheme]
    assert rec["loaded_with"].startswith("transformers.AutoModelForCausalLM (") and rec["loaded_with"].endswith(kernel)
    qual = res.quality
    assert qual.tokens == 307 and qual.ppl_parent > 1 and qual.kl_mean >= 0 and qual.passed is True


@pytest.mark.quantize
@pytest.mark.parametrize("scheme,label", [("gptq", "GPTQ-W4"), ("awq-gemm", "AWQ-W4")])
def test_legacy_runtime_gate(legacy_quantized, scheme, label):
    d = legacy_quantized[scheme].model_dir
    assert compat.scheme_label(json.loads((d / "config.json").read_text())["quantization_config"]) == label
    got = [(f.code, f.severity.value, f.field) for f in compat.check_runtime(d, "vllm-cpu-0.32-avx2", Settings())]
    assert got == [("quantization.runtime.unsupported_scheme", "error", "quantization_config.quant_method")]
    assert compat.check_runtime(d, "vllm-cuda-0.32", Settings()) == []


def test_legacy_recipes_fit_the_group_to_the_model():
    for name in q.LEGACY_SCHEMES:
        r = q.make_recipe(name, SMOLLM2)
        assert r.adjustments == ("group_size 128 -> 64: hidden_size 576, num_attention_heads x head_dim 576 is not a multiple of 128",)
        assert "group_size: 64" in r.text


def test_missing_legacy_venv_is_a_clear_error(tiny128, tmp_path, monkeypatch):
    monkeypatch.setenv("MODELYARD_GPTQMODEL_PYTHON", str(tmp_path / "nope" / "python"))
    with pytest.raises(RuntimeNotFoundError) as e:
        q.quantize_model(tiny128, tmp_path / "out", "gptq", num_samples=2, max_seq_len=16, settings=Settings())
    assert str(tmp_path / "nope" / "python") in str(e.value)
    assert e.value.fix == "Run `make setup-legacy` (creates .venv-gptq) or set MODELYARD_GPTQMODEL_PYTHON."
    assert list(tmp_path.iterdir()) == []  # nothing started, nothing left


def test_legacy_recipe_must_name_its_backend(tiny128, tmp_path):
    bad = tmp_path / "r.yaml"
    bad.write_text("quantize_config: {bits: 4, group_size: 128, strategy: group}\n")
    with pytest.raises(q.QuantizeError, match=r"needs 'backend' \(one of gptqmodel, autoawq\)"):
        q.quantize_model(tiny128, tmp_path / "out", "gptq", recipe_file=bad, num_samples=2, max_seq_len=16, settings=Settings())
    other = tmp_path / "o.yaml"
    other.write_text("backend: autoawq\nquantize_config: {bits: 4, group_size: 128, strategy: group}\n")
    with pytest.raises(q.QuantizeError, match="names backend 'autoawq'; scheme gptq uses 'gptqmodel'"):
        q.quantize_model(tiny128, tmp_path / "out", "gptq", recipe_file=other, num_samples=2, max_seq_len=16, settings=Settings())


def test_smoke_root_cause_names_the_worker_exception():
    from modelyard.runtime.vllm_log import root_cause

    log = ("(Worker pid=1) ERROR [multiproc_executor.py:1063]   File \"x.py\", line 447, in apply\n"
           "(Worker pid=1) ERROR [multiproc_executor.py:1063] AttributeError: '_OpNamespace' '_C' object has no attribute 'cpu_gemm_wna16'\n"
           "(EngineCore pid=2) ERROR [core.py:1512] EngineDeadError: EngineCore encountered an issue.\n")
    assert root_cause(log) == "AttributeError: '_OpNamespace' '_C' object has no attribute 'cpu_gemm_wna16'"
    assert root_cause("INFO all fine\n") is None


def test_transformers4_view_keeps_rope_theta_and_dtype(tmp_path, monkeypatch):
    """AutoAWQ runs on transformers 4.51, which ignores the transformers-5 keys: without the rewrite a
    model with rope_theta 500000 would be calibrated with the default 10000."""
    from modelyard.runtime.scripts import legacy_quantize as runner

    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({
        "model_type": "llama", "dtype": "bfloat16",
        "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}))
    (src / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "TokenizersBackend",
                                                           "extra_special_tokens": ["<a>"]}))
    (src / "model.safetensors").write_bytes(b"x")
    monkeypatch.setattr(runner, "_tf_major", lambda: 4)
    view = runner.legacy_view(src, tmp_path / "view")
    cfg = json.loads((view / "config.json").read_text())
    assert cfg == {"model_type": "llama", "torch_dtype": "bfloat16", "rope_theta": 500000.0,
                   "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}
    tc = json.loads((view / "tokenizer_config.json").read_text())
    assert tc == {"tokenizer_class": "PreTrainedTokenizerFast", "additional_special_tokens": ["<a>"]}
    assert (view / "model.safetensors").resolve() == (src / "model.safetensors").resolve()
    assert json.loads((src / "config.json").read_text())["dtype"] == "bfloat16"  # the source is untouched
    monkeypatch.setattr(runner, "_tf_major", lambda: 5)
    assert runner.legacy_view(src, tmp_path / "view5") == src
