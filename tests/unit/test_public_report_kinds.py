"""The defect kinds from public reports, each rebuilt by code with a fixed twin (exact codes and severities).

Kinds: a LoRA adapter folder passed as a model; a bare backbone (``LlamaModel``, no LM head); a second weight
set beside indexed shards; a chat template that rejects a system message; generation_config
``max_new_tokens``; a quantized ``lm_head`` (version-gated); a tokenizer eos that is not a configured eos;
a config without ``head_dim`` whose shapes disagree; a non-silu activation on a silu-only vLLM family."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from modelyard.checks import Target
from modelyard.stages.verify import verify_folder
from tests.fixtures import make_quantized_fixture, make_tiny_llama


def _codes(report, *, at_least: str = "warning") -> list[tuple[str, str]]:
    keep = {"warning": ("warning", "error"), "info": ("info", "warning", "error")}[at_least]
    return [(f.code, f.severity.value) for f in report.findings if f.severity.value in keep]


def _edit(path: Path, **kv) -> None:
    doc = json.loads(path.read_text())
    for k, v in kv.items():
        if v is None:
            doc.pop(k, None)
        else:
            doc[k] = v
    path.write_text(json.dumps(doc))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp("kinds") / "tiny")


@pytest.fixture
def copy(tiny, tmp_path):
    def make(name: str = "m") -> Path:
        return Path(shutil.copytree(tiny, tmp_path / name))
    return make


def test_healthy_twin_is_clean(tiny):
    assert _codes(verify_folder(tiny, Target(serve="chat"))) == []


def test_lora_adapter_folder(copy):
    d = copy()
    (d / "config.json").unlink()
    (d / "model.safetensors").rename(d / "adapter_model.safetensors")
    (d / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "base_model_name_or_path": "org/base",
                                                       "r": 8, "target_modules": ["q_proj"]}))
    r = verify_folder(d)
    assert [c for c in _codes(r) if c[1] == "error"] == [("files.lora_adapter", "error")]
    f = next(f for f in r.findings if f.code == "files.lora_adapter")
    assert f.file == "adapter_config.json" and f.value == "org/base" and "--base" in f.fix


def test_bare_backbone(copy):
    import torch
    from transformers import LlamaConfig, LlamaModel

    d = copy()
    cfg = LlamaConfig.from_pretrained(str(d))
    cfg.architectures = ["LlamaModel"]
    (d / "model.safetensors").unlink()
    LlamaModel(cfg).to(torch.bfloat16).save_pretrained(str(d), safe_serialization=True)
    r = verify_folder(d)
    assert [c for c in _codes(r) if c[1] == "error"] == [("architecture.no_lm_head", "error")]
    assert "LlamaForCausalLM" in r.errors[0].fix


def test_second_weight_set_beside_indexed_shards(tmp_path):
    d = make_tiny_llama(tmp_path / "sharded", shards=2)
    fixed = _codes(verify_folder(d))
    from safetensors.torch import load_file, save_file

    t = {}
    for p in sorted(d.glob("model-*.safetensors")):
        t.update(load_file(str(p)))
    save_file(t, str(d / "consolidated.safetensors"))
    assert fixed == []
    assert _codes(verify_folder(d)) == [("safetensors.index.duplicate_weight_set", "warning")]


def test_template_rejects_system(copy):
    d = copy()
    tpl = ("{% if messages[0]['role'] == 'system' %}{{ raise_exception('no system') }}{% endif %}"
           "{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> {% endfor %}"
           "{% if add_generation_prompt %}<|im_start|> assistant {% endif %}")
    _edit(d / "tokenizer_config.json", chat_template=tpl)
    (d / "chat_template.jinja").unlink(missing_ok=True)
    assert _codes(verify_folder(d, Target(serve="chat"))) == [("tokenizer.chat_template.no_system_role", "warning")]
    assert _codes(verify_folder(d, Target(serve="completion"))) == []


def test_generation_config_caps_answers(copy):
    d = copy()
    _edit(d / "generation_config.json", max_new_tokens=256)
    r = verify_folder(d)
    assert _codes(r) == [("config.generation_config.max_new_tokens", "warning")]
    assert r.findings[0].value == 256 and "(the context is 256)" in r.findings[0].message


@pytest.mark.parametrize(("vllm", "want"), [(None, ("quantization.lm_head.quantized", "warning")),
                                            ("0.10.2", ("quantization.lm_head.unsupported", "error")),
                                            ("0.32.0", ("quantization.lm_head.quantized", "warning"))])
def test_quantized_lm_head(tmp_path, vllm, want):
    d = make_quantized_fixture(tmp_path / "w4", "w4a16", moe=False)
    assert _codes(verify_folder(d, Target(vllm_version=vllm))) == []  # the twin: lm_head ignored, dense
    from safetensors.torch import load_file, save_file

    t = load_file(str(d / "model.safetensors"))
    head = t.pop("lm_head.weight")
    out_f, in_f = head.shape
    import torch

    t["lm_head.weight_packed"] = torch.zeros(out_f, in_f // 8, dtype=torch.int32)
    t["lm_head.weight_scale"] = torch.ones(out_f, in_f // 32, dtype=torch.bfloat16)
    t["lm_head.weight_shape"] = torch.tensor([out_f, in_f], dtype=torch.int32)
    save_file(t, str(d / "model.safetensors"))
    cfg = json.loads((d / "config.json").read_text())
    cfg["quantization_config"]["ignore"] = []
    (d / "config.json").write_text(json.dumps(cfg))
    assert want in _codes(verify_folder(d, Target(vllm_version=vllm)))


def test_tokenizer_eos_disagrees(copy):
    d = copy()
    _edit(d / "tokenizer_config.json", eos_token="<s>")
    r = verify_folder(d)
    assert _codes(r) == [("tokenizer.eos_token.disagrees", "warning")]
    assert r.findings[-1].value == "<s>" and "'<|im_end|>' (id 2)" in r.findings[-1].fix


def test_missing_head_dim_named_in_fix(tmp_path):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    d = make_tiny_llama(tmp_path / "hd", hidden=128, intermediate=256)
    cfg = LlamaConfig.from_pretrained(str(d))
    cfg.head_dim = 64
    (d / "model.safetensors").unlink()
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(str(d), safe_serialization=True)
    assert _codes(verify_folder(d)) == []  # the twin: head_dim 64 stated
    _edit(d / "config.json", head_dim=None)
    r = verify_folder(d)
    assert [f.code for f in r.errors] == ["architecture.shape_mismatch"]
    assert r.errors[0].fix.startswith("config.json has no head_dim, so the runtime uses hidden_size / "
                                      "num_attention_heads = 32, but the stored attention projections imply head_dim 64")


def test_non_silu_activation_on_llama(copy):
    d = copy()
    _edit(d / "config.json", hidden_act="gelu")
    assert _codes(verify_folder(d)) == [("config.hidden_act.unsupported", "error")]
