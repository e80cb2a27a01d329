"""One code-built fixture per kind of defect the verification suite knows, each with a fixed twin
that passes. Every broken folder starts as a copy of the healthy tiny Llama (tests/fixtures.py)
and changes one thing; the assertions name the exact finding codes, severities and fields.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from modelyard.checks import Target
from modelyard.stages.verify import verify_folder
from tests.fixtures import write_awq_like


def copy(src, dst):
    shutil.copytree(src, dst, symlinks=True)
    for p in dst.iterdir():
        p.chmod(0o644)
    return dst


def edit_json(path, **changes):
    data = json.loads(path.read_text()) if path.exists() else {}
    for k, v in changes.items():
        if v is None:
            data.pop(k, None)
        else:
            data[k] = v
    path.write_text(json.dumps(data, indent=2))


def edit_weights(d, fn):
    tensors = load_file(str(d / "model.safetensors"))
    fn(tensors)
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})


def found(report, severity=None):
    """``[(code, field)]`` of the findings at ``severity`` (all but info when None)."""
    return [(f.code, f.field) for f in report.findings
            if (f.severity.value == severity if severity else f.severity.value != "info")]


@pytest.fixture
def m(tiny_llama_dir, tmp_path):
    return copy(tiny_llama_dir, tmp_path / "m")


# --- files -------------------------------------------------------------------------------------

def test_incomplete_leftover_warns_and_fixed_passes(m):
    (m / "model.safetensors.incomplete").write_bytes(b"\0" * 4096)
    assert found(verify_folder(m)) == [("files.incomplete_download", None)]
    (m / "model.safetensors.incomplete").unlink()
    assert found(verify_folder(m)) == []


def test_pickle_only_weights_warn(m):
    tensors = load_file(str(m / "model.safetensors"))
    torch.save(tensors, m / "pytorch_model.bin")
    (m / "model.safetensors").unlink()
    r = verify_folder(m)
    assert [(f.code, f.severity.value, f.file) for f in r.findings] == [
        ("files.pickle_weights", "warning", "pytorch_model.bin"), ("files.no_safetensors", "warning", None),
        ("files.pickle.picklescan", "info", "pytorch_model.bin")]  # a torch state dict: no dangerous global
    assert r.findings[2].value == {"dangerous": [], "suspicious": 0}


def test_picklescan_flags_a_dangerous_pickle_as_a_warning_signal(m):
    """A pickle whose __reduce__ calls os.system (built with pickle.dumps, never loaded): picklescan's verdict
    is a warning that names the global; the verdict is a signal, not a gate (no error is added)."""
    import pickle

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo",))

    (m / "extra.pkl").write_bytes(pickle.dumps(Evil(), protocol=2))
    r = verify_folder(m)
    assert [(f.code, f.severity.value, f.file, f.value) for f in r.findings] == [
        ("files.pickle_weights", "warning", "extra.pkl", None),
        ("files.pickle.picklescan", "warning", "extra.pkl", {"dangerous": ["posix.system"], "suspicious": 0})]
    assert "posix.system" in r.findings[1].message and r.passed


def test_pickle_and_safetensors_with_different_tensors(m):
    tensors = load_file(str(m / "model.safetensors"))
    same = dict(tensors)
    torch.save(same, m / "pytorch_model.bin")
    assert found(verify_folder(m)) == [("files.pickle_weights", None)]  # same tensors: only the pickle warning
    del same["lm_head.weight"]
    same["score.weight"] = torch.zeros(2, 64)
    torch.save(same, m / "pytorch_model.bin")
    r = verify_folder(m)
    assert found(r) == [("files.pickle_weights", None), ("files.pickle_safetensors_differ", None)]
    assert r.findings[1].value == {"only_pickle": ["score.weight"], "only_safetensors": ["lm_head.weight"]}


def test_remote_code_missing_module_is_error_present_is_review(m):
    edit_json(m / "config.json", auto_map={"AutoConfig": "configuration_x.XConfig",
                                           "AutoModelForCausalLM": "modeling_x.XForCausalLM"})
    (m / "configuration_x.py").write_text("# reviewed\n")
    r = verify_folder(m)
    assert [(f.code, f.severity.value, f.value) for f in r.findings] == [
        ("files.remote_code.module_missing", "error", "modeling_x.py"),
        ("files.remote_code.review", "warning", ["configuration_x.py", "modeling_x.py"]),
        ("files.remote_code.native_available", "info", "LlamaForCausalLM")]
    (m / "modeling_x.py").write_text("# reviewed\n")
    assert found(verify_folder(m), "error") == []


def test_symlink_leaving_the_folder_is_error(m, tmp_path):
    outside = tmp_path / "secret.txt"
    outside.write_text("x")
    os.symlink(outside, m / "notes.txt")
    r = verify_folder(m)
    assert [(f.code, f.file, f.value) for f in r.errors] == [("files.symlink_escapes", "notes.txt", str(outside))]
    (m / "notes.txt").unlink()
    os.symlink("config.json", m / "notes.txt")  # a link inside the folder is fine
    assert found(verify_folder(m)) == []


def test_fifo_is_refused_without_being_opened(m):
    (m / "tokenizer.json").unlink()
    os.mkfifo(m / "tokenizer.json")  # opening it for reading would block forever
    r = verify_folder(m)
    assert [(f.code, f.file, f.value) for f in r.findings] == [("files.not_regular", "tokenizer.json", "FIFO")]


# --- architecture --------------------------------------------------------------------------------

def test_missing_tensor(m):
    edit_weights(m, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    r = verify_folder(m)
    assert [(f.code, f.value) for f in r.errors] == [("architecture.missing_tensors", ["model.layers.1.mlp.up_proj.weight"])]


def test_unexpected_tensor_and_ignored_rotary_buffer(m):
    def add(t):
        t["model.layers.0.mlp.extra_proj.weight"] = torch.zeros(4, 4, dtype=torch.bfloat16)
        t["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.zeros(8)  # old exports: every loader skips it
    edit_weights(m, add)
    r = verify_folder(m)
    assert [(f.code, f.value) for f in r.errors] == [("architecture.unexpected_tensors", ["model.layers.0.mlp.extra_proj.weight"])]


def test_wrong_shape_from_config(m):
    edit_json(m / "config.json", intermediate_size=96)
    r = verify_folder(m)
    assert [f.code for f in r.errors] == ["architecture.shape_mismatch"]
    assert r.errors[0].value[0] == "model.layers.0.mlp.down_proj.weight [64, 128] (expected [64, 96])"


def test_tied_embeddings_with_stored_head_warns(m):
    edit_json(m / "config.json", tie_word_embeddings=True)
    r = verify_folder(m)
    assert [(f.code, f.severity.value, f.field) for f in r.findings] == [
        ("architecture.tied_head_stored", "warning", "tie_word_embeddings")]
    edit_weights(m, lambda t: t.pop("lm_head.weight"))  # fixed twin: the head reuses embed_tokens
    assert found(verify_folder(m)) == []


def test_untied_without_head_is_error(m):
    edit_weights(m, lambda t: t.pop("lm_head.weight"))
    r = verify_folder(m)
    assert [(f.code, f.field) for f in r.errors] == [("architecture.untied_head_missing", "lm_head.weight")]


def test_awq_layout_maps_to_dense_parameters(tmp_path, tiny_llama_dir):
    good = write_awq_like(copy(tiny_llama_dir, tmp_path / "awq"), group_size=32)
    assert found(verify_folder(good)) == []
    bad = write_awq_like(copy(tiny_llama_dir, tmp_path / "awq-bad"), group_size=32, out_pack_wrong=True)
    r = verify_folder(bad)
    assert [f.code for f in r.errors] == ["architecture.shape_mismatch"]
    assert r.errors[0].value == ["model.layers.0.mlp.down_proj.qweight [128, 16] (packs [64, 128] at 4 bits)",
                                 "model.layers.1.mlp.down_proj.qweight [128, 16] (packs [64, 128] at 4 bits)"]


# --- config ----------------------------------------------------------------------------------------

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64, "rope_theta": 10000.0}


def test_rope_llama3_missing_key_then_fixed(m):
    rope = dict(LLAMA3_ROPE)
    del rope["high_freq_factor"]
    edit_json(m / "config.json", rope_parameters=rope)
    r = verify_folder(m, Target(vllm_version="0.6.3"))
    assert [(f.code, f.field) for f in r.errors] == [("config.rope.key_missing", "rope_parameters.high_freq_factor")]
    edit_json(m / "config.json", rope_parameters=LLAMA3_ROPE)
    assert found(verify_folder(m, Target(vllm_version="0.6.3"))) == []
    assert found(verify_folder(m)) == [("config.rope.needs_recent_runtime", "rope_parameters")]
    assert found(verify_folder(m, Target(transformers_version="4.50.0"))) == []  # no vLLM version named: no vLLM rule
    assert found(verify_folder(m, Target(vllm_version="0.5.2")), "error") == [
        ("config.rope.unsupported_by_runtime", "rope_parameters")]


def test_rope_scaling_without_type(m):
    edit_json(m / "config.json", rope_parameters=None, rope_theta=10000.0,
              rope_scaling={k: v for k, v in LLAMA3_ROPE.items() if k not in ("rope_type", "rope_theta")})
    r = verify_folder(m)
    assert [(f.code, f.field) for f in r.errors] == [("config.rope.type_missing", "rope_scaling.rope_type")]


def test_max_model_len_against_derived_and_linear_scaling(m):
    r = verify_folder(m, Target(max_model_len=512))
    assert [(f.code, f.field, f.value) for f in r.errors] == [
        ("config.max_len.exceeds_derived", "max_position_embeddings", 256)]
    assert "--max-model-len 256 or less" in r.errors[0].fix
    edit_json(m / "config.json", rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0})
    assert found(verify_folder(m, Target(max_model_len=512))) == []  # 256 x 2
    assert found(verify_folder(m, Target(max_model_len=513)), "error") == [
        ("config.max_len.exceeds_derived", "max_position_embeddings")]


def test_dtype_missing_mismatch_and_fp16_target(m):
    edit_json(m / "config.json", dtype=None, torch_dtype=None)
    assert found(verify_folder(m)) == [("config.dtype.missing", "torch_dtype")]
    edit_json(m / "config.json", dtype="float16")
    r = verify_folder(m)
    assert [(f.code, f.field, f.value) for f in r.findings if f.severity.value == "warning"] == [
        ("config.dtype.mismatch", "dtype", "float16")]
    edit_json(m / "config.json", dtype="bfloat16")
    assert found(verify_folder(m, Target(dtype="bfloat16"))) == []
    assert found(verify_folder(m, Target(dtype="float16"))) == [("config.dtype.half_precision_overflow", "dtype")]
    assert found(verify_folder(m, Target(gpu_cc="7.5"))) == [("config.dtype.half_precision_overflow", "dtype")]


# --- parallelism -----------------------------------------------------------------------------------

def test_quant_group_vs_tp(tmp_path, tiny_llama_dir):
    d = write_awq_like(copy(tiny_llama_dir, tmp_path / "awq"), group_size=32)
    assert found(verify_folder(d, Target(tensor_parallel_size=2))) == []  # o_proj 64/2=32, down_proj 128/2=64
    r = verify_folder(d, Target(tensor_parallel_size=4))  # o_proj 16 per rank
    assert [(f.code, f.field) for f in r.errors] == [("parallelism.quant_group_not_divisible", "num_attention_heads")]
    assert r.errors[0].message == ("tensor_parallel_size 4: o_proj's input 64 gives 16 per rank at TP 4, not a "
                                   "multiple of the quantization group_size 32; valid sizes: 1, 2")
    d64 = write_awq_like(copy(tiny_llama_dir, tmp_path / "awq64"), group_size=64)
    assert found(verify_folder(d64, Target(tensor_parallel_size=2)), "error") == [
        ("parallelism.quant_group_not_divisible", "num_attention_heads")]


# --- tokenizer -------------------------------------------------------------------------------------

def test_turn_terminator_not_in_stop_set_then_patched(m):
    edit_json(m / "generation_config.json", eos_token_id=1)
    edit_json(m / "config.json", eos_token_id=1)
    edit_json(m / "tokenizer_config.json", eos_token="<s>")
    r = verify_folder(m, Target(serve="chat"))
    assert [(f.code, f.file, f.field, f.value) for f in r.errors] == [
        ("tokenizer.stop_tokens.missing_turn_terminator", "generation_config.json", "eos_token_id", 1)]
    assert "<|im_end|> (id 2)" in r.errors[0].message and "[1, 2]" in r.errors[0].fix
    assert found(verify_folder(m, Target(serve="completion")), "warning") == [
        ("tokenizer.stop_tokens.missing_turn_terminator", "eos_token_id")]
    edit_json(m / "generation_config.json", eos_token_id=[1, 2])
    assert found(verify_folder(m, Target(serve="chat"))) == []


def test_slow_class_without_spm(m):
    edit_json(m / "tokenizer_config.json", tokenizer_class="LlamaTokenizer")
    r = verify_folder(m)
    # transformers 5 builds LlamaTokenizer over the WordLevel vocabulary, and it encodes "<|im_start|>" as
    # nothing at all: the encoding check sees what that does to every chat prompt
    assert [(f.code, f.field, f.value) for f in r.findings if f.severity.value == "warning"] == [
        ("tokenizer.class.slow_without_model", "tokenizer_class", "LlamaTokenizer"),
        ("tokenizer.chat_template.marker_split", "chat_template", "<|im_start|>")]
    assert any("encodes as [], not as the one token <|im_start|>" in f.message for f in r.findings)


def test_control_token_not_special(m):
    data = json.loads((m / "tokenizer.json").read_text())
    data["added_tokens"].append({"id": 3, "content": "<|im_start|>", "single_word": False, "lstrip": False,
                                 "rstrip": False, "normalized": False, "special": False})
    (m / "tokenizer.json").write_text(json.dumps(data))
    r = verify_folder(m)
    assert [(f.code, f.value) for f in r.findings if f.severity.value == "warning"] == [
        ("tokenizer.control_tokens.not_special", ["<|im_start|>"])]


def test_template_that_fails_to_render(m):
    (m / "chat_template.jinja").write_text("{{ messages[0]['content'] | nosuchfilter }}")
    r = verify_folder(m, Target(serve="chat"))
    assert [f.code for f in r.errors] == ["tokenizer.chat_template.render_failed"]
    assert "nosuchfilter" in r.errors[0].message


def test_tokenizer_larger_than_embeddings(m):
    data = json.loads((m / "tokenizer.json").read_text())
    data["added_tokens"].append({"id": 128, "content": "<|extra|>", "single_word": False, "lstrip": False,
                                 "rstrip": False, "normalized": False, "special": True})
    data["model"]["vocab"]["<|extra|>"] = 128
    (m / "tokenizer.json").write_text(json.dumps(data))
    r = verify_folder(m)
    assert [(f.code, f.field, f.value) for f in r.errors] == [("tokenizer.vocab.exceeds_embeddings", "vocab_size", 128)]


# --- quantization ----------------------------------------------------------------------------------

def test_quantization_config_without_method_and_unsupported_version(m):
    edit_json(m / "config.json", quantization_config={"load_in_4bit": True, "bnb_4bit_quant_type": "nf4"})
    r = verify_folder(m)
    assert [(f.code, f.field) for f in r.errors] == [("quantization.method_missing", "quantization_config.quant_method")]
    edit_json(m / "config.json", quantization_config={"load_in_4bit": True, "quant_method": "bitsandbytes"})
    assert found(verify_folder(m, Target(vllm_version="0.4.0")), "error") == [
        ("quantization.method_unsupported", "quantization_config.quant_method")]
    assert found(verify_folder(m, Target(vllm_version="0.6.3"))) == []


def test_undeclared_and_stale_quantization(tmp_path, tiny_llama_dir):
    d = write_awq_like(copy(tiny_llama_dir, tmp_path / "awq"), group_size=32)
    edit_json(d / "config.json", quantization_config=None)
    assert [f.code for f in verify_folder(d).errors] == ["quantization.undeclared"]
    dense = copy(tiny_llama_dir, tmp_path / "dense")
    edit_json(dense / "config.json", quantization_config={"quant_method": "awq", "bits": 4, "group_size": 32})
    assert [f.code for f in verify_folder(dense).errors] == ["quantization.tensors_not_quantized"]


# --- robustness ------------------------------------------------------------------------------------

@pytest.mark.parametrize("changes", [
    {"num_attention_heads": "four"}, {"rope_parameters": {"rope_type": "yarn", "factor": "x"}},
    {"max_position_embeddings": -1}, {"rope_scaling": [1, 2]}, {"quantization_config": "awq"},
    {"architectures": "LlamaForCausalLM"}, {"vocab_size": None}, {"auto_map": {"AutoModel": 3}},
    {"text_config": {"num_attention_heads": 0}}, {"intermediate_size": 0},
    {"rope_parameters": {"rope_type": "linear", "factor": float("nan")}},
    {"rope_parameters": {"rope_type": "yarn", "factor": 1e308, "original_max_position_embeddings": 10**30}},
    {"num_key_value_heads": -2}, {"head_dim": 0}, {"eos_token_id": [1, "x"]},
])
def test_malformed_config_values_become_findings_not_crashes(m, changes):
    edit_json(m / "config.json", **changes)
    r = verify_folder(m, Target(tensor_parallel_size=2, max_model_len=300, serve="chat", dtype="float16"))
    assert not [f.message for f in r.findings if f.code == "internal.check_crashed"]


def test_configs_transformers_cannot_build_are_errors(m):
    edit_json(m / "config.json", intermediate_size=-128)
    assert [f.code for f in verify_folder(m).errors] == ["architecture.instantiate_failed"]


def test_absurd_layer_count_is_judged_without_building_the_model(m):
    edit_json(m / "config.json", num_hidden_layers=10**12)
    r = verify_folder(m)
    assert [(f.code, f.value) for f in r.errors] == [("architecture.layer_count_mismatch", 10**12)]


@pytest.mark.parametrize(("text", "code", "severity"), [
    ("{not json", "config.generation_config.invalid", "warning"),
    ("[1, 2]", "config.generation_config.invalid", "warning"),
    ('{"eos_token_id": "2"}', "config.generation_config.bad_eos", "warning"),
    ('{"eos_token_id": [2, 10000000000]}', "tokenizer.stop_tokens.out_of_range", "error"),
])
def test_malformed_generation_config(m, text, code, severity):
    """vLLM ignores an unreadable generation config and stops on the tokenizer's eos (measured by
    benchmarks/differential.py): a warning; an id past the vocabulary stays an error."""
    (m / "generation_config.json").write_text(text)
    assert (code, severity) in [(f.code, f.severity.value) for f in verify_folder(m).findings]


def _two_shards(m, duplicate):
    """``m``'s weights in two shards, ``lm_head.weight`` in the second, which also holds ``duplicate`` (a
    second copy of ``model.norm.weight``, not named by the index)."""
    t = load_file(str(m / "model.safetensors"))
    (m / "model.safetensors").unlink()
    a, b = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    head = {"lm_head.weight": t.pop("lm_head.weight")}
    save_file(t, str(m / a), metadata={"format": "pt"})
    save_file({**head, "model.norm.weight": duplicate}, str(m / b), metadata={"format": "pt"})
    size = sum(v.numel() * v.element_size() for v in [*t.values(), *head.values(), duplicate])
    (m / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": size}, "weight_map": {**dict.fromkeys(t, a), "lm_head.weight": b}}))
    return a, b


def test_tensor_stored_twice_with_another_shape_is_an_error(m):
    # vLLM loads every tensor of every shard it reads, whatever the index names: this copy is refused
    a, b = _two_shards(m, torch.zeros(8, 8, dtype=torch.bfloat16))
    r = verify_folder(m)
    # the architecture check sees the copy read last, as vLLM's loader does
    assert [(f.code, f.file, f.field, f.value) for f in r.errors] == [
        ("safetensors.tensor.duplicate_shape_mismatch", b, "model.norm.weight", [[64], [8, 8]]),
        ("architecture.shape_mismatch", None, "model.norm.weight", ["model.norm.weight [8, 8] (expected [64])"])]
    assert f"Keep the copy in {a} (the one the index names)" in r.errors[0].fix


def test_tensor_stored_twice_with_one_shape_warns(m):
    _two_shards(m, torch.ones(64, dtype=torch.bfloat16))
    r = verify_folder(m)
    assert list(r.errors) == []
    assert [(f.code, f.value) for f in r.findings if f.code.startswith("safetensors.tensor.")] == [
        ("safetensors.tensor.duplicate", 2)]


def test_template_marker_that_is_not_one_token_is_an_error_for_chat(m):
    jinja = m / "chat_template.jinja"
    if jinja.exists():
        jinja.write_text(jinja.read_text().replace("<|im_start|>", "<|turn|>"))
    else:
        tc = json.loads((m / "tokenizer_config.json").read_text())
        edit_json(m / "tokenizer_config.json", chat_template=tc["chat_template"].replace("<|im_start|>", "<|turn|>"))
    r = verify_folder(m, Target(serve="chat"))
    assert [(f.code, f.value) for f in r.errors] == [("tokenizer.chat_template.marker_split", "<|turn|>")]
    assert "encodes as ['<unk>'], not as the one token <|turn|>" in r.errors[0].message
    done = verify_folder(m, Target(serve="completion"))
    assert [(f.code, f.severity.value) for f in done.findings if f.code == "tokenizer.chat_template.marker_split"] == [
        ("tokenizer.chat_template.marker_split", "info")]


def _set_template(m, template):
    jinja = m / "chat_template.jinja"
    if jinja.exists():
        jinja.write_text(template)
    else:
        edit_json(m / "tokenizer_config.json", chat_template=template)


ALTERNATE = ("{% for m in messages %}{% if m['role'] in ['user', 'assistant'] and loop.index0 > 0 and "
             "m['role'] == messages[loop.index0 - 1]['role'] %}{{ raise_exception('Conversation roles must alternate') }}"
             "{% endif %}{% if m['role'] == 'tool' %}{{ raise_exception('Unknown role: tool') }}{% endif %}"
             "<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> {% endfor %}"
             "{% if add_generation_prompt %}<|im_start|> assistant {% endif %}")


def test_template_raising_on_other_conversation_shapes_warns(m):
    _set_template(m, ALTERNATE)
    r = verify_folder(m, Target(serve="chat"))
    assert list(r.errors) == []
    assert [(f.code, f.severity.value, f.value) for f in r.findings if f.code == "tokenizer.chat_template.shape_failed"] == [
        ("tokenizer.chat_template.shape_failed", "warning", "user+user"),
        ("tokenizer.chat_template.shape_failed", "warning", "tool-call")]
    f = next(f for f in r.findings if f.value == "user+user")
    assert f.message.startswith("the chat template raises on a conversation of shape user+user "
                                "(add_generation_prompt=True: TemplateError: Conversation roles must alternate; "
                                "add_generation_prompt=False: TemplateError: Conversation roles must alternate)")


def test_template_raising_on_a_lone_user_turn_is_an_error_for_chat(m):
    _set_template(m, "{% if messages[0]['role'] != 'system' %}{{ raise_exception('A system message is required') }}"
                     "{% endif %}" + ALTERNATE)
    r = verify_folder(m, Target(serve="chat"))
    shapes = [(f.code, f.severity.value, f.value) for f in r.findings if f.code == "tokenizer.chat_template.shape_failed"]
    assert shapes == [("tokenizer.chat_template.shape_failed", "error", "user"),
                      ("tokenizer.chat_template.shape_failed", "warning", "user+user"),
                      ("tokenizer.chat_template.shape_failed", "warning", "multi-turn"),
                      ("tokenizer.chat_template.shape_failed", "warning", "tool-call")]
    assert [f.code for f in r.errors] == ["tokenizer.chat_template.shape_failed"]
    done = verify_folder(m, Target(serve="completion"))
    assert {f.severity.value for f in done.findings if f.code == "tokenizer.chat_template.shape_failed"} == {"info"}
