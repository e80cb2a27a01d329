"""serve/vllm.yaml against the real `vllm serve` argument parser of the runtime venv (no model is loaded).

The runtime's own ``serve`` subparser is built (``vllm.entrypoints.cli.serve``), every key of the
generated file must be one of its ``--options``, and ``vllm serve --config serve/vllm.yaml`` must parse
into the planned values (vLLM's ``FlexibleArgumentParser`` expands the file the way the CLI does).
"""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from modelyard.settings import Settings
from modelyard.stages.serve import ServeTarget, plan_serve
from modelyard.stages.serve.files import write_serve_files
from tests.unit.test_serve_plan import llama_dir

pytestmark = pytest.mark.vllm

PARSE = r"""
import json, sys
from vllm.utils.argparse_utils import FlexibleArgumentParser
import vllm.entrypoints.cli.serve as serve
parser = FlexibleArgumentParser()
sub = parser.add_subparsers(dest="subparser")
[cmd] = [c for c in serve.cmd_init() if c.name == "serve"]
sp = cmd.subparser_init(sub)
opts = sorted(k for k in sp._option_string_actions if k.startswith("--"))
args = parser.parse_args(["serve", "--config", sys.argv[1]])
keys = ("model", "served_model_name", "tensor_parallel_size", "max_model_len", "max_num_seqs",
        "gpu_memory_utilization", "dtype", "kv_cache_dtype", "generation_config")
print(json.dumps({"options": opts, "args": {k: getattr(args, k, None) for k in keys}}))
"""


@pytest.mark.parametrize("kv", ["auto", "fp8"])
def test_vllm_yaml_keys_are_real_serve_options(tmp_path, kv):
    python = Settings().vllm_interpreter()
    if not python.exists():
        pytest.skip(f"no vLLM runtime at {python}")
    model = llama_dir(tmp_path, "70b")
    art = tmp_path / "art"
    art.mkdir()
    plan = plan_serve(model, ServeTarget("H100-80GB", gpus=4, kv_cache_dtype=kv), name="llama-70b")
    files = write_serve_files(art, plan, model=str(model))
    cfg = yaml.safe_load(files.vllm_yaml.read_text())
    r = subprocess.run([str(python), "-c", PARSE, str(files.vllm_yaml)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    unknown = [k for k in cfg if f"--{k}" not in out["options"]]
    assert not unknown, f"not vllm serve options: {unknown}"
    a = out["args"]
    assert a["model"] == str(model)
    assert a["served_model_name"] in (["llama-70b"], "llama-70b")
    assert (a["tensor_parallel_size"], a["max_model_len"], a["max_num_seqs"]) == (4, plan.max_model_len,
                                                                                  plan.max_num_seqs)
    assert a["gpu_memory_utilization"] == 0.9 and a["dtype"] == "bfloat16" and a["generation_config"] == "auto"
    assert a["kv_cache_dtype"] == ("fp8" if kv == "fp8" else "auto")


def test_multinode_vllm_yaml_keys_are_real_serve_options(tmp_path):
    """The 405B plan on 2 x 8 x H100-80GB: pipeline-parallel-size and distributed-executor-backend parse too."""
    python = Settings().vllm_interpreter()
    model = llama_dir(tmp_path, "405b")
    art = tmp_path / "art"
    art.mkdir()
    plan = plan_serve(model, ServeTarget("H100-80GB", gpus=8, nodes=2), name="llama-405b")
    files = write_serve_files(art, plan, model=str(model))
    cfg = yaml.safe_load(files.vllm_yaml.read_text())
    script = PARSE.replace('"generation_config")', '"generation_config", "pipeline_parallel_size", '
                                                  '"distributed_executor_backend")')
    r = subprocess.run([str(python), "-c", script, str(files.vllm_yaml)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert [k for k in cfg if f"--{k}" not in out["options"]] == []
    a = out["args"]
    assert (a["tensor_parallel_size"], a["pipeline_parallel_size"], a["distributed_executor_backend"]) == (8, 2, "ray")


def test_lora_vllm_yaml_of_two_adapters_parses(tmp_path):
    """`serve-plan BASE --lora A --lora B`'s vllm.yaml through vLLM's own parser: lora-modules become two
    LoRAModulePath (name, path relative to the folder vllm runs from), max-loras 2, max-lora-rank 32."""
    from modelyard.stages.adapter import lora_overrides
    from tests.fixtures import make_tiny_llama
    from tests.unit.test_adapter import make_adapter

    python = Settings().vllm_interpreter()
    base = make_tiny_llama(tmp_path / "tiny")
    a, b = make_adapter(base, tmp_path / "a", r=8), make_adapter(base, tmp_path / "b", r=24)
    plan = plan_serve(base, ServeTarget("H100-80GB"), name="tiny")
    files = write_serve_files(tmp_path / "out", plan, overrides=lora_overrides(
        [("lora-a", a, "adapters/lora-a"), ("lora-b", b, "adapters/lora-b")]), adapters_mount="../adapters")
    script = PARSE.replace('"generation_config")', '"generation_config", "enable_lora", "max_loras", "max_lora_rank")')
    script = script.replace("print(json.dumps({", "print(json.dumps({'lora': [[m.name, m.path] for m in args.lora_modules], ")
    r = subprocess.run([str(python), "-c", script, str(files.vllm_yaml)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert [k for k in yaml.safe_load(files.vllm_yaml.read_text()) if f"--{k}" not in out["options"]] == []
    assert out["lora"] == [["lora-a", "adapters/lora-a"], ["lora-b", "adapters/lora-b"]]
    assert (out["args"]["model"], out["args"]["enable_lora"], out["args"]["max_loras"], out["args"]["max_lora_rank"]) \
        == ("model", True, 2, 32)
