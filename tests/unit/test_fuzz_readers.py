"""Hostile inputs: property-based fuzzing of the readers and checks that see untrusted bytes.

The property, for every generated folder: ``verify_folder`` returns a Report (findings only) or raises a
typed :class:`~modelyard.errors.ModelyardError`; never another exception, never an
``internal.check_crashed`` finding (a check that crashed), the report renders (JSON and Markdown), and
each example finishes within the hypothesis ``deadline``. Runs are derandomized so CI sees the same
inputs every time. Inputs per run: header 150 + config 100 + tokenizer/generation config 60 = 310.

Below the properties: regression tests, one per crash the fuzzing found, each asserting the exact finding.
"""

from __future__ import annotations

import json
import shutil
import struct
import tempfile
import time
import tracemalloc
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from modelyard.checks import Target
from modelyard.errors import ModelyardError
from modelyard.model.checkpoint import DTYPE_BITS, MAX_JSON_DEPTH, TensorInfo, read_safetensors_header, tensor_nbytes
from modelyard.stages.verify import verify_folder


def _settings(n: int) -> settings:
    return settings(max_examples=n, deadline=timedelta(seconds=2), derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])


HEADER_EXAMPLES, CONFIG_EXAMPLES, TOKENIZER_EXAMPLES = 150, 100, 60

#: a healthy tiny Llama config (the shape of tests/fixtures.py's), the base every config mutation starts from.
BASE_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 128,
    "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "bos_token_id": 1, "eos_token_id": 2,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}
TARGET = Target(tensor_parallel_size=2, max_model_len=4096)


def judge(files: dict[str, bytes], target: Target | None = None, copy_from: Path | None = None):
    """Write ``files`` into a fresh temp folder and verify it; assert the property. Returns the Report,
    or None when verify raised a typed ModelyardError."""
    with tempfile.TemporaryDirectory() as d:
        if copy_from is not None:
            for p in copy_from.iterdir():
                shutil.copyfile(p, Path(d, p.name))
        for name, data in files.items():
            Path(d, name).write_bytes(data)
        try:
            report = verify_folder(d, target)
        except ModelyardError:
            return None
        crashed = [f.message for f in report.findings if f.code == "internal.check_crashed"]
        assert not crashed, crashed
        json.loads(report.to_json())
        report.to_markdown()
        return report


def dump(doc) -> bytes:
    return json.dumps(doc, allow_nan=True).encode()


def deep(depth: int, leaf="x") -> str:
    return "[" * depth + json.dumps(leaf) + "]" * depth


# --- generators ---------------------------------------------------------------------------------

json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                      st.text(max_size=8), st.sampled_from([10**400, -(10**400), 2**63, 2**64, -1]))
json_any = st.recursive(json_leaf, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                          st.dictionaries(st.text(max_size=6), kids, max_size=4)),
                        max_leaves=12)
#: documents that are not JSON, or JSON too deep for any parser or check.
bad_json_bytes = st.one_of(
    st.binary(max_size=64),
    st.sampled_from([b"", b"{", b"{\"a\": }", b"\xff\xfe{}", b"NaN", b"[1, 2", b"{\"a\": 1}{"]),
    st.integers(1, 5000).map(lambda n: deep(n).encode()),
    st.integers(1, 3000).map(lambda n: ('{"a":' * n + "1" + "}" * n).encode()),
)

dtype_st = st.one_of(st.sampled_from(sorted(DTYPE_BITS)), st.sampled_from(["F128", "bf16", "", "Q4_K", "INT4"]),
                     json_leaf)
dim_st = st.one_of(st.integers(0, 8), st.integers(-3, 2**70), st.sampled_from([2**63, 2**64 - 1, 10**30]),
                   st.text(max_size=2), st.floats(), st.none())
shape_st = st.one_of(st.lists(dim_st, max_size=6), st.lists(st.integers(2**31, 2**62), min_size=10, max_size=60),
                     json_leaf, st.integers(1, 200).map(lambda n: json.loads(deep(n, 1))))
offset_st = st.one_of(st.integers(-10, 64), st.integers(-2**65, 2**65), st.floats(), st.text(max_size=2))
offsets_st = st.one_of(st.lists(offset_st, min_size=2, max_size=2), st.lists(offset_st, max_size=4), json_leaf)
entry_st = st.one_of(
    st.fixed_dictionaries({"dtype": dtype_st, "shape": shape_st, "data_offsets": offsets_st}),
    st.fixed_dictionaries({"dtype": st.just("F16"), "shape": st.lists(st.integers(0, 4), max_size=2),
                           "data_offsets": st.lists(st.integers(-8, 40), min_size=2, max_size=2)}),
    json_any,
)
metadata_st = st.one_of(st.dictionaries(st.text(max_size=4), json_any, max_size=3), json_any,
                        st.integers(1, 3000).map(lambda n: json.loads(deep(min(n, 900)))))


@st.composite
def safetensors_files(draw) -> bytes:
    """A whole .safetensors file: a (possibly lying) u64 length, a (possibly hostile) header, data bytes."""
    kind = draw(st.sampled_from(["structured", "structured", "structured", "raw", "nonobject", "badjson", "length"]))
    data = draw(st.binary(max_size=64))
    if kind == "raw":
        return draw(st.binary(max_size=96))
    if kind == "length":  # the length prefix lies: 100 MB, 2^63, 2^64-1, just past the file ...
        n = draw(st.one_of(st.sampled_from([100_000_000, 100_000_001, 2**63, 2**64 - 1, 0, 1, 7, 8, 9]),
                           st.integers(0, 2**64 - 1)))
        return struct.pack("<Q", n) + draw(st.binary(max_size=32))
    if kind == "nonobject":
        raw = dump(draw(st.one_of(json_leaf, st.lists(json_any, max_size=3))))
    elif kind == "badjson":
        raw = draw(bad_json_bytes)
    else:
        header = draw(st.dictionaries(st.text(min_size=1, max_size=12).filter(lambda s: s != "__metadata__"),
                                      entry_st, max_size=5))
        if draw(st.booleans()):
            header["__metadata__"] = draw(metadata_st)
        raw = dump(header)
    delta = draw(st.sampled_from([0, 0, 0, 1, -1, 8, -8, 1000]))
    n = max(0, len(raw) + delta)
    return struct.pack("<Q", n) + raw + data


#: JSON values nested 2..990 deep (parsers accept up to ~1000; repr/json.dumps of them may not).
deep_value = st.one_of(st.sampled_from([63, 64, 65, 200, 400, 600, 900, 990]), st.integers(2, 990)).map(
    lambda n: json.loads(deep(n, 1)))
#: the numbers that break float arithmetic: beyond float range, non-finite, zero, negative, bool.
nasty_numbers = st.sampled_from([10**400, -(10**400), 2**1023 + 2**1022, 0, -1, 2**63, 1e308, float("nan"),
                                 float("inf"), float("-inf"), -0.0, True, False])


def _number_field() -> st.SearchStrategy:
    return st.one_of(nasty_numbers, nasty_numbers, st.floats(allow_nan=True, allow_infinity=True),
                     st.integers(-2**70, 2**70), deep_value,
                     st.text(max_size=6), st.lists(json_leaf, max_size=3), st.dictionaries(st.text(max_size=3), json_leaf,
                                                                                          max_size=2), st.none())


NUMERIC_FIELDS = ("num_attention_heads", "hidden_size", "max_position_embeddings", "vocab_size", "num_key_value_heads",
                  "head_dim", "intermediate_size", "num_hidden_layers", "model_max_length")
SCALED_ROPE_TYPES = ["linear", "dynamic", "yarn"]
ROPE_TYPES = ["linear", "dynamic", "yarn", "llama3", "longrope", "su", "default", "mrope", "ntk", "", None, 3]
rope_st = st.one_of(
    st.fixed_dictionaries({"rope_type": st.sampled_from(SCALED_ROPE_TYPES),  # well-formed but for the numbers
                           "factor": st.one_of(nasty_numbers, st.sampled_from([2.0, 4, 8.0, 1]))},
                          optional={"original_max_position_embeddings": _number_field()}),
    st.fixed_dictionaries({"rope_type": st.sampled_from(ROPE_TYPES)},
                          optional={"factor": st.one_of(_number_field(), st.sampled_from([2.0, 4, 8.0, 1])), "type": st.sampled_from(ROPE_TYPES),
                                    "low_freq_factor": _number_field(), "high_freq_factor": _number_field(),
                                    "original_max_position_embeddings": _number_field(),
                                    "short_factor": json_any, "long_factor": json_any}),
    json_any,
)


@st.composite
def config_files(draw) -> bytes:
    if draw(st.integers(0, 9)) == 0:
        return draw(bad_json_bytes)
    cfg = dict(BASE_CONFIG)
    for key in draw(st.lists(st.sampled_from(NUMERIC_FIELDS), min_size=1, max_size=4, unique=True)):
        cfg[key] = draw(_number_field())
    which = draw(st.sampled_from(["rope_scaling", "rope_parameters", None]))
    if which:
        cfg[which] = draw(st.one_of(rope_st, st.dictionaries(st.sampled_from(["full_attention", "sliding"]), rope_st,
                                                             min_size=1, max_size=2)))
    if draw(st.booleans()):
        cfg["quantization_config"] = draw(st.one_of(json_any, st.fixed_dictionaries(
            {"quant_method": st.sampled_from(["awq", "gptq", "fp8", "compressed-tensors", "nope"]),
             "group_size": _number_field(), "weight_block_size": json_any, "config_groups": json_any})))
    if draw(st.integers(0, 4)) == 0:
        cfg = {"model_type": "llava", "architectures": ["LlavaForConditionalGeneration"], "text_config": cfg}
    return dump(cfg)


token_id_st = st.one_of(st.integers(-2**70, 2**70), deep_value, deep_value, st.sampled_from([10**400, -1, 2, 127, 128, 2**63]),
                        st.lists(st.text(max_size=4), max_size=3), st.lists(st.lists(st.integers(), max_size=2), max_size=3),
                        st.lists(st.integers(-5, 300), max_size=4), json_any)


@st.composite
def tokenizer_folders(draw) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    gen = draw(st.sampled_from(["ids", "ids", "ids", "badjson", "any", None]))
    if gen == "ids":
        files["generation_config.json"] = dump(draw(st.fixed_dictionaries(
            {"eos_token_id": st.one_of(deep_value, token_id_st)}, optional={"bos_token_id": token_id_st, "pad_token_id": token_id_st})))
    elif gen:
        files["generation_config.json"] = draw(bad_json_bytes if gen == "badjson" else json_any.map(dump))
    if draw(st.booleans()):
        files["tokenizer_config.json"] = draw(st.one_of(
            bad_json_bytes,
            st.fixed_dictionaries({}, optional={
                "chat_template": st.one_of(json_any, deep_value, st.lists(st.fixed_dictionaries(
                    {"name": json_leaf, "template": json_any}), max_size=2), st.text(max_size=20)),
                "eos_token": st.one_of(json_any, st.just("<|im_end|>")),
                "added_tokens_decoder": st.one_of(json_any, st.dictionaries(
                    st.one_of(st.text(max_size=4), st.integers(-5, 10**6).map(str)),
                    st.one_of(json_any, st.fixed_dictionaries({"content": json_leaf, "special": json_leaf})),
                    max_size=3)),
                "tokenizer_class": st.one_of(json_leaf, st.sampled_from(["LlamaTokenizer", "PreTrainedTokenizerFast"])),
                "auto_map": json_any,
                "model_max_length": _number_field(),
            }).map(dump),
            json_any.map(dump)))
    if draw(st.integers(0, 3)) == 0:
        files["config.json"] = dump(dict(BASE_CONFIG, eos_token_id=draw(token_id_st)))
    if not files:
        files["generation_config.json"] = dump({"eos_token_id": draw(token_id_st)})
    return files


# --- the properties -----------------------------------------------------------------------------

@pytest.fixture(scope="module", autouse=True)
def _warm(tiny_llama_dir):
    """Import transformers/torch once (seconds) so the per-example deadline measures the checks only."""
    verify_folder(tiny_llama_dir)
    judge({"model.safetensors": b"\0" * 8, "config.json": dump(BASE_CONFIG)}, TARGET)


@_settings(HEADER_EXAMPLES)
@given(st_file=safetensors_files(), with_config=st.booleans(), with_index=st.booleans())
def test_fuzz_safetensors_header(st_file, with_config, with_index):
    files = {"model.safetensors": st_file}
    if with_config:
        files["config.json"] = dump(BASE_CONFIG)
    if with_index:
        files["model.safetensors.index.json"] = dump({"metadata": {"total_size": 4},
                                                      "weight_map": {"a": "model.safetensors", "b": "gone.safetensors"}})
    judge(files, TARGET)


@_settings(CONFIG_EXAMPLES)
@given(cfg=config_files(), with_weights=st.booleans())
@example(cfg=dump(dict(BASE_CONFIG, max_position_embeddings=10**400, rope_scaling={"rope_type": "linear", "factor": 2.0})),
         with_weights=False)  # crash found once
def test_fuzz_config_json(cfg, with_weights):
    files = {"config.json": cfg}
    if with_weights:  # one well-formed tensor, so the dtype/quantization/architecture checks read headers too
        h = dump({"model.embed_tokens.weight": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}})
        files["model.safetensors"] = struct.pack("<Q", len(h)) + h + b"\0" * 4
    judge(files, TARGET)


@_settings(TOKENIZER_EXAMPLES)
@given(files=tokenizer_folders())
@example(files={"generation_config.json": ('{"eos_token_id": ' + deep(600, 2) + "}").encode()})  # crash found once
def test_fuzz_tokenizer_and_generation_config(tiny_llama_dir, files):
    """The tiny Llama (real tokenizer.json, weights) with hostile tokenizer_config/generation_config."""
    judge(files, Target(serve="chat"), copy_from=tiny_llama_dir)


# --- direct tests: memory bound, and one regression test per crash found --------------------------

@pytest.mark.parametrize(("claim", "reason"), [(100_000_000, "header_beyond_file"), (100_000_001, "header_too_large"),
                                                (2**63, "header_too_large"), (2**64 - 1, "header_too_large")])
def test_lying_header_length_is_refused_before_any_allocation(tmp_path, claim, reason):
    """A 12-byte file whose u64 claims 100 MB or 2^63: judged by the size check, in bounded memory."""
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", claim) + b"{}  ")
    tracemalloc.start()
    try:
        with pytest.raises(ValueError) as exc:
            read_safetensors_header(tmp_path / "model.safetensors")
        report = verify_folder(tmp_path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert exc.value.reason == reason
    assert peak < 10 * 2**20, peak
    assert [(f.code, f.severity.value) for f in report.findings if f.code.startswith("safetensors.")] == [
        (f"safetensors.header.{reason}", "error")]


def test_huge_shape_product_is_bounded_time():
    """Regression: a header of many huge dimensions made tensor_nbytes multiply quadratically large ints."""
    t = TensorInfo("w", "F16", (2**62,) * 200_000, 0, 4)
    start = time.perf_counter()
    n = tensor_nbytes(t)
    assert time.perf_counter() - start < 1.0
    assert n > 2**80
    assert tensor_nbytes(TensorInfo("w", "F16", (2**62,) * 1000 + (0,), 0, 0)) == 0


def test_huge_shape_is_a_size_mismatch(tmp_path):
    h = dump({"w": {"dtype": "F16", "shape": [2**64, 2**64], "data_offsets": [0, 4]}})
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(h)) + h + b"\0" * 4)
    r = verify_folder(tmp_path)
    assert [f.code for f in r.findings if f.code.startswith("safetensors.")] == ["safetensors.tensor.size_mismatch"]


def _cfg_codes(tmp_path, target=None, **changes):
    (tmp_path / "config.json").write_text(json.dumps(dict(BASE_CONFIG, **changes)))
    r = verify_folder(tmp_path, target)
    return r, [(f.code, f.severity.value, f.field) for f in r.findings if f.code.startswith(("config.", "internal."))]


def test_regression_rope_factor_beyond_float_range(tmp_path):
    """Crash found: math.isfinite(10**400) raised OverflowError in config.config_json and context_length."""
    r, codes = _cfg_codes(tmp_path, TARGET, rope_scaling={"rope_type": "linear", "factor": 10**400})
    assert codes == [("config.rope.bad_factor", "error", "rope_scaling.factor"),  # the bad factor is not applied:
                     ("config.max_len.exceeds_derived", "error", "max_position_embeddings")]  # 4096 > 256
    assert r.findings[[f.code for f in r.findings].index("config.rope.bad_factor")].value == 10**400


def test_regression_position_limit_beyond_float_range(tmp_path):
    """Crash found: max_position_embeddings 10**400 x rope factor 2.0 raised OverflowError (int to float)."""
    _, codes = _cfg_codes(tmp_path, TARGET, max_position_embeddings=10**400,
                          rope_scaling={"rope_type": "linear", "factor": 2.0})
    assert codes == []  # a (nonsense) limit above any --max-model-len: nothing exceeds it, nothing crashes
    _, codes = _cfg_codes(tmp_path, TARGET, max_position_embeddings=2**1023 + 2**1022,
                          rope_scaling={"rope_type": "dynamic", "factor": 999_999.0})
    assert codes == []


def test_regression_deeply_nested_json_value(tmp_path):
    """Crash found: a 600-deep eos_token_id parsed, then the finding's value broke Report.to_dict/to_json
    (RecursionError). Documents deeper than MAX_JSON_DEPTH are now refused as invalid JSON."""
    (tmp_path / "config.json").write_text(json.dumps(BASE_CONFIG))
    (tmp_path / "generation_config.json").write_text('{"eos_token_id": ' + deep(600, 2) + "}")
    r = verify_folder(tmp_path)
    got = [f for f in r.findings if f.code.startswith(("config.", "internal."))]
    assert [(f.code, f.severity.value, f.file) for f in got] == [
        ("config.generation_config.invalid", "warning", "generation_config.json")]
    assert f"nested deeper than {MAX_JSON_DEPTH} levels" in got[0].message
    json.loads(r.to_json())
    # just under the limit still parses and is judged on its merits
    (tmp_path / "generation_config.json").write_text('{"eos_token_id": ' + deep(MAX_JSON_DEPTH - 2, 2) + "}")
    r = verify_folder(tmp_path)
    assert [f.code for f in r.findings if f.code.startswith("config.")] == ["config.generation_config.bad_eos"]
    json.loads(r.to_json())
