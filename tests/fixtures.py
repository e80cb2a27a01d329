"""Tiny model folders built by code (never copied from ../shared).

``make_tiny_llama(dir)`` writes a real transformers checkpoint: a 2-layer Llama (hidden 64 unless
``hidden``/``intermediate`` say otherwise; quantization tests use 128/256 so group 128 fits) with random weights
(seeded), a WordLevel tokenizer with a ChatML-style template whose turn terminator is ``<|im_end|>``
(id 2, the eos), config, generation config. About 120 KB.

``make_tiny_qwen3_moe`` is its MoE sibling (4 experts, dense router); ``make_quantized_fixture(dir, scheme, moe)``
stores either one in each quantized layout modelyard writes or loads (the starting point of quantized mutants);
``make_spm_llama`` and ``make_tiktoken_llama`` carry the other two tokenizer formats (SentencePiece and tiktoken
``tokenizer.model``, no tokenizer.json).
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
                    intermediate: int = 128, max_shard_size: str | None = None, vocab_size: int | None = None,
                    bos_token_id: int = 1, eos_token_id: int = 2, tokenizer: bool = True) -> Path:
    """The tiny Llama (module docstring). ``vocab_size``/``bos_token_id``/``eos_token_id`` and
    ``tokenizer=False`` (no tokenizer files) let the tokenizer-format fixtures bring their own tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab_size or len(VOCAB), hidden_size=hidden, intermediate_size=intermediate,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=256,
                      bos_token_id=bos_token_id, eos_token_id=eos_token_id, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    kw = {"max_shard_size": max_shard_size or "40KB"} if shards > 1 or max_shard_size else {}
    model.save_pretrained(str(out), safe_serialization=True, **kw)
    if tokenizer:
        write_wordlevel_tokenizer(out)
    return out


def write_wordlevel_tokenizer(out: Path) -> Path:
    """The tokenizers-JSON tokenizer of the tiny models: WordLevel over ``VOCAB``, ChatML-style template
    whose turn terminator ``<|im_end|>`` is the eos (id 2)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

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


def make_tiny_qwen3_moe(out: Path, *, layers: int = 2, experts: int = 4, hidden: int = 64, moe_intermediate: int = 32,
                        seed: int = 0) -> Path:
    """A tiny Qwen3-MoE checkpoint as transformers 5 saves it: per-expert
    ``mlp.experts.<e>.{gate,up,down}_proj.weight`` (``save_pretrained`` splits the fused
    ``experts.gate_up_proj``/``down_proj`` back), a dense router ``mlp.gate.weight`` (experts, hidden), q/k norms;
    2 of ``experts`` experts per token, head_dim 16, the tiny Llama's tokenizer. About 200 KB."""
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    cfg = Qwen3MoeConfig(vocab_size=len(VOCAB), hidden_size=hidden, intermediate_size=2 * hidden,
                         moe_intermediate_size=moe_intermediate, num_experts=experts, num_experts_per_tok=2,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         max_position_embeddings=256, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    Qwen3MoeForCausalLM(cfg).to(torch.bfloat16).save_pretrained(str(out), safe_serialization=True)
    write_wordlevel_tokenizer(out)
    return out


#: the quantized layouts modelyard writes or loads (``make_quantized_fixture``): the six of the brief, then
#: ``w4a16-asym`` (what modelyard's llm-compressor ``awq`` scheme writes) and ``nvfp4a16``.
QUANT_FIXTURE_SCHEMES = ("gptq", "awq", "w4a16", "w8a8", "fp8-dynamic", "nvfp4", "w4a16-asym", "nvfp4a16")
#: group size (input columns per scale) of the grouped int4 fixtures; NVFP4 groups are always 16.
FIXTURE_GROUP = 32
#: compressed-tensors release whose output the configs below mirror (llm-compressor 0.14 ``oneshot`` + save).
CT_VERSION = "0.19.0"


def _ct_args(num_bits: int, kind: str, strategy: str, *, group_size: int | None = None, symmetric: bool = True,
             dynamic: bool | str = False, observer: str | None = "memoryless_minmax", scale_dtype: str | None = None,
             zp_dtype: str | None = None) -> dict:
    """compressed-tensors ``QuantizationArgs.model_dump()`` (every key, as the saved config.json holds it)."""
    return {"actorder": None, "block_structure": None, "dynamic": dynamic, "group_size": group_size,
            "num_bits": num_bits, "observer": observer, "observer_kwargs": {}, "scale_dtype": scale_dtype,
            "strategy": strategy, "symmetric": symmetric, "type": kind, "zp_dtype": zp_dtype}


def quantization_config_for(scheme: str, ignore: list[str]) -> dict:
    """config.json ``quantization_config`` as each tool writes it for ``scheme``.

    gptq: gptqmodel (``QuantizeConfig.to_dict``: v1 ``gptq`` checkpoint format, int32 packing, desc_act off);
    awq: AutoAWQ GEMM; the rest: compressed-tensors ``ModelCompressor.update_config`` after llm-compressor
    ``oneshot`` (recorded from llm-compressor 0.14 / compressed-tensors 0.19 on the tiny models: same key set,
    regex ignores such as ``re:.*mlp.gate$`` resolved to module names)."""
    g = FIXTURE_GROUP
    if scheme == "gptq":
        return {"bits": 4, "group_size": g, "desc_act": False, "sym": True, "lm_head": False, "quant_method": "gptq",
                "checkpoint_format": "gptq", "pack_dtype": "int32",
                "meta": {"quantizer": ["gptqmodel:7.6.0"], "damp_percent": 0.05, "damp_auto_increment": 0.01,
                         "static_groups": False, "true_sequential": True, "mse": 0.0}}
    if scheme == "awq":
        return {"quant_method": "awq", "bits": 4, "group_size": g, "version": "gemm", "zero_point": True,
                "modules_to_not_convert": None}
    fp4 = "torch.float8_e4m3fn"
    weights, acts, fmt = {
        "w4a16": (_ct_args(4, "int", "group", group_size=g), None, "pack-quantized"),
        "w4a16-asym": (_ct_args(4, "int", "group", group_size=g, symmetric=False, zp_dtype="torch.int8"), None,
                       "pack-quantized"),
        "w8a8": (_ct_args(8, "int", "channel"), _ct_args(8, "int", "token", dynamic=True, observer=None),
                 "int-quantized"),
        "fp8-dynamic": (_ct_args(8, "float", "channel"), _ct_args(8, "float", "token", dynamic=True, observer=None),
                        "float-quantized"),
        "nvfp4": (_ct_args(4, "float", "tensor_group", group_size=16, scale_dtype=fp4),
                  _ct_args(4, "float", "tensor_group", group_size=16, dynamic="local", observer="static_minmax",
                           scale_dtype=fp4), "nvfp4-pack-quantized"),
        "nvfp4a16": (_ct_args(4, "float", "tensor_group", group_size=16, scale_dtype=fp4), None,
                     "nvfp4-pack-quantized"),
    }[scheme]
    return {"config_groups": {"group_0": {"format": fmt, "input_activations": acts, "output_activations": None,
                                          "targets": ["Linear"], "weights": weights}},
            "format": fmt, "global_compression_ratio": None, "ignore": ignore, "kv_cache_scheme": None,
            "quant_method": "compressed-tensors", "quantization_status": "compressed", "sparsity_config": {},
            "transform_config": {}, "version": CT_VERSION}


def _quantized_linear(scheme: str, o: int, i: int) -> dict[str, object]:
    """The tensors that replace one Linear ``weight`` (o, i) under ``scheme``: suffix -> tensor.

    Shapes and dtypes are what each tool saves (values are placeholders: zeros, unit scales, the real
    ``g_idx``/``weight_shape``): GPTQ v1 ``qweight`` (i/8, o) I32, ``qzeros`` (i/g, o/8) I32, ``scales``
    (i/g, o) F16, ``g_idx`` (i,) I32; compressed-tensors pack-quantized ``weight_packed`` (o, i/8) I32,
    ``weight_scale`` (o, i/g), ``weight_shape`` (2,) I64, asymmetric ``weight_zero_point`` (o/8, i/g) I32;
    int-/float-quantized ``weight`` I8/F8_E4M3 (o, i) with per-channel ``weight_scale`` (o, 1); NVFP4
    ``weight_packed`` (o, i/2) U8, ``weight_scale`` (o, i/16) F8_E4M3, ``weight_global_scale`` (1,) F32 and,
    with FP4 activations, ``input_global_scale`` (1,) F32."""
    import torch

    g, bf16 = FIXTURE_GROUP, torch.bfloat16
    if scheme == "gptq":
        return {"qweight": torch.zeros(i // 8, o, dtype=torch.int32),
                "qzeros": torch.zeros(i // g, o // 8, dtype=torch.int32),
                "scales": torch.ones(i // g, o, dtype=torch.float16),
                "g_idx": torch.arange(i, dtype=torch.int32) // g}
    if scheme in ("w4a16", "w4a16-asym"):
        t = {"weight_packed": torch.zeros(o, i // 8, dtype=torch.int32),
             "weight_scale": torch.ones(o, i // g, dtype=bf16),
             "weight_shape": torch.tensor([o, i], dtype=torch.int64)}
        if scheme == "w4a16-asym":
            t["weight_zero_point"] = torch.zeros(o // 8, i // g, dtype=torch.int32)
        return t
    if scheme in ("w8a8", "fp8-dynamic"):
        dtype = torch.int8 if scheme == "w8a8" else torch.float8_e4m3fn
        return {"weight": torch.zeros(o, i, dtype=dtype), "weight_scale": torch.ones(o, 1, dtype=bf16)}
    t = {"weight_packed": torch.zeros(o, i // 2, dtype=torch.uint8),
         "weight_scale": torch.ones(o, i // 16, dtype=torch.float8_e4m3fn),
         "weight_global_scale": torch.ones(1, dtype=torch.float32)}
    if scheme == "nvfp4":
        t["input_global_scale"] = torch.ones(1, dtype=torch.float32)
    return t


def make_quantized_fixture(out: Path, scheme: str, moe: bool) -> Path:
    """A healthy quantized checkpoint in ``out``: the tiny Llama (hidden 64, intermediate 128) or, with ``moe``,
    the tiny Qwen3-MoE (hidden 64, 4 experts of 32), every ``*_proj`` Linear (attention q/k/v/o, MLP or each
    expert's gate/up/down) stored in ``scheme``'s layout (:func:`_quantized_linear`; AutoAWQ GEMM through
    :func:`write_awq_like`), embeddings, norms, the MoE router ``mlp.gate.weight`` and ``lm_head`` dense (every
    tool leaves them so), and the ``quantization_config`` the tool writes (:func:`quantization_config_for`).
    ``scheme`` is one of :data:`QUANT_FIXTURE_SCHEMES`. Mutants for differential tests start from here."""
    import torch
    from safetensors.torch import load_file, save_file

    if scheme not in QUANT_FIXTURE_SCHEMES:
        raise ValueError(f"scheme {scheme!r} is not one of {QUANT_FIXTURE_SCHEMES}")
    (make_tiny_qwen3_moe if moe else make_tiny_llama)(out)
    if scheme == "awq":
        write_awq_like(out, group_size=FIXTURE_GROUP)
        return out
    cfg = json.loads((out / "config.json").read_text())
    ignore = [f"model.layers.{n}.mlp.gate" for n in range(cfg["num_hidden_layers"])] if moe else []
    half = torch.float16 if scheme == "gptq" else torch.bfloat16  # GPTQ kernels run in float16
    tensors: dict[str, object] = {}
    for name, t in load_file(str(out / "model.safetensors")).items():
        if name.endswith("_proj.weight"):
            base = name[: -len("weight")]
            tensors.update({base + k: v for k, v in _quantized_linear(scheme, *t.shape).items()})
        else:
            tensors[name] = t.to(half)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg["quantization_config"] = quantization_config_for(scheme, ignore + ["lm_head"])
    if scheme == "gptq":
        cfg["dtype"] = "float16"
        (out / "quantize_config.json").write_text(json.dumps(cfg["quantization_config"], indent=2))
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return out


# --- one healthy folder per tokenizer format the runtime reads -------------------------------------------------

#: words of the generated training text of the SentencePiece and tiktoken fixtures.
CORPUS_WORDS = ("the", "a", "of", "to", "and", "is", "model", "token", "serve", "verify", "weights", "layer", "expert",
                "router", "chat", "reply", "fast", "small", "tiny", "check", "config", "runtime", "What", "capital",
                "France", "Paris", "You", "are", "helpful", "assistant")
#: Llama 2 chat format: ``[INST]`` turns, system folded into the first one, the assistant turn closed by eos (</s>).
LLAMA2_CHAT_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{% set system = messages[0]['content'] %}{% set turns = messages[1:] %}"
    "{% else %}{% set system = none %}{% set turns = messages %}{% endif %}"
    "{% for m in turns %}{% if m['role'] == 'user' %}{{ bos_token }}[INST] "
    "{% if loop.first and system %}<<SYS>>\n{{ system }}\n<</SYS>>\n\n{% endif %}{{ m['content'] }} [/INST]"
    "{% elif m['role'] == 'assistant' %} {{ m['content'] }} {{ eos_token }}{% endif %}{% endfor %}"
)
#: ChatML with real newlines (the tiktoken fixture's byte-level BPE keeps them), closed by <|im_end|>.
CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
#: special tokens appended after the tiktoken BPE ranks, in id order; bos, pad, turn start, eos.
TIKTOKEN_SPECIALS = ("<|begin_of_text|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>")


def tiny_corpus(lines: int = 400, words: int = 12, seed: int = 0) -> list[str]:
    """``lines`` sentences of ``words`` words drawn (seeded) from :data:`CORPUS_WORDS`."""
    import random

    rng = random.Random(seed)
    return [" ".join(rng.choice(CORPUS_WORDS) for _ in range(words)) + "." for _ in range(lines)]


def _added(content: str) -> dict:
    return {"content": content, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
            "special": True}


def make_spm_llama(out: Path, *, vocab_size: int = 320) -> Path:
    """A Llama-2-style folder whose only tokenizer file is a SentencePiece ``tokenizer.model`` (no
    tokenizer.json): BPE with byte fallback (256 ``<0xNN>`` pieces), ``<unk>``/``<s>``/``</s>`` at ids 0/1/2,
    trained here by sentencepiece's trainer on :func:`tiny_corpus`; tokenizer_class ``LlamaTokenizer``; the
    Llama 2 chat template, whose assistant turn ends with the eos ``</s>``; config vocab_size = the model's
    piece count. transformers 5 converts it to a fast tokenizer at load (``LlamaConverter``, needs
    ``sentencepiece`` and ``protobuf``), as vLLM's ``AutoTokenizer`` does."""
    import io

    import sentencepiece as spm

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(tiny_corpus()), model_writer=buf, vocab_size=vocab_size,
                                   model_type="bpe", byte_fallback=True, character_coverage=1.0, unk_id=0, bos_id=1,
                                   eos_id=2, pad_id=-1, hard_vocab_limit=False, normalization_rule_name="identity",
                                   num_threads=1, minloglevel=2)
    pieces = spm.SentencePieceProcessor(model_proto=buf.getvalue()).get_piece_size()
    make_tiny_llama(out, vocab_size=pieces, bos_token_id=1, eos_token_id=2, tokenizer=False)
    (out / "tokenizer.model").write_bytes(buf.getvalue())
    special = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    (out / "special_tokens_map.json").write_text(json.dumps(special, indent=2))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "add_bos_token": True, "add_eos_token": False,
        "added_tokens_decoder": {str(i): _added(t) for i, t in enumerate(("<unk>", "<s>", "</s>"))},
        **special, "chat_template": LLAMA2_CHAT_TEMPLATE, "clean_up_tokenization_spaces": False, "legacy": False,
        "model_max_length": 256, "pad_token": None, "padding_side": "right", "sp_model_kwargs": {},
        "tokenizer_class": "LlamaTokenizer"}, indent=2))
    return out


def make_tiktoken_llama(out: Path, *, merges: int = 44) -> Path:
    """A folder whose only tokenizer file is a tiktoken BPE file named ``tokenizer.model`` (one
    ``base64(token bytes) rank`` line per token: the 256 single bytes, then ``merges`` merges learnt here on
    :func:`tiny_corpus` with tiktoken's reference trainer), and :data:`TIKTOKEN_SPECIALS` declared in
    tokenizer_config.json ``added_tokens_decoder`` right after the ranks; tokenizer_class
    ``PreTrainedTokenizerFast``, ChatML template closed by the eos ``<|im_end|>``.

    transformers 5 reads it the way the Llama 3 ``original/tokenizer.model`` and Kimi/DeepSeek-style
    tiktoken repos are read: with no tokenizer.json, ``tokenizer.model`` (or ``tiktoken.model``) becomes the
    vocab file; the fast backend first tries SentencePiece (a tiktoken file is not a protobuf, so it logs
    "Falling back to TikToken extractor"), then ``TikTokenConverter`` builds a byte-level BPE from the
    ranks and appends ``added_tokens_decoder`` ids >= the rank count as special tokens. Needs ``tiktoken``."""
    import base64
    import contextlib
    import io

    from tiktoken._educational import bpe_train

    pattern = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
               r"""\s*[\r\n]+|\s+(?!\S)|\s+""")  # TikTokenConverter's default split (the cl100k one)
    with contextlib.redirect_stdout(io.StringIO()):  # the reference trainer prints every merge
        ranks = bpe_train(" ".join(tiny_corpus(200)), 256 + merges, pattern)
    n = len(ranks)
    make_tiny_llama(out, vocab_size=n + len(TIKTOKEN_SPECIALS), bos_token_id=n, eos_token_id=n + 3, tokenizer=False)
    (out / "tokenizer.model").write_bytes(b"".join(base64.b64encode(tok) + b" " + str(rank).encode() + b"\n"
                                                   for tok, rank in sorted(ranks.items(), key=lambda x: x[1])))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "added_tokens_decoder": {str(n + i): _added(t) for i, t in enumerate(TIKTOKEN_SPECIALS)},
        "bos_token": TIKTOKEN_SPECIALS[0], "pad_token": TIKTOKEN_SPECIALS[1], "eos_token": TIKTOKEN_SPECIALS[3],
        "chat_template": CHATML_TEMPLATE, "clean_up_tokenization_spaces": False, "model_max_length": 256,
        "tokenizer_class": "PreTrainedTokenizerFast"}, indent=2))
    return out


def make_bpe_llama(out: Path, *, vocab_size: int = 800) -> Path:
    """A folder with a byte-level BPE ``tokenizer.json`` (GPT-2/Llama-3 style: ByteLevel pre-tokenizer and
    decoder, ``Ġ`` for a leading space) trained here by the tokenizers library on :func:`tiny_corpus` and the
    probe texts, ChatML template closed by the eos ``<|im_end|>``; config vocab_size = the trained size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from modelyard.checks.gguf_tokenizer import probe_texts

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok.train_from_iterator(tiny_corpus() + probe_texts() * 4, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    n = tok.get_vocab_size()
    make_tiny_llama(out, vocab_size=n, bos_token_id=0, eos_token_id=2, tokenizer=False)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|im_end|>",
                                   unk_token=None, pad_token="<|endoftext|>")
    fast.chat_template = CHATML_TEMPLATE
    fast.save_pretrained(str(out))
    return out


def train_spm_bpe(lines: list[str], vocab_size: int = 600):
    """A SentencePiece BPE model (byte fallback; ``<unk>``/``<s>``/``</s>`` at 0/1/2) trained here on ``lines``:
    its ``SentencePieceProcessor``. BPE pieces score minus their merge rank, as in every SentencePiece-BPE model;
    whitespace is kept as written (as llama.cpp's SPM tokenizer keeps it)."""
    import io

    import sentencepiece as spm

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=buf, vocab_size=vocab_size,
                                   model_type="bpe", byte_fallback=True, character_coverage=1.0, unk_id=0, bos_id=1,
                                   eos_id=2, pad_id=-1, hard_vocab_limit=False, normalization_rule_name="identity",
                                   num_threads=1, minloglevel=2, remove_extra_whitespaces=False)
    return spm.SentencePieceProcessor(model_proto=buf.getvalue())


GEMMA_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}<end_of_turn>\n"
                  "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")


#: user-defined tokens of literal whitespace, as Gemma-3's GGUF stores them (ids 107 and up: newlines, 138 and up:
#: runs of spaces, then tabs); llama.cpp matches them before SentencePiece
WHITESPACE_TOKENS = ("\n", "\n\n", "  ", "   ", "    ", "        ", "\t", "\t\t")


def make_gemma3_gguf(path: Path, lines: list[str], *, vocab_size: int = 600, seed: int = 0) -> Path:
    """A Gemma-3 (text) GGUF file as llama.cpp writes one, built here: a SentencePiece-BPE vocabulary
    (``tokenizer.ggml.model = "llama"``, scores = minus the merge rank, ``add_bos_token`` true,
    ``add_space_prefix`` false, as Gemma's GGUFs say) trained on ``lines`` plus the turn markers as control
    tokens and :data:`WHITESPACE_TOKENS` as user-defined tokens, and a 2-layer random Gemma3ForCausalLM (hidden 64,
    head_dim 32) in float32 under llama.cpp's
    tensor names (norm weights stored as 1 + w, as llama.cpp's converter writes Gemma's).

    transformers 5.17's GGUF converter for this family (``GGUFGemmaConverter``) reads that vocabulary as
    a Unigram model and adds no bos: the defect of the public Gemma-3 GGUF imports."""
    import gguf
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    sp = train_spm_bpe(lines, vocab_size)
    n = sp.get_piece_size()
    pieces = [sp.id_to_piece(i) for i in range(n)]
    ws = [t for t in WHITESPACE_TOKENS if t not in pieces]  # a vocabulary holds each token once (llama.cpp asserts it)
    tokens = pieces + ["<start_of_turn>", "<end_of_turn>"] + ws
    scores = [float(sp.get_score(i)) for i in range(n)] + [0.0] * (2 + len(ws))
    types = []
    for i in range(n):
        types.append(2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i)
                     else 4 if pieces[i] in WHITESPACE_TOKENS else 1)
    types += [3, 3] + [4] * len(ws)
    torch.manual_seed(seed)
    cfg = Gemma3TextConfig(vocab_size=len(tokens), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=512,
                           sliding_window=64, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = Gemma3ForCausalLM(cfg)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA3, cfg.num_hidden_layers)
    w = gguf.GGUFWriter(str(path), "gemma3")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(10000.0)
    w.add_sliding_window(cfg.sliding_window)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_pad_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(False)
    w.add_chat_template(GEMMA_TEMPLATE)
    for name, t in model.state_dict().items():
        if name == "lm_head.weight":
            continue  # tied to the embedding
        base, suffix = name.rsplit(".", 1)
        arr = t.detach().float()
        if base.endswith("norm"):
            arr = arr + 1.0
        w.add_tensor(f"{names.get_name(base)}.{suffix}", arr.numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
