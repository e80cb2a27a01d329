"""Tiny model folders built by code (never copied from ../shared).

``make_tiny_llama(dir)`` writes a real transformers checkpoint: a 2-layer Llama (hidden 64 unless
``hidden``/``intermediate`` say otherwise; quantization tests use 128/256 so group 128 fits) with random weights
(seeded), a WordLevel tokenizer with a ChatML-style template whose turn terminator is ``<|im_end|>``
(id 2, the eos), config, generation config. About 120 KB.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

VOCAB = ["<unk>", "<s>", "<|im_end|>", "<|im_start|>"] + [f"w{i}" for i in range(124)]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> {% endfor %}"
    "{% if add_generation_prompt %}<|im_start|> assistant {% endif %}"
)


def make_tiny_llama(out: Path, *, layers: int = 2, shards: int = 1, seed: int = 0, hidden: int = 64,
                    intermediate: int = 128, max_shard_size: str | None = None) -> Path:
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(VOCAB), hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    kw = {"max_shard_size": max_shard_size or "40KB"} if shards > 1 or max_shard_size else {}
    model.save_pretrained(str(out), safe_serialization=True, **kw)
    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(VOCAB)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="<|im_end|>", unk_token="<unk>",
                                   pad_token="<unk>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))
    return out


def write_safetensors(path: Path, header: dict, data: bytes, header_len: int | None = None) -> Path:
    """Write raw safetensors bytes: 8-byte LE length (``header_len`` overrides it), JSON, ``data``."""
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if header_len is None else header_len) + raw + data)
    return path


def write_awq_like(d: Path, *, group_size: int, bits: int = 4, out_pack_wrong: bool = False) -> Path:
    """Turn the tiny Llama in ``d`` into AutoAWQ GEMM layout (header shapes are what matter; values
    are zeros): each linear ``(out, in)`` becomes ``qweight`` (in, out*bits/32) I32, ``qzeros``
    (in/group, out*bits/32) I32 and ``scales`` (in/group, out) F16; everything else F16.
    ``out_pack_wrong`` packs down_proj twice as wide, as a broken export would."""
    import torch
    from safetensors.torch import load_file, save_file

    dense = load_file(str(d / "model.safetensors"))
    pack = 32 // bits
    out: dict[str, object] = {}
    for name, t in dense.items():
        if name.endswith("_proj.weight"):
            base = name[: -len(".weight")]
            o, i = t.shape
            width = o // pack * (2 if out_pack_wrong and "down_proj" in name else 1)
            out[f"{base}.qweight"] = torch.zeros(i, width, dtype=torch.int32)
            out[f"{base}.qzeros"] = torch.zeros(i // group_size, o // pack, dtype=torch.int32)
            out[f"{base}.scales"] = torch.zeros(i // group_size, o, dtype=torch.float16)
        else:
            out[name] = t.to(torch.float16)
    save_file(out, str(d / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((d / "config.json").read_text())
    cfg["dtype"] = "float16"
    cfg["quantization_config"] = {"quant_method": "awq", "bits": bits, "group_size": group_size, "version": "gemm",
                                  "zero_point": True}
    (d / "config.json").write_text(json.dumps(cfg, indent=2))
    return d
