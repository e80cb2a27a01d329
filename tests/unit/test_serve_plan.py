"""The serve plan (pipeline/serve.py) and the serve/ files (pipeline/serve_files.py).

Shapes are the real Llama 3.1 configs (written here, no weights): exact parameter counts, weight bytes,
KV bytes per token, per-rank numbers and the TP sizes vLLM accepts.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from modelyard.cli import app
from modelyard.errors import InvalidTargetError, ServePlanError
from modelyard.model.checkpoint import Checkpoint
from modelyard.stages.serve import OVERHEAD_BYTES, ServeTarget, kv_bytes_per_token, llama_param_count, plan_serve
from modelyard.stages.serve.files import compose_config, vllm_config, write_serve_files
from modelyard.stages.serve.gpus import GIB, MIB, gpu_spec, spec_for_smi_name

LLAMA31 = {
    "8b": dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
               intermediate_size=14336),
    "70b": dict(hidden_size=8192, num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
                intermediate_size=28672),
    "405b": dict(hidden_size=16384, num_hidden_layers=126, num_attention_heads=128, num_key_value_heads=8,
                 intermediate_size=53248),
}
H100 = 81559 * MIB  # nvidia-smi memory.total of an H100 80GB


def llama_dir(tmp: Path, size: str, **extra) -> Path:
    d = tmp / f"Llama-3.1-{size.upper()}"
    d.mkdir(parents=True, exist_ok=True)
    cfg = dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=128256,
               max_position_embeddings=131072, rope_theta=500000.0,
               rope_scaling=dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                 original_max_position_embeddings=8192, rope_type="llama3"),
               torch_dtype="bfloat16", tie_word_embeddings=False, rms_norm_eps=1e-5, **LLAMA31[size])
    cfg.update(extra)
    (d / "config.json").write_text(json.dumps(cfg))
    return d


@pytest.fixture(scope="module")
def llamas(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("llamas")
    return {s: llama_dir(tmp, s) for s in LLAMA31}


@pytest.mark.parametrize(("size", "params"), [("8b", 8_030_261_248), ("70b", 70_553_706_496),
                                              ("405b", 405_853_388_800)])
def test_param_count_and_weight_bytes(llamas, size, params):
    cfg = json.loads((llamas[size] / "config.json").read_text())
    assert llama_param_count(cfg) == params
    plan = plan_serve(llamas[size], ServeTarget("H200-141GB", gpus=8))
    assert plan.param_count == params
    assert plan.weight_bytes == 2 * params
    assert plan.weight_source.startswith("config estimate (no weights)")


def test_tied_embeddings_drop_lm_head(tmp_path):
    cfg = json.loads((llama_dir(tmp_path, "8b") / "config.json").read_text())
    assert llama_param_count(cfg | {"tie_word_embeddings": True}) == 8_030_261_248 - 128256 * 4096


def test_kv_bytes_per_token():
    assert kv_bytes_per_token(32, 8, 128, 2) == 2 * 32 * 8 * 128 * 2 == 131072  # 8B bf16
    assert kv_bytes_per_token(80, 8, 128, 2) == 327680  # 70B
    assert kv_bytes_per_token(126, 8, 128, 2) == 516096  # 405B
    assert kv_bytes_per_token(80, 8, 128, 2, tp=4) == 81920  # 2 KV heads per rank
    # tp > KV heads: vLLM replicates, each rank keeps 1 head (not 8/16)
    assert kv_bytes_per_token(80, 8, 128, 2, tp=8) == kv_bytes_per_token(80, 8, 128, 2, tp=16) == 40960
    assert kv_bytes_per_token(32, 8, 128, 1) == 65536  # fp8 KV


def test_llama_8b_on_one_h100(llamas):
    p = plan_serve(llamas["8b"], ServeTarget("H100-80GB"))
    assert p.gpu_memory_bytes == H100 == 85_520_809_984
    assert p.tensor_parallel_size == 1
    assert p.valid_tp_sizes == (1, 2, 4, 8, 16, 32)
    assert p.weight_bytes_per_rank == 16_060_522_496
    assert p.usable_bytes_per_rank == int(H100 * 0.9) == 76_968_728_985
    assert p.kv_budget_bytes_per_rank == 76_968_728_985 - 16_060_522_496 - OVERHEAD_BYTES == 57_686_981_017
    assert p.kv_bytes_per_token == p.kv_bytes_per_token_per_rank == 131072
    assert p.tokens_fit == 57_686_981_017 // 131072 == 440_116
    assert p.derived_max_len == 131072 and p.max_model_len == 131072  # llama3 rope: not multiplied
    assert p.max_num_seqs == 440_116 // 2048 == 214


def test_llama_70b_on_four_h100(llamas):
    p = plan_serve(llamas["70b"], ServeTarget("H100-80GB", gpus=4))
    assert p.tensor_parallel_size == 4
    assert p.valid_tp_sizes == (1, 2, 4, 8, 16, 32, 64)
    assert p.weight_bytes == 141_107_412_992
    assert p.weight_bytes_per_rank == 141_107_412_992 // 4 == 35_276_853_248
    assert p.kv_heads_per_rank == 2
    assert p.kv_bytes_per_token == 327680 and p.kv_bytes_per_token_per_rank == 81920
    assert p.kv_budget_bytes_per_rank == 76_968_728_985 - 35_276_853_248 - OVERHEAD_BYTES
    assert p.tokens_fit == 469_612
    assert (p.max_model_len, p.max_num_seqs) == (131072, 229)


def test_llama_70b_on_two_h100_shortens_the_context(llamas):
    p = plan_serve(llamas["70b"], ServeTarget("H100-80GB", gpus=2))
    assert p.weight_bytes_per_rank == 70_553_706_496
    assert p.tokens_fit == (76_968_728_985 - 70_553_706_496 - OVERHEAD_BYTES) // 163840 == 19_493
    assert p.max_model_len == 19_456  # rounded down to a multiple of 1024
    assert p.max_num_seqs == 9
    assert any("max_model_len 19,456" in n for n in p.notes)


def test_llama_405b_bf16_on_eight_h200(llamas):
    p = plan_serve(llamas["405b"], ServeTarget("H200-141GB", gpus=8))
    assert p.weight_bytes == 811_706_777_600
    assert p.weight_bytes_per_rank == 101_463_347_200
    assert p.kv_heads_per_rank == 1
    assert p.kv_bytes_per_token_per_rank == 64512
    assert p.tokens_fit == (int(143771 * MIB * 0.9) - 101_463_347_200 - OVERHEAD_BYTES) // 64512 == 480_449


def test_refuses_405b_bf16_on_one_h100(llamas):
    with pytest.raises(ServePlanError) as e:
        plan_serve(llamas["405b"], ServeTarget("H100-80GB", gpus=1))
    msg, fix = e.value.message, e.value.fix
    assert "1 x H100-80GB" in msg
    assert "755.96 GiB of weights" in msg and "71.68 GiB is usable" in msg  # need vs have
    assert "--gpus 16" in fix  # bf16 needs 16 ranks (tp 16 is valid for 128 heads / 8 KV heads)
    assert "fp8 variant" in fix and "--gpus 8" in fix
    assert e.value.exit_code == 2


def test_refuses_a_context_that_does_not_fit(llamas):
    with pytest.raises(ServePlanError) as e:
        plan_serve(llamas["8b"], ServeTarget("L4-24GB", max_model_len=131072))
    assert "18,736 tokens" in e.value.message and "131,072-token sequence" in e.value.message
    assert "--gpus 2" in e.value.fix


def test_kv_fp8_doubles_tokens(llamas):
    p = plan_serve(llamas["8b"], ServeTarget("L4-24GB", kv_cache_dtype="fp8", max_model_len=32768))
    assert p.kv_bytes_per_token == 65536 and p.kv_dtype_bytes == 1
    assert p.tokens_fit == (int(23034 * MIB * 0.9) - 16_060_522_496 - OVERHEAD_BYTES) // 65536 == 37_473
    assert vllm_config(p)["kv-cache-dtype"] == "fp8"


def test_tp_rules_follow_vllm(tmp_path, llamas):
    # Qwen2.5-7B shape: 28 heads, 4 KV heads, intermediate 18944: vLLM accepts TP 1, 2, 4 only
    q = llama_dir(tmp_path, "8b", hidden_size=3584, num_attention_heads=28, num_key_value_heads=4,
                  intermediate_size=18944, num_hidden_layers=28, vocab_size=152064)
    assert plan_serve(q, ServeTarget("A100-80GB", gpus=8)).valid_tp_sizes == (1, 2, 4)
    assert plan_serve(q, ServeTarget("A100-80GB", gpus=8)).tensor_parallel_size == 4
    with pytest.raises(InvalidTargetError, match="28 attention heads do not split evenly over 8"):
        plan_serve(q, ServeTarget("A100-80GB", gpus=8, tensor_parallel_size=8))
    with pytest.raises(InvalidTargetError, match="needs 8 GPUs"):
        plan_serve(llamas["8b"], ServeTarget("H100-80GB", gpus=4, tensor_parallel_size=8))
    p = plan_serve(llamas["8b"], ServeTarget("H100-80GB", gpus=6))
    assert p.tensor_parallel_size == 4 and "2 stay idle" in p.notes[0]


def test_bad_targets(llamas):
    with pytest.raises(InvalidTargetError, match="unknown GPU"):
        plan_serve(llamas["8b"], ServeTarget("V100-16GB"))
    with pytest.raises(InvalidTargetError, match="exceeds the 131072 tokens"):
        plan_serve(llamas["8b"], ServeTarget("H100-80GB", max_model_len=200_000))


def test_gpu_table():
    assert gpu_spec("h100").name == "H100-80GB" and gpu_spec("H100-NVL").memory_bytes == 95830 * MIB
    assert gpu_spec("MI300X").compute_capability is None and gpu_spec("MI300X").fp8
    assert not gpu_spec("A100-40GB").fp8 and gpu_spec("L40S").fp8
    assert spec_for_smi_name("NVIDIA H100 NVL").name == "H100-94GB"
    assert spec_for_smi_name("NVIDIA A100 80GB PCIe", 81920 * MIB).name == "A100-80GB"
    assert spec_for_smi_name("Tesla T4") is None


def test_weights_from_safetensors_headers(tiny_llama_dir):
    ckpt = Checkpoint(tiny_llama_dir)
    p = plan_serve(ckpt, ServeTarget("L4-24GB"))
    assert p.weight_source.startswith("safetensors headers")
    assert p.weight_bytes == sum(t.end - t.begin for t in ckpt.tensors.values())
    assert p.weight_bytes == 2 * llama_param_count(ckpt.config)  # the estimate agrees with the stored bytes
    assert p.param_count is None
    assert p.max_model_len == 256  # the tiny model's own limit
    assert p.kv_bytes_per_token == 2 * 2 * 2 * 16 * 2


def test_quantized_or_moe_config_without_weights_is_refused(tmp_path):
    d = llama_dir(tmp_path, "8b", quantization_config={"quant_method": "fp8"})
    with pytest.raises(ServePlanError, match="quantized"):
        plan_serve(d, ServeTarget("H100-80GB"))


# ---- serve/ files -------------------------------------------------------------------------------

@pytest.fixture()
def artifact(tmp_path, llamas) -> Path:
    a = tmp_path / "llama-3.1-70b" / "rev1"
    (a / "model").mkdir(parents=True)
    shutil.copy(llamas["70b"] / "config.json", a / "model" / "config.json")
    (a / "manifest.json").write_text(json.dumps({"name": "llama-3.1-70b"}))
    return a


def test_vllm_yaml(artifact):
    plan = plan_serve(artifact, ServeTarget("H100-80GB", gpus=4))
    files = write_serve_files(artifact, plan)
    cfg = yaml.safe_load(files.vllm_yaml.read_text())
    assert cfg == {"model": "model", "served-model-name": "llama-3.1-70b", "tensor-parallel-size": 4,
                   "max-model-len": 131072, "max-num-seqs": 229, "gpu-memory-utilization": 0.9, "dtype": "bfloat16",
                   "generation-config": "auto"}
    # CPU overrides: None removes a key
    cpu = vllm_config(plan, model="/m", overrides={"gpu-memory-utilization": None, "max-model-len": 2048,
                                                   "tensor-parallel-size": 1})
    assert "gpu-memory-utilization" not in cpu and cpu["max-model-len"] == 2048 and cpu["model"] == "/m"
    readme = files.readme.read_text()
    assert "| KV bytes per token | 327,680 |" in readme and "4 x H100-80GB" in readme
    assert files.nginx_conf is None and not (files.dir / "nginx.conf").exists()


def test_compose_yaml(artifact):
    plan = plan_serve(artifact, ServeTarget("H100-80GB", gpus=4))
    doc = yaml.safe_load(write_serve_files(artifact, plan).compose_yaml.read_text())
    assert doc == compose_config(plan)
    svc = doc["services"]["vllm"]
    assert svc["image"].startswith("vllm/vllm-openai:")
    assert svc["deploy"]["resources"]["reservations"]["devices"] == [
        {"driver": "nvidia", "count": 4, "capabilities": ["gpu"]}]
    assert svc["ipc"] == "host"
    assert "../model:/artifact/model:ro" in svc["volumes"]
    assert svc["command"][svc["command"].index("--served-model-name") + 1] == "llama-3.1-70b"
    test = svc["healthcheck"]["test"]
    body = json.loads(test[-1])
    assert body["max_tokens"] == 1 and body["model"] == "llama-3.1-70b" and body["messages"]
    assert "/v1/chat/completions" in test[-2]


def test_proxy_files(artifact):
    plan = plan_serve(artifact, ServeTarget("H100-80GB", gpus=4))
    files = write_serve_files(artifact, plan, proxy=True)
    conf = files.nginx_conf.read_text()
    for directive in ("proxy_buffering off;", "proxy_cache off;", "proxy_http_version 1.1;",
                      "proxy_read_timeout 3600s;", "include /run/secrets/api_keys;", "return 401"):
        assert directive in conf
    assert "Bearer " not in conf.split("map $http_authorization")[1].split("}")[0].replace('"Bearer <key>"', "")
    doc = yaml.safe_load(files.compose_yaml.read_text())
    assert "ports" not in doc["services"]["vllm"] and doc["services"]["nginx"]["ports"] == ["8080:8080"]
    assert doc["secrets"] == {"api_keys": {"file": "./api_keys.map"}}
    assert "openssl rand" in files.readme.read_text()


@pytest.mark.parametrize("proxy", [False, True])
def test_compose_validates_with_docker_compose(artifact, proxy):
    """`docker-compose config` (Debian docker-compose 1.29.2) validates the file against the Compose
    schema without a Docker engine."""
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.skip("docker-compose is not installed (make test installs it)")
    plan = plan_serve(artifact, ServeTarget("H100-80GB", gpus=4))
    files = write_serve_files(artifact, plan, proxy=proxy)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DOCKER_")}
    r = subprocess.run([exe, "-f", str(files.compose_yaml), "config"], capture_output=True, text=True, env=env,
                       timeout=120, cwd=files.dir)
    assert r.returncode == 0, r.stderr
    rendered = yaml.safe_load(r.stdout)
    assert rendered["services"]["vllm"]["deploy"]["resources"]["reservations"]["devices"][0]["count"] == 4
    # an invalid key is caught: the validator is real
    bad = files.dir / "bad.yaml"
    bad.write_text(files.compose_yaml.read_text().replace("ipc: host", "ipc: host\n    gpus_typo: 1"))
    r = subprocess.run([exe, "-f", str(bad), "config"], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode != 0 and "gpus_typo" in (r.stderr + r.stdout)


# ---- CLI -----------------------------------------------------------------------------------------

def test_cli_serve_plan(artifact):
    r = CliRunner().invoke(app, ["serve-plan", str(artifact), "--gpu", "H100-80GB", "--gpus", "4", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["tensor_parallel_size"] == 4 and d["kv_bytes_per_token"] == 327680
    assert d["serve_dir"] == str(artifact / "serve") and (artifact / "serve" / "compose.yaml").is_file()
    r = CliRunner().invoke(app, ["serve-plan", str(artifact), "--gpu", "H100-80GB", "--gpus", "4", "--no-write"])
    assert r.exit_code == 0 and "tokens that fit" in r.stdout


def test_cli_serve_plan_refusal_exits_2(llamas):
    r = CliRunner().invoke(app, ["serve-plan", str(llamas["405b"]), "--gpu", "H100-80GB", "--json"])
    assert r.exit_code == 2
    d = json.loads(r.stdout)
    assert d["error"] == "ServePlanError" and "--gpus 16" in d["fix"]
    r = CliRunner().invoke(app, ["serve-plan", str(llamas["8b"]), "--gpu", "V100"])
    assert r.exit_code == 2


def test_overhead_is_three_gib():
    assert OVERHEAD_BYTES == 3 * GIB
