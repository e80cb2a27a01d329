"""verify --runtime local: the runtime venv's vLLM judges what it decides at startup (real vLLM, no mocks).

Fixtures are built by code: a bare-backbone export (``LlamaModel``, no LM head, as AutoModel saves it) and
a folder whose generation_config.json caps every answer (max_new_tokens 256)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from modelyard.checks import Target
from modelyard.settings import Settings
from modelyard.stages.verify import verify_folder
from modelyard.stages.verify.runtime import reconcile, runtime_findings
from tests.conftest import ROOT, json_result, run_cli
from tests.fixtures import make_tiny_llama

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    import torch
    from transformers import LlamaConfig, LlamaModel

    base = tmp_path_factory.mktemp("oracle")
    capped = make_tiny_llama(base / "capped", hidden=128, intermediate=256)
    gen = json.loads((capped / "generation_config.json").read_text())
    gen["max_new_tokens"] = 256
    (capped / "generation_config.json").write_text(json.dumps(gen))
    backbone = make_tiny_llama(base / "backbone", hidden=128, intermediate=256)
    cfg = LlamaConfig.from_pretrained(str(backbone))
    cfg.architectures = ["LlamaModel"]
    for p in backbone.glob("*.safetensors"):
        p.unlink()
    LlamaModel(cfg).to(torch.bfloat16).save_pretrained(str(backbone), safe_serialization=True)
    return {"capped": capped, "backbone": backbone}


def test_cli_runtime_local_json(folders):
    r = run_cli("verify", str(folders["capped"]), "--runtime", "local", "--json", timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    rep = json_result(r.stdout, "verify")
    runtime = {f["code"]: f for f in rep["findings"] if f["code"].startswith("runtime.")}
    assert runtime["runtime.sampling.max_tokens_default"]["value"] == 256
    assert runtime["runtime.sampling.max_tokens_default"]["severity"] == "warning"
    assert runtime["runtime.model_config.resolved"]["value"] == {
        "max_model_len": 256, "dtype": "bfloat16", "quantization": None, "runner_type": "generate",
        "resolved_architecture": "LlamaForCausalLM"}
    assert re.match(r"vLLM 0\.32\.0 ModelConfig\.get_diff_sampling_param",
                    runtime["runtime.sampling.max_tokens_default"]["source"])
    # the hand rule and the runtime agree here: no disagreement is reported
    assert not [c for c in runtime if c.startswith("runtime.disagrees.")]


def test_ingest_asks_the_runtime_when_it_exists(folders, tmp_path):
    """ingest's verify includes the oracle's findings by default (MODELYARD_VERIFY_RUNTIME=auto)."""
    home = tmp_path / "store"
    r = run_cli("ingest", f"file://{folders['capped']}", "--no-smoke", "--json", "--out", str(home),
                env={"MODELYARD_VERIFY_RUNTIME": "auto", "MODELYARD_HOME": str(home)}, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    art = json_result(r.stdout, "ingest")["artifact"]
    report = json.loads((Path(art) / "report.json").read_text())
    got = {f["code"]: f["value"] for f in report["findings"] if f["code"].startswith("runtime.")}
    assert got["runtime.sampling.max_tokens_default"] == 256
    assert got["runtime.model_config.resolved"]["max_model_len"] == 256


def test_backbone_runtime_and_hand_rule(folders):
    r = verify_folder(folders["backbone"], Target(serve="chat"), runtime="local", settings=Settings())
    codes = [(f.code, f.severity.value) for f in r.findings if f.code.startswith(("runtime.architecture", "architecture."))]
    assert codes == [("architecture.no_lm_head", "error"), ("runtime.architecture.pooling_class", "warning")]
    pool = next(f for f in r.findings if f.code == "runtime.architecture.pooling_class")
    assert pool.value == ["LlamaModel"] and pool.field == "architectures"


def test_max_model_len_refusal_names_derived_length(folders):
    r = verify_folder(folders["capped"], Target(max_model_len=4096), runtime="local", settings=Settings())
    refused = [f for f in r.findings if f.code == "runtime.model_config.max_model_len_refused"]
    assert [(f.severity.value, f.value, f.field) for f in refused] == [("error", 256, "max_position_embeddings")]
    assert "--max-model-len 256" in refused[0].fix
    assert [f.code for f in r.errors] == ["config.max_len.exceeds_derived", "runtime.model_config.max_model_len_refused"]


def test_reconcile_names_the_side_that_fired():
    from modelyard.checks import Finding, Severity

    hand = [Finding("config.generation_config.max_new_tokens", Severity.WARNING, "m")]
    got = reconcile(hand, [], "0.32.0")
    assert [(f.code, f.value) for f in got] == [("runtime.disagrees.config.generation_config.max_new_tokens",
                                                 {"hand": ["config.generation_config.max_new_tokens"], "runtime": []})]
    assert reconcile(hand, [Finding("runtime.sampling.max_tokens_default", Severity.WARNING, "m")], "0.32.0") == []


def test_unavailable_runtime_is_a_warning_not_a_pass():
    from modelyard.stages.verify.runtime import RuntimeAnswer

    got = runtime_findings(RuntimeAnswer(raw={"ok": False, "error": "ImportError: no vllm"}, wall_seconds=0.1),
                           Target())
    assert [(f.code, f.severity.value, f.value) for f in got] == [("runtime.unavailable", "warning", "ImportError: no vllm")]


@pytest.mark.timeout(1560)  # its own subprocess may take 1500 s
def test_differential_sample():
    """The CI sample of benchmarks/differential.py: 6 mutants, each loaded by the real vLLM (~11 s each here;
    the whole set runs in the benchmark)."""
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "differential.py"), "--limit", "6"],
                       capture_output=True, text=True, timeout=1500, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    last = r.stdout.strip().splitlines()[-1]
    m = re.fullmatch(r"agreement: (\d+)/(\d+)", last)
    assert m, r.stdout[-2000:]
    a, n = int(m.group(1)), int(m.group(2))
    assert n >= 4 and a >= n - 1, r.stdout[-3000:]
