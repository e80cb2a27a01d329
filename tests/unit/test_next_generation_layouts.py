"""Healthy next-generation layouts the verifier once refused: a Gemma-3-style multimodal checkpoint in the
hub's layout (``language_model.model.*``, ``vision_tower.vision_model.*``: transformers' loader renames them
to ``model.language_model.*`` / ``model.vision_tower.*``) and a DeepSeek-V3-style checkpoint with its
multi-token-prediction layer (``model.layers.<num_hidden_layers>.*``: vLLM's DeepSeek loader and
transformers' ``_keys_to_ignore_on_load_unexpected`` skip it). vLLM loads both; verify must pass both and
still name a tensor that is really missing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from modelyard.stages.verify import verify_folder
from tests.fixtures import VOCAB, write_wordlevel_tokenizer


def _rewrite(d: Path, fn) -> None:
    tensors = load_file(str(d / "model.safetensors"))
    save_file(fn(tensors), str(d / "model.safetensors"), metadata={"format": "pt"})


def make_gemma3_multimodal(out: Path, *, hub_nesting: bool = True) -> Path:
    """A tiny Gemma3ForConditionalGeneration (2 text layers, 1 SigLIP layer) as transformers saves it, with
    ``hub_nesting`` its tower renamed to the layout the hub's Gemma-3 checkpoints store."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    torch.manual_seed(0)
    cfg = Gemma3Config(
        text_config={"vocab_size": len(VOCAB), "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                     "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                     "max_position_embeddings": 256, "sliding_window": 64, "bos_token_id": 1, "eos_token_id": 2},
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
                       "image_size": 28, "patch_size": 14},
        mm_tokens_per_image=1, image_token_index=127, boi_token_index=126, eoi_token_index=125)
    Gemma3ForConditionalGeneration(cfg).to(torch.bfloat16).save_pretrained(str(out), safe_serialization=True)
    # transformers 5 writes the hub's layout back (language_model.model.*, vision_tower.*,
    # multi_modal_projector.*); the hub's own checkpoints nest the tower once more (vision_tower.vision_model.*)
    if hub_nesting:
        _rewrite(out, lambda t: {("vision_tower.vision_model." + k[len("vision_tower."):]
                                  if k.startswith("vision_tower.") else k): v for k, v in t.items()})
    write_wordlevel_tokenizer(out)
    return out


def make_deepseek_v3_mtp(out: Path) -> Path:
    """A tiny DeepseekV3ForCausalLM (layer 0 dense, layer 1 MoE with 4 routed experts) plus the
    multi-token-prediction layer 2 (``num_nextn_predict_layers: 1``) as DeepSeek ships it: a copy of the last
    decoder layer with ``enorm``, ``hnorm``, ``eh_proj``, ``embed_tokens`` and ``shared_head``."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(0)
    cfg = DeepseekV3Config(vocab_size=len(VOCAB), hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                           num_hidden_layers=2, first_k_dense_replace=1, n_routed_experts=4, n_shared_experts=1,
                           num_experts_per_tok=2, n_group=1, topk_group=1, num_attention_heads=4,
                           num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8,
                           qk_nope_head_dim=16, v_head_dim=16, max_position_embeddings=256, bos_token_id=1,
                           eos_token_id=2, tie_word_embeddings=False)
    DeepseekV3ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(str(out), safe_serialization=True)

    def add_mtp(tensors):
        for name in [n for n in tensors if n.startswith("model.layers.1.")]:
            tensors["model.layers.2." + name[len("model.layers.1."):]] = tensors[name].clone()
        h = 64
        tensors["model.layers.2.enorm.weight"] = torch.ones(h, dtype=torch.bfloat16)
        tensors["model.layers.2.hnorm.weight"] = torch.ones(h, dtype=torch.bfloat16)
        tensors["model.layers.2.eh_proj.weight"] = torch.zeros(h, 2 * h, dtype=torch.bfloat16)
        tensors["model.layers.2.embed_tokens.weight"] = tensors["model.embed_tokens.weight"].clone()
        tensors["model.layers.2.shared_head.norm.weight"] = torch.ones(h, dtype=torch.bfloat16)
        tensors["model.layers.2.shared_head.head.weight"] = tensors["lm_head.weight"].clone()
        return tensors

    _rewrite(out, add_mtp)
    cfg_path = out / "config.json"
    data = json.loads(cfg_path.read_text())
    data["num_nextn_predict_layers"] = 1
    # as DeepSeek-V3's config.json says: vLLM creates the router's e_score_correction_bias only for
    # topk_method "noaux_tc" (its dry load refuses the tensor otherwise; transformers always creates it)
    data["topk_method"] = "noaux_tc"
    cfg_path.write_text(json.dumps(data, indent=2))
    write_wordlevel_tokenizer(out)
    return out


def _architecture(report, severity=None):
    return [(f.code, f.severity.value) for f in report.findings if f.code.startswith("architecture.")
            and (severity is None or f.severity.value == severity)]


def test_gemma3_multimodal_in_hub_layout_passes(tmp_path):
    d = make_gemma3_multimodal(tmp_path / "gemma3")
    assert any(k.startswith("vision_tower.vision_model.") for k in load_file(str(d / "model.safetensors")))
    r = verify_folder(d)
    assert _architecture(r, "error") == []
    assert [f.code for f in r.errors] == []


def test_gemma3_multimodal_missing_text_tensor_is_named_in_the_hub_layout(tmp_path):
    d = make_gemma3_multimodal(tmp_path / "gemma3")
    _rewrite(d, lambda t: {k: v for k, v in t.items() if k != "language_model.model.layers.1.mlp.up_proj.weight"})
    r = verify_folder(d)
    assert [(f.code, f.value) for f in r.errors] == [
        ("architecture.missing_tensors", ["model.language_model.layers.1.mlp.up_proj.weight"])]


def test_deepseek_v3_with_mtp_layer_passes_and_says_the_layer_is_skipped(tmp_path):
    d = make_deepseek_v3_mtp(tmp_path / "dsv3")
    mtp = [k for k in load_file(str(d / "model.safetensors")) if k.startswith("model.layers.2.")]
    r = verify_folder(d)
    assert [f.code for f in r.errors] == []
    spec = [f for f in r.findings if f.code == "architecture.speculative_layers"]
    assert [(f.severity.value, f.value) for f in spec] == [("info", len(mtp))]
    assert len(mtp) == 26 + 6  # a copy of layer 1 (MoE), and the six MTP-only tensors


@pytest.mark.parametrize("dropped", ["model.layers.1.mlp.experts.3.down_proj.weight",
                                     "model.layers.1.self_attn.kv_a_proj_with_mqa.weight"])
def test_deepseek_v3_missing_tensor_is_still_an_error(tmp_path, dropped):
    d = make_deepseek_v3_mtp(tmp_path / "dsv3")
    _rewrite(d, lambda t: {k: v for k, v in t.items() if k != dropped})
    r = verify_folder(d)
    assert [(f.code, f.value) for f in r.errors] == [("architecture.missing_tensors", [dropped])]
