"""Healthy quantized checkpoints verify clean, dense and MoE, in every layout modelyard writes or loads.

Each fixture is built by code (``tests.fixtures.make_quantized_fixture``): the tiny Llama or the tiny
Qwen3-MoE with every ``*_proj`` Linear (each expert's included) stored the way GPTQ (gptqmodel), AutoAWQ GEMM
and compressed-tensors (llm-compressor) save it, the router and ``lm_head`` dense, and the tool's own
``quantization_config``. The broken twins change one tensor and must give exactly one error code.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from modelyard.checks import Target
from modelyard.stages.verify import verify_folder
from tests.fixtures import QUANT_FIXTURE_SCHEMES, make_quantized_fixture, quantization_config_for

#: the tensor that stands in for ``<module>.weight`` in each layout (vLLM's loaders key on it).
PRIMARY = {"gptq": "qweight", "awq": "qweight", "w4a16": "weight_packed", "w4a16-asym": "weight_packed",
           "w8a8": "weight", "fp8-dynamic": "weight", "nvfp4": "weight_packed", "nvfp4a16": "weight_packed"}
CASES = [(s, moe) for s in QUANT_FIXTURE_SCHEMES for moe in (False, True)]
IDS = [f"{s}-{'moe' if moe else 'dense'}" for s, moe in CASES]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[tuple[str, bool], Path]:
    """Every (scheme, moe) fixture, built once for the module (read-only copies are made per mutant)."""
    root = tmp_path_factory.mktemp("quantized-fixtures")
    return {(s, moe): make_quantized_fixture(root / f"{s}-{int(moe)}", s, moe) for s, moe in CASES}


def codes(report) -> list[tuple[str, str]]:
    """``[(code, severity)]`` of every finding, info included."""
    return [(f.code, f.severity.value) for f in report.findings]


def mutant(src: Path, dst: Path, fn) -> Path:
    """A copy of ``src`` whose weights went through ``fn(tensors)``."""
    dst.mkdir()
    for p in src.iterdir():
        (dst / p.name).write_bytes(p.read_bytes())
    tensors = load_file(str(dst / "model.safetensors"))
    fn(tensors)
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def module(moe: bool) -> str:
    """The Linear the twins break: the last expert's down_proj (MoE) or the last layer's down_proj."""
    return "model.layers.1.mlp.experts.3.down_proj" if moe else "model.layers.1.mlp.down_proj"


@pytest.mark.parametrize(("scheme", "moe"), CASES, ids=IDS)
def test_healthy_quantized_checkpoint_verifies_clean(built, scheme, moe):
    d = built[(scheme, moe)]
    tensors = load_file(str(d / "model.safetensors"))
    primary = f"{module(moe)}.{PRIMARY[scheme]}"
    assert primary in tensors and "lm_head.weight" in tensors
    if moe:  # the layout of public MoE releases: per-expert quantized tensors, the router left dense
        assert tensors["model.layers.0.mlp.gate.weight"].dtype in (torch.bfloat16, torch.float16)
        assert f"model.layers.0.mlp.experts.0.gate_proj.{PRIMARY[scheme]}" in tensors
    assert codes(verify_folder(d, Target(serve="chat"))) == []


@pytest.mark.parametrize(("scheme", "moe"), CASES, ids=IDS)
def test_missing_quantized_tensor_is_an_error(built, tmp_path, scheme, moe):
    """One expert's (or layer's) primary tensor gone, its scales left: vLLM would keep that weight
    uninitialised (it skips the check for quantized models) and answer garbage."""
    name = module(moe)
    d = mutant(built[(scheme, moe)], tmp_path / "m", lambda t: t.pop(f"{name}.{PRIMARY[scheme]}"))
    r = verify_folder(d, Target(serve="chat"))
    assert [(f.code, f.severity.value, f.field) for f in r.findings] == [
        ("architecture.missing_tensors", "error", f"{name}.weight")]


@pytest.mark.parametrize(("scheme", "moe"), CASES, ids=IDS)
def test_wrong_packed_shape_is_an_error(built, tmp_path, scheme, moe):
    """The primary tensor twice as wide on its last axis (a packing along the wrong axis or bit width)."""
    key = f"{module(moe)}.{PRIMARY[scheme]}"

    def widen(t):
        t[key] = torch.cat([t[key], t[key]], dim=-1)

    r = verify_folder(mutant(built[(scheme, moe)], tmp_path / "m", widen), Target(serve="chat"))
    assert [(f.code, f.severity.value, f.field) for f in r.findings] == [
        ("architecture.shape_mismatch", "error", key)]


@pytest.mark.parametrize("scheme", QUANT_FIXTURE_SCHEMES)
def test_expert_past_num_experts_is_unexpected(built, tmp_path, scheme):
    """An expert index the config does not have (a checkpoint of a larger sibling): vLLM's expert mapping
    has no parameter for it (KeyError in load_weights)."""
    src = "model.layers.0.mlp.experts.3.up_proj."

    def extra(t):
        for k in [k for k in t if k.startswith(src)]:
            t[k.replace("experts.3.", "experts.4.")] = t[k].clone()

    r = verify_folder(mutant(built[(scheme, True)], tmp_path / "m", extra), Target(serve="chat"))
    assert [(f.code, f.severity.value) for f in r.findings] == [("architecture.unexpected_tensors", "error")]
    assert r.findings[0].value[0].startswith("model.layers.0.mlp.experts.4.up_proj.")


@pytest.mark.parametrize("scheme", [s for s in QUANT_FIXTURE_SCHEMES if s not in ("gptq", "awq")])
def test_compressed_tensors_config_is_what_the_library_dumps(scheme):
    """The fixture's quantization_config round-trips through compressed-tensors' own ``QuantizationConfig``
    (the model llm-compressor serializes), and its top-level keys are the ones ``update_config`` writes."""
    ct = pytest.importorskip("compressed_tensors.quantization")
    qc = quantization_config_for(scheme, ["lm_head"])
    core = {k: v for k, v in qc.items() if k not in ("version", "quant_method", "sparsity_config", "transform_config")}
    dumped = json.loads(json.dumps(ct.QuantizationConfig.model_validate(core).model_dump(exclude=["quant_method"]),
                                   default=str))
    assert dumped == core


def test_stacked_experts_unfold_to_the_per_expert_tensors_of_the_checkpoint():
    """transformers 5 Qwen3-MoE: ``experts.gate_up_proj`` (experts, 2*moe_intermediate, hidden) comes from each
    expert's gate_proj then up_proj (moe_intermediate, hidden); ``down_proj`` from each expert's down_proj."""
    from modelyard.checks.architecture import Fusion, _conversion

    _, fusions = _conversion("qwen3_moe")
    gate_up = next(f for f in fusions if f.targets == ("mlp.experts.gate_up_proj",))
    parts = gate_up.unfold("model.layers.0.mlp.experts.gate_up_proj", (4, 64, 64))
    assert parts == {f"model.layers.0.mlp.experts.{e}.{p}_proj.weight": (32, 64)
                     for p in ("gate", "up") for e in range(4)}
    odd = Fusion(("attn.qkv",), ("attn.q_proj", "attn.k_proj"), (("Chunk", 0),))
    assert odd.unfold("model.attn.q_proj", (8, 8)) is None  # not a stack over experts: compared by name only


def test_fusions_that_cannot_unfold_accept_their_sources_by_dense_name():
    from modelyard.checks.architecture import Fusion, _unfold_fused

    transpose = Fusion(("mlp.experts.gate_up_proj",), ("mlp.experts.gate_up_proj",), (("Transpose", None),))
    expected, opaque = _unfold_fused({"model.layers.0.mlp.experts.gate_up_proj": (4, 8, 8), "model.norm.weight": (8,)},
                                     [transpose])
    assert expected == {"model.norm.weight": (8,)} and opaque == [transpose]
    assert transpose.matches("model.layers.0.mlp.experts.gate_up_proj")
    assert not transpose.matches("model.layers.0.mlp.experts.gate_up_proj_bias")
