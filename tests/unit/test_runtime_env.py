"""The environment of a vLLM runtime subprocess (modelyard.runtime.venv.runtime_env): vLLM's own cache is
kept between runs, per runtime interpreter, unless the setting says ``off`` or the folder cannot be made."""

from __future__ import annotations

import hashlib
from pathlib import Path

from modelyard.runtime.venv import runtime_env, vllm_cache_root
from modelyard.settings import Settings


def _key(python: Path) -> str:
    return hashlib.sha256(str(python.absolute()).encode()).hexdigest()[:12]


def test_the_vllm_cache_is_kept_under_the_store_per_interpreter(tmp_path):
    py = tmp_path / "venv" / "bin" / "python"
    s = Settings(home=tmp_path / "store", vllm_python=py, vllm_cache=None)
    root = tmp_path / "store" / ".cache" / "vllm" / _key(py)
    assert vllm_cache_root(s, str(tmp_path / "t")) == str(root) and root.is_dir()
    other = Settings(home=tmp_path / "store", vllm_python=tmp_path / "cand" / "bin" / "python", vllm_cache=None)
    assert Path(vllm_cache_root(other, str(tmp_path / "t"))).parent == root.parent
    assert vllm_cache_root(other, str(tmp_path / "t")) != str(root)
    env = runtime_env(s, str(tmp_path / "t"))
    assert (env["VLLM_CACHE_ROOT"], env["HF_HOME"], env["TMPDIR"]) == (str(root), f"{tmp_path}/t/hf", f"{tmp_path}/t")


def test_a_named_cache_folder_off_and_an_unwritable_one(tmp_path):
    py = tmp_path / "py"
    named = Settings(home=tmp_path / "store", vllm_python=py, vllm_cache=str(tmp_path / "shared"))
    assert vllm_cache_root(named, "/t") == str(tmp_path / "shared" / _key(py))
    assert vllm_cache_root(Settings(vllm_python=py, vllm_cache="off"), "/t") == "/t/vllm"
    (tmp_path / "file").write_text("not a folder")
    blocked = Settings(vllm_python=py, vllm_cache=str(tmp_path / "file"))
    assert vllm_cache_root(blocked, "/t") == "/t/vllm"


def test_the_load_smoke_runs_inline_but_for_int8_activations(tmp_path):
    from modelyard.stages.smoke import _inline

    plain, w8a8 = tmp_path / "plain", tmp_path / "w8a8"
    for d, cfg in ((plain, {"model_type": "llama"}),
                   (w8a8, {"quantization_config": {"config_groups": {"g": {"input_activations": {"type": "int", "num_bits": 8}}}}})):
        d.mkdir()
        (d / "config.json").write_text(__import__("json").dumps(cfg))
    assert [_inline(d, Settings(smoke_engine="inline")) for d in (plain, w8a8, tmp_path / "none")] == [True, False, True]
    assert _inline(plain, Settings(smoke_engine="process")) is False
