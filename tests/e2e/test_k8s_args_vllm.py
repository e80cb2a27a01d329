"""serve/k8s runs the same vLLM as serve/vllm.yaml: the container args of deployment.yaml and
inferenceservice.yaml, parsed by the real `vllm serve` parser of the runtime venv (no model is loaded),
give the same value for every key as `vllm serve --config serve/vllm.yaml`."""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from modelyard.settings import Settings
from modelyard.stages.serve import ServeTarget, plan_serve
from modelyard.stages.serve.files import write_serve_files
from modelyard.stages.serve.k8s import write_k8s_files
from tests.unit.test_serve_plan import llama_dir

pytestmark = pytest.mark.vllm

PARSE = r"""
import json, sys
from vllm.utils.argparse_utils import FlexibleArgumentParser
import vllm.entrypoints.cli.serve as serve
parser = FlexibleArgumentParser()
sub = parser.add_subparsers(dest="subparser")
[cmd] = [c for c in serve.cmd_init() if c.name == "serve"]
cmd.subparser_init(sub)
out = {}
for name, argv in json.loads(sys.argv[1]).items():
    args = parser.parse_args(["serve", *argv])
    if getattr(args, "model_tag", None) is not None:  # what ServeSubcommand.cmd does with the positional model
        args.model = args.model_tag
    out[name] = vars(args)
print(json.dumps(out, default=str))
"""


def test_k8s_container_args_parse_like_vllm_yaml(tmp_path):
    python = Settings().vllm_interpreter()
    assert python.exists(), f"no vLLM runtime at {python}: `make setup` builds it"
    model = llama_dir(tmp_path, "70b")
    plan = plan_serve(model, ServeTarget("H100-80GB", gpus=4, kv_cache_dtype="fp8"), name="llama-70b")
    sf = write_serve_files(tmp_path, plan, model="/mnt/models")
    cfg = yaml.safe_load(sf.vllm_yaml.read_text())
    kf = write_k8s_files(tmp_path, plan, cfg, model_bytes=1, storage="s3://models/llama-70b/v1")
    dep = yaml.safe_load(kf.deployment.read_text())["spec"]["template"]["spec"]["containers"][0]
    isvc = yaml.safe_load(kf.inferenceservice.read_text())["spec"]["predictor"]["containers"][0]
    runs = {"config": ["--config", str(sf.vllm_yaml)], "deployment": dep["args"], "kserve": isvc["args"]}
    r = subprocess.run([str(python), "-c", PARSE, json.dumps(runs)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    parsed = json.loads(r.stdout.strip().splitlines()[-1])
    keys = [k.replace("-", "_") for k in cfg]
    assert len(keys) == 9 and "kv_cache_dtype" in keys
    want = {k: parsed["config"][k] for k in keys}
    assert want["model"] == "/mnt/models" and want["tensor_parallel_size"] == 4 and want["kv_cache_dtype"] == "fp8"
    for name in ("deployment", "kserve"):
        assert {k: parsed[name][k] for k in keys} == want, name
    assert (parsed["deployment"]["port"], parsed["kserve"]["port"]) == (8000, 8080)
