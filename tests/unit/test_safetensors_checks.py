"""Header-only safetensors and index checks, on folders built by code."""

import json
import shutil
import struct

import pytest

from modelyard.model.checkpoint import MAX_HEADER_BYTES, SafetensorsHeaderError, read_safetensors_header
from modelyard.stages.verify import verify_folder
from tests.fixtures import write_safetensors


def codes(report):
    return [(f.code, f.severity.value) for f in report.findings]


def copy(src, dst):
    shutil.copytree(src, dst)
    for p in dst.iterdir():
        p.chmod(0o644)
    return dst


def test_healthy_tiny_llama_passes(tiny_llama_dir, tiny_sharded_dir):
    assert codes(verify_folder(tiny_llama_dir)) == []
    assert codes(verify_folder(tiny_sharded_dir)) == []


def test_missing_shard_names_file_and_tensors(tiny_sharded_dir, tmp_path):
    d = copy(tiny_sharded_dir, tmp_path / "m")
    index = json.loads((d / "model.safetensors.index.json").read_text())
    gone = "model-00006-of-00006.safetensors"
    expected = sorted(t for t, s in index["weight_map"].items() if s == gone)
    (d / gone).unlink()
    r = verify_folder(d)
    assert codes(r) == [("safetensors.index.missing_shard", "error")]
    f = r.findings[0]
    assert f.file == "model.safetensors.index.json"
    assert f.value == expected
    assert f.message == (f"model.safetensors.index.json maps {len(expected)} tensor(s) to {gone}, "
                         f"which is not in the folder: {', '.join(expected)}")
    assert not r.passed


def test_truncated_shard(tiny_llama_dir, tmp_path):
    d = copy(tiny_llama_dir, tmp_path / "m")
    p = d / "model.safetensors"
    data = p.read_bytes()
    p.write_bytes(data[:-1000])
    r = verify_folder(d)
    assert codes(r) == [("safetensors.data.truncated", "error")]
    h = read_safetensors_header(p)
    assert r.findings[0].message == (f"model.safetensors: the header needs {h.data_size + 1000} bytes of tensor data "
                                     f"but the file holds {h.data_size}; the last 1000 bytes are missing")


def test_lfs_pointer_is_one_error(tiny_llama_dir, tmp_path):
    d = copy(tiny_llama_dir, tmp_path / "m")
    (d / "model.safetensors").write_text("version https://git-lfs.github.com/spec/v1\noid sha256:"
                                         + "a" * 64 + "\nsize 140872\n")
    r = verify_folder(d)
    assert codes(r) == [("files.lfs_pointer", "error")]
    assert r.findings[0].value == 131


@pytest.mark.parametrize("header,data,header_len,reason", [
    ({}, b"", MAX_HEADER_BYTES + 1, "header_too_large"),
    ({}, b"", 10_000, "header_beyond_file"),
    (["a"], b"", None, "not_object"),
    ({"t": {"dtype": "F32", "shape": [2], "data_offsets": "x"}}, b"", None, "bad_entry"),
])
def test_header_errors(tmp_path, header, data, header_len, reason):
    p = write_safetensors(tmp_path / "x.safetensors", header, data, header_len)
    with pytest.raises(SafetensorsHeaderError) as ei:
        read_safetensors_header(p)
    assert ei.value.reason == reason


def test_too_small_and_bad_json(tmp_path):
    p = tmp_path / "a.safetensors"
    p.write_bytes(b"\x01\x02")
    with pytest.raises(SafetensorsHeaderError) as ei:
        read_safetensors_header(p)
    assert ei.value.reason == "too_small"
    p.write_bytes(struct.pack("<Q", 3) + b"{x}")
    with pytest.raises(SafetensorsHeaderError) as ei:
        read_safetensors_header(p)
    assert ei.value.reason == "bad_json"


def test_offsets_size_dtype(tiny_llama_dir, tmp_path):
    d = copy(tiny_llama_dir, tmp_path / "m")
    (d / "model.safetensors").unlink()
    hdr = {
        "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},  # overlaps a
        "c": {"dtype": "F32", "shape": [3], "data_offsets": [12, 20]},  # 12 bytes needed, span 8
        "d": {"dtype": "Q7", "shape": [1], "data_offsets": [20, 21]},
    }
    write_safetensors(d / "model.safetensors", hdr, b"\0" * 12)
    from modelyard.checks.base import CheckContext
    from modelyard.checks.safetensors import headers
    from modelyard.model.checkpoint import Checkpoint

    got = [(f.code, f.field) for f in headers(Checkpoint(d), CheckContext())]
    assert got == [("safetensors.tensor.size_mismatch", "c"), ("safetensors.tensor.unknown_dtype", "d"),
                   ("safetensors.offsets.not_contiguous", "b")]


def test_unindexed_shard_and_tensor_not_in_shard(tiny_sharded_dir, tmp_path):
    d = copy(tiny_sharded_dir, tmp_path / "m")
    idx = json.loads((d / "model.safetensors.index.json").read_text())
    idx["weight_map"]["model.extra.weight"] = "model-00001-of-00006.safetensors"
    (d / "model.safetensors.index.json").write_text(json.dumps(idx))
    shutil.copy(d / "model-00001-of-00006.safetensors", d / "stray.safetensors")
    r = verify_folder(d)
    assert codes(r) == [("safetensors.index.tensor_not_in_shard", "error"), ("safetensors.index.unindexed_shard", "warning")]
    assert r.findings[0].value == ["model.extra.weight"]


def test_no_config_and_pickle_only(tmp_path):
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x02}q\x00.")
    r = verify_folder(tmp_path)
    assert ("config.missing", "error") in codes(r)
    assert ("files.pickle_weights", "warning") in codes(r)
    assert ("files.no_safetensors", "warning") in codes(r)
    assert not r.passed


def test_tp_divisibility(tiny_llama_dir):
    from modelyard.checks import Target

    assert codes(verify_folder(tiny_llama_dir, Target(tensor_parallel_size=2))) == []
    r = verify_folder(tiny_llama_dir, Target(tensor_parallel_size=3))
    assert codes(r) == [("parallelism.heads_not_divisible", "error"), ("parallelism.row_input_not_divisible", "error")]
    assert r.findings[1].message == ("tensor_parallel_size 3: down_proj's input 128 does not split evenly over 3 "
                                     "ranks; valid sizes: 1, 2, 4")
    assert r.findings[0].message == ("tensor_parallel_size 3: 4 attention heads do not split evenly over 3 ranks; "
                                     "valid sizes: 1, 2, 4")
    assert r.findings[0].fix.startswith("Use --tensor-parallel-size 2 (valid: 1, 2, 4)")


def test_gqa_heads_not_divisible(tiny_llama_dir, tmp_path):
    d = copy(tiny_llama_dir, tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg["num_key_value_heads"] = 3
    (d / "config.json").write_text(json.dumps(cfg))
    r = verify_folder(d)
    # The stored k_proj/v_proj were made for 2 KV heads, so the architecture check sees their shapes too.
    assert codes(r) == [("architecture.shape_mismatch", "error"), ("parallelism.gqa_heads_not_divisible", "error")]
    assert r.findings[1].message == "num_attention_heads 4 is not a multiple of num_key_value_heads 3"
    assert r.findings[0].value == ["model.layers.0.self_attn.k_proj.weight [32, 64] (expected [48, 64])",
                                   "model.layers.0.self_attn.v_proj.weight [32, 64] (expected [48, 64])",
                                   "model.layers.1.self_attn.k_proj.weight [32, 64] (expected [48, 64])",
                                   "model.layers.1.self_attn.v_proj.weight [32, 64] (expected [48, 64])"]
