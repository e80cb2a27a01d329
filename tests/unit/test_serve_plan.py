"""The serve plan (pipeline/serve.py) and the serve/ files (pipeline/serve_files.py).

Shapes are the real Llama 3.1 configs (written here, no weights): exact parameter counts, weight bytes,
KV bytes per token, per-rank numbers and the TP sizes vLLM accepts.
"""

from __future__ import annotations

import dataclasses
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
from tests.conftest import json_error, json_result

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
    # bf16 needs 16 ranks: two nodes of 8 (TP 8 inside each, PP 2 across), not TP 16 across nodes
    assert fix.startswith("use --gpus-per-node 8 --nodes 2 (tensor parallel 8 inside each node x pipeline parallel 2 "
                          "across nodes = 16 x H100-80GB, served through Ray)")
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
    # the label names the GPUs the ranks use, as the compose file reserves them
    assert (p.gpus_used_per_node, p.target_label()) == (4, "4 of 6 x H100-80GB")
    assert compose_config(p)["services"]["vllm"]["deploy"]["resources"]["reservations"]["devices"][0]["count"] == 4
    assert plan_serve(llamas["8b"], ServeTarget("H100-80GB", gpus=4)).target_label() == "4 x H100-80GB"


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
    d = json_result(r.stdout, "serve-plan")
    assert d["tensor_parallel_size"] == 4 and d["kv_bytes_per_token"] == 327680
    assert d["serve_dir"] is None and not (artifact / "serve").exists()  # an artifact is never rewritten by default
    r = CliRunner().invoke(app, ["serve-plan", str(artifact), "--gpu", "H100-80GB", "--gpus", "4", "-o", str(artifact),
                                 "--json"])
    assert r.exit_code == 0, r.output
    d = json_result(r.stdout, "serve-plan")
    assert d["serve_dir"] == str(artifact / "serve") and (artifact / "serve" / "compose.yaml").is_file()
    r = CliRunner().invoke(app, ["serve-plan", str(artifact), "--gpu", "H100-80GB", "--gpus", "4", "--no-write"])
    assert r.exit_code == 0 and "tokens that fit" in r.stdout


def test_cli_serve_plan_refusal_exits_2(llamas):
    r = CliRunner().invoke(app, ["serve-plan", str(llamas["405b"]), "--gpu", "H100-80GB", "--json"])
    assert r.exit_code == 2
    d = json_error(r.stdout, "serve-plan", 2)
    assert d["type"] == "ServePlanError" and "--gpus-per-node 8 --nodes 2" in d["fix"]
    r = CliRunner().invoke(app, ["serve-plan", str(llamas["8b"]), "--gpu", "V100"])
    assert r.exit_code == 2


def test_overhead_is_three_gib():
    assert OVERHEAD_BYTES == 3 * GIB


# ---- multi-node: tensor parallel inside a node, pipeline parallel across nodes ------------------

def test_stage_layers_follow_vllm_get_pp_indices():
    from modelyard.stages.serve.sizing import stage_layers

    # vLLM 0.32 get_pp_indices: the remainder goes to the stages before the last
    assert stage_layers(126, 2) == (63, 63)
    assert stage_layers(126, 4) == (31, 32, 32, 31)
    assert stage_layers(7, 4) == (2, 2, 2, 1) and stage_layers(5, 4) == (1, 1, 2, 1)


def test_llama_405b_on_two_nodes_of_eight_h100(llamas):
    p = plan_serve(llamas["405b"], ServeTarget("H100-80GB", gpus=8, nodes=2))
    assert (p.nodes, p.tensor_parallel_size, p.pipeline_parallel_size, p.world_size) == (2, 8, 2, 16)
    assert p.layers_per_stage == (63, 63) and p.multi_node and p.target_label() == "2 x 8 x H100-80GB"
    # stage 1: 63 layers + final norm + lm_head (stage 0: 63 layers + embeddings, 16,384 x 2 B lighter)
    embed = 128256 * 16384 * 2
    layer = (811_706_777_600 - 2 * embed - 16384 * 2) // 126
    assert p.worst_stage == 1
    assert p.weight_bytes_per_rank == -(-(63 * layer + 16384 * 2 + embed) // 8) == 50_731_675_648
    assert p.kv_bytes_per_token_per_rank == 2 * 63 * 1 * 128 * 2 == 32256
    assert p.kv_budget_bytes_per_rank == 76_968_728_985 - 50_731_675_648 - OVERHEAD_BYTES == 23_015_827_865
    assert p.tokens_fit == 23_015_827_865 // 32256 == 713_536
    assert (p.max_model_len, p.max_num_seqs, p.notes) == (131072, 256, ())
    assert ("pipeline_parallel_size", "2", "2 node(s); layers per stage 63/63") in p.rows()


def test_refuses_405b_on_one_node_of_eight_h100_naming_the_smallest_plan(llamas):
    with pytest.raises(ServePlanError) as e:
        plan_serve(llamas["405b"], ServeTarget("H100-80GB", gpus=8, nodes=1))
    assert "94.50 GiB of weights" in e.value.message and "71.68 GiB is usable" in e.value.message
    assert e.value.fix.startswith("use --gpus-per-node 8 --nodes 2 (tensor parallel 8 inside each node x pipeline "
                                  "parallel 2 across nodes = 16 x H100-80GB, served through Ray)")
    # on nodes of 8 L4s it takes 6 nodes (47.25 GiB of weights per rank on 2 is more than an L4 holds)
    with pytest.raises(ServePlanError) as e:
        plan_serve(llamas["405b"], ServeTarget("L4-24GB", gpus=8, nodes=2))
    assert "in pipeline stage 1" in e.value.message
    assert e.value.fix.startswith("use --gpus-per-node 8 --nodes 6 (tensor parallel 8 inside each node x pipeline "
                                  "parallel 6 across nodes = 48 x L4-24GB")


def test_8b_stays_on_one_node(llamas):
    one = plan_serve(llamas["8b"], ServeTarget("H100-80GB", gpus=8))
    p = plan_serve(llamas["8b"], ServeTarget("H100-80GB", gpus=8, nodes=2))
    assert (p.nodes, p.pipeline_parallel_size, p.tensor_parallel_size, p.nodes_available) == (1, 1, 8, 2)
    assert not p.multi_node and p.tokens_fit == one.tokens_fit and p.layers_per_stage == (32,)
    assert p.notes == ("2 nodes offered, 1 used: the model and its context fit one node; run the other 1 node(s) "
                       "as replicas behind a load balancer",)


def test_fewest_nodes_that_hold_the_full_context(llamas):
    # 70B on nodes of 2 H100: one node holds only 19,493 tokens (< 131,072), two nodes hold the full context
    p = plan_serve(llamas["70b"], ServeTarget("H100-80GB", gpus=2, nodes=4))
    assert (p.nodes, p.tensor_parallel_size, p.pipeline_parallel_size, p.layers_per_stage) == (2, 2, 2, (40, 40))
    assert p.tokens_fit == 469_612 and p.max_model_len == 131072


def test_stage_bytes_from_safetensors_headers(tiny_llama_dir):
    from modelyard.stages.serve.sizing import model_size

    size = model_size(Checkpoint(tiny_llama_dir))
    layer = 128 + 3 * 16384 + 128 + 4096 + 8192 + 8192 + 4096  # norms, MLP, q/k/v/o of one layer
    assert size.layer_bytes == (layer, layer) and (size.head_bytes, size.tail_bytes) == (16384, 16384 + 128)
    assert size.stage_weight_bytes(2) == (layer + 16384, layer + 16384 + 128)
    assert sum(size.stage_weight_bytes(2)) == size.weight_bytes
    tied = dataclasses.replace(size, tied_embedding_bytes=16384)  # the last stage builds its own embedding
    assert tied.stage_weight_bytes(2)[1] == layer + 16384 + 128 + 16384


def test_pipeline_size_checks(llamas, tiny_llama_dir):
    with pytest.raises(InvalidTargetError, match="the model has 2 decoder layers"):
        plan_serve(tiny_llama_dir, ServeTarget("L4-24GB", gpus=1, nodes=4, pipeline_parallel_size=3))
    with pytest.raises(InvalidTargetError, match="needs 16 GPUs"):
        plan_serve(llamas["8b"], ServeTarget("H100-80GB", gpus=8, nodes=1, tensor_parallel_size=8,
                                             pipeline_parallel_size=2))
    with pytest.raises(InvalidTargetError, match="per node"):
        plan_serve(llamas["8b"], ServeTarget("H100-80GB", gpus=4, nodes=2, tensor_parallel_size=8))
    p = plan_serve(tiny_llama_dir, ServeTarget("L4-24GB", gpus=1, nodes=2, tensor_parallel_size=1,
                                               pipeline_parallel_size=2))
    assert (p.nodes, p.pipeline_parallel_size, p.layers_per_stage) == (2, 2, (1, 1))


def test_multinode_serve_files(artifact):
    plan = plan_serve(artifact, ServeTarget("H100-80GB", gpus=2, nodes=2))
    files = write_serve_files(artifact, plan)
    cfg = yaml.safe_load(files.vllm_yaml.read_text())
    assert cfg["tensor-parallel-size"] == 2 and cfg["pipeline-parallel-size"] == 2
    assert cfg["distributed-executor-backend"] == "ray"
    assert [p.name for p in files.ray_scripts] == ["ray-head.sh", "ray-worker.sh", "serve.sh"]
    for p in files.ray_scripts:
        assert p.stat().st_mode & 0o111 and subprocess.run(["bash", "-n", str(p)]).returncode == 0
    head, worker, serve = (p.read_text() for p in files.ray_scripts)
    assert 'ray start --head --port="$RAY_PORT"' in head and '--num-gpus="${RAY_NUM_GPUS:-2}"' in head
    assert 'ray start --address="$HEAD_ADDRESS"' in worker and "VLLM_HOST_IP" in worker
    assert "--distributed-executor-backend ray" in serve and "' 2 4 \"${RAY_DEVICE:-GPU}\"" in serve
    compose = yaml.safe_load(files.compose_yaml.read_text())
    node = compose["services"]["ray-node"]
    assert node["network_mode"] == "host" and node["deploy"]["resources"]["reservations"]["devices"][0]["count"] == 2
    assert "## Multi-node (Ray)" in files.readme.read_text()
    # re-planned on one node: the scripts go, compose runs vLLM again
    one = write_serve_files(artifact, plan_serve(artifact, ServeTarget("H100-80GB", gpus=4)))
    assert one.ray_scripts == () and not (one.dir / "serve.sh").exists()
    assert "vllm" in yaml.safe_load(one.compose_yaml.read_text())["services"]


def test_multinode_compose_validates_with_docker_compose(artifact):
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.skip("docker-compose is not installed (make test installs it)")
    files = write_serve_files(artifact, plan_serve(artifact, ServeTarget("H100-80GB", gpus=2, nodes=2)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("DOCKER_")} | {"NODE_IP": "10.0.0.2",
                                                                                  "RAY_ROLE": "worker"}
    r = subprocess.run([exe, "-f", str(files.compose_yaml), "config"], capture_output=True, text=True, env=env,
                       timeout=120, cwd=files.dir)
    assert r.returncode == 0, r.stderr
    node = yaml.safe_load(r.stdout)["services"]["ray-node"]
    assert node["environment"]["RAY_ROLE"] == "worker" and node["environment"]["NODE_IP"] == "10.0.0.2"
    # `config` prints the entrypoint re-escaped ($$): the container's shell, not compose, expands RAY_ROLE
    assert node["entrypoint"] == ["bash", "-c", 'exec "serve/ray-$${RAY_ROLE}.sh" --block']


def test_cli_serve_plan_multinode(llamas, tmp_path):
    r = CliRunner().invoke(app, ["serve-plan", str(llamas["405b"]), "--gpu", "H100-80GB", "--gpus-per-node", "8",
                                 "--nodes", "2", "-o", str(tmp_path), "--json"])
    assert r.exit_code == 0, r.output
    d = json_result(r.stdout, "serve-plan")
    assert (d["nodes"], d["tensor_parallel_size"], d["pipeline_parallel_size"], d["tokens_fit"]) == (2, 8, 2, 713_536)
    assert (tmp_path / "serve" / "ray-head.sh").is_file()
    r = CliRunner().invoke(app, ["serve-plan", str(llamas["405b"]), "--gpu", "H100-80GB", "--gpus-per-node", "8",
                                 "--nodes", "1", "--no-write"])
    assert r.exit_code == 2


def test_serve_plan_output_of_a_bare_checkpoint_names_the_model_relative_to_the_folder(llamas, tmp_path):
    """serve/ written apart from the model is copied to other hosts: no file carries the planning host's
    model path; vLLM is given model/ of the folder holding serve/, which is what the multi-node compose
    file mounts at /artifact/model (MODEL_DIR overrides the host side)."""
    src = llamas["405b"]
    out = tmp_path / "plan"
    r = CliRunner().invoke(app, ["serve-plan", str(src), "--gpu", "H100-80GB", "--gpus-per-node", "8",
                                 "--nodes", "2", "-o", str(out), "--json"])
    assert r.exit_code == 0, r.output
    notes = json_result(r.stdout, "serve-plan")["notes"]
    assert f"{out}/model is missing: serve/ runs the model at DIR/model" in notes[-1]
    written = sorted(p.name for p in (out / "serve").iterdir())
    assert written == ["README.md", "alerts.yml", "compose.yaml", "grafana-dashboard.json", "prometheus.yml", "ray-head.sh",
                       "ray-worker.sh", "serve.sh", "vllm.yaml"]
    for p in (out / "serve").iterdir():
        assert str(src.resolve()) not in p.read_text() and str(src) not in p.read_text(), p.name
    assert yaml.safe_load((out / "serve" / "vllm.yaml").read_text())["model"] == "model"
    serve_sh = (out / "serve" / "serve.sh").read_text()
    assert 'cd "$(dirname "$0")/.."' in serve_sh and '--config "${VLLM_CONFIG:-serve/vllm.yaml}"' in serve_sh
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.skip("docker-compose is not installed (make test installs it)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DOCKER_", "MODEL_DIR"))} | {"NODE_IP": "10.0.0.2"}
    for extra, host in (({}, str(out / "model")), ({"MODEL_DIR": "/srv/models/llama"}, "/srv/models/llama")):
        c = subprocess.run([exe, "-f", "compose.yaml", "config"], capture_output=True, text=True, env=env | extra,
                           timeout=120, cwd=out / "serve")
        assert c.returncode == 0, c.stderr
        node = yaml.safe_load(c.stdout)["services"]["ray-node"]
        # vLLM runs in working_dir (the artifact root) with vllm.yaml's relative model: that is the mount
        assert node["working_dir"] == "/artifact"
        assert f"{host}:/artifact/model:ro" in node["volumes"]
        assert f"{out / 'serve'}:/artifact/serve:ro" in node["volumes"]


def test_serve_plan_of_a_stored_artifact_by_reference_never_rewrites_it(tiny_llama_dir, tmp_path):
    """``serve-plan NAME@REV`` reads the store as ``show`` does; an artifact in the store is not rewritten
    (its serve/ is what it was published with): the plan is printed, and written only with --output."""
    from tests.unit.test_bundle import _build_artifact

    home = tmp_path / "store"
    art = _build_artifact(tiny_llama_dir, home, hub=False)
    before = {p.relative_to(art): p.read_bytes() for p in art.rglob("*") if p.is_file()}
    rev = json.loads((art / "manifest.json").read_text())["revision"]
    for ref in (f"tiny@{rev}", f"tiny@{rev[:20]}", str(art)):
        r = CliRunner().invoke(app, ["serve-plan", ref, "--store", str(home), "--gpu", "L4-24GB", "--json"])
        assert r.exit_code == 0, r.output
        d = json_result(r.stdout, "serve-plan")
        assert d["serve_dir"] is None
        assert d["notes"][-1] == (f"serve/ not written: {art} is an artifact, never rewritten (its serve/ is the one "
                                  "it was ingested with); pass --output DIR to write this plan")
    # --output inside the store is refused, whichever folder of it
    for inside in (art, art / "model", home, home / "new-folder"):
        r = CliRunner().invoke(app, ["serve-plan", f"tiny@{rev}", "--store", str(home), "--gpu", "L4-24GB",
                                     "-o", str(inside), "--json"])
        err = json_error(r.stdout, "serve-plan", 2)
        assert (err["type"], err["message"]) == ("InvalidTargetError", f"--output {inside} is inside the store, whose "
                                                 "artifacts are never rewritten"), r.stdout
    assert {p.relative_to(art): p.read_bytes() for p in art.rglob("*") if p.is_file()} == before
    assert not (home / "new-folder").exists() and not (home / "serve").exists()
    out = tmp_path / "plan"
    r = CliRunner().invoke(app, ["serve-plan", f"tiny@{rev}", "--store", str(home), "--gpu", "L4-24GB", "-o", str(out),
                                 "--json"])
    assert r.exit_code == 0, r.output
    res = json_result(r.stdout, "serve-plan")
    assert res["serve_dir"] == str(out / "serve")
    # serve/ names model/ of the folder it sits in; the note says where this host's copy is
    assert yaml.safe_load((out / "serve" / "vllm.yaml").read_text())["model"] == "model"
    assert f"(ln -s {art.resolve() / 'model'} {out}/model)" in res["notes"][-1]
    r = CliRunner().invoke(app, ["serve-plan", "nope@123", "--store", str(home), "--gpu", "L4-24GB", "--json"])
    assert json_error(r.stdout, "serve-plan", 2)["type"] == "StoreError"


def test_a_low_memory_utilization_is_named_as_the_way_out(tiny_llama_dir):
    """A plan that fails only because --gpu-memory-utilization is low says so first (the fix once began
    with "or --gpu ...", and never named the utilization)."""
    with pytest.raises(ServePlanError) as e:
        plan_serve(tiny_llama_dir, ServeTarget("L4-24GB", gpu_memory_utilization=0.1))
    assert e.value.fix == "raise --gpu-memory-utilization from 0.1 to 0.9 (vLLM's default); or --gpu A100-40GB."


def test_a_bare_artifact_name_is_read_from_the_default_store(tiny_llama_dir, tmp_path):
    """``serve-plan NAME`` and ``verify NAME`` find the artifact in MODELYARD_HOME as ``show`` and ``bundle``
    do (a fresh user's demo artifact needed NAME@REV or --store before); a name the store lacks says so."""
    from tests.unit.test_bundle import _build_artifact

    home = tmp_path / "store"
    art = _build_artifact(tiny_llama_dir, home, hub=False)
    env = {"MODELYARD_HOME": str(home), "MODELYARD_STORE": ""}
    r = CliRunner().invoke(app, ["serve-plan", "tiny", "--gpu", "L4-24GB", "--json"], env=env)
    assert r.exit_code == 0, r.output
    assert json_result(r.stdout, "serve-plan")["notes"][-1].startswith(f"serve/ not written: {art} is an artifact")
    r = CliRunner().invoke(app, ["verify", "tiny", "--json"], env=env)
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(app, ["verify", "nosuch", "--json"], env=env)
    assert json_error(r.stdout, "verify", 2) == {
        "type": "StoreError", "code": "store_failed", "message": f"the store {home} holds no artifact named 'nosuch'",
        "fix": "Check the name (`modelyard list`) or pass the artifact folder's path."}
