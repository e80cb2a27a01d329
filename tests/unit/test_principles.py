"""Rules by principle (modelyard/checks/principles.py): mutants of each principle built by code, several fields
each, beside healthy twins that state the same fact twice in agreement (or name only modules that exist)."""

from __future__ import annotations

import json

import pytest

from modelyard.checks import CheckContext, Target
from modelyard.checks.principles import STATED_TWICE, module_names, names_resolve, stated_twice
from modelyard.model.checkpoint import Checkpoint
from modelyard.stages.verify import verify_folder
from tests.unit.test_checks_defects import copy, edit_json


def _set(doc: dict, path: str, value) -> None:
    *parents, last = path.split(".")
    for p in parents:
        doc = doc.setdefault(p, {})
    doc[last] = value


def _config(d, **paths) -> None:
    cfg = json.loads((d / "config.json").read_text())
    for path, value in paths.items():
        if value is None:
            cfg.pop(path, None)
        else:
            _set(cfg, path.replace("__", "."), value)
    (d / "config.json").write_text(json.dumps(cfg))


def _found(d, check) -> list[tuple[str, str, object]]:
    return [(f.code, f.severity.value, f.value) for f in check(Checkpoint(d), CheckContext(target=Target()))]


#: per fact of the table: (value at a, a value of b that disagrees)
VALUES = {"config.stated_twice.dtype": ("float32", "bfloat16"),
          "config.stated_twice.rope_theta": (10000.0, 500000.0),
          "config.stated_twice.rope_type": ("llama3", "linear"),
          "config.stated_twice.rope_factor": (8.0, 4.0),
          "config.stated_twice.tie_word_embeddings": (True, False),
          "config.stated_twice.vocab_size": (128, 256),
          "config.stated_twice.max_position_embeddings": (256, 131072),
          "config.stated_twice.rope_theta_text": (10000.0, 1000000.0)}


@pytest.mark.parametrize("twice", STATED_TWICE, ids=lambda t: t.code.rpartition(".")[2])
def test_a_fact_stated_twice_must_agree(tiny_llama_dir, tmp_path, twice):
    va, vb = VALUES[twice.code]
    bad, twin = copy(tiny_llama_dir, tmp_path / "bad"), copy(tiny_llama_dir, tmp_path / "twin")
    _config(bad, **{twice.a[0].replace(".", "__"): va, twice.b[0].replace(".", "__"): vb})
    _config(twin, **{twice.a[0].replace(".", "__"): va, twice.b[0].replace(".", "__"): va})
    assert _found(bad, stated_twice) == [(twice.code, twice.severity.value, {twice.a[0]: va, twice.b[0]: vb})]
    assert _found(twin, stated_twice) == []


def test_the_message_names_both_places_and_the_runtime_behaviour(tiny_llama_dir, tmp_path):
    d = copy(tiny_llama_dir, tmp_path / "m")
    _config(d, torch_dtype="bfloat16", dtype="float16")
    (f,) = stated_twice(Checkpoint(d), CheckContext(target=Target()))
    assert f.message == ("config.json states dtype twice and the two disagree: torch_dtype is 'bfloat16', dtype is "
                         "'float16'; transformers 5 and vLLM on it read dtype, transformers 4 reads torch_dtype: the "
                         "weights are served in a different precision by version")
    assert (f.file, f.field) == ("config.json", "dtype")
    # spellings of one dtype agree; the rope type may be spelt "type" (transformers 4's older key)
    _config(d, torch_dtype="torch.bfloat16", dtype="bf16")
    assert _found(d, stated_twice) == []
    _config(d, dtype=None, rope_scaling={"type": "yarn", "factor": 4.0},
            rope_parameters={"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0})
    assert [c for c, _, _ in _found(d, stated_twice)] == ["config.stated_twice.rope_type"]


def test_do_sample_false_beside_sampling_values(tiny_llama_dir, tmp_path):
    d = copy(tiny_llama_dir, tmp_path / "m")
    edit_json(d / "generation_config.json", do_sample=False, temperature=0.6, top_p=0.9, top_k=50)
    assert _found(d, stated_twice) == [("config.stated_twice.do_sample", "warning",
                                        {"do_sample": False, "temperature": 0.6, "top_p": 0.9})]
    edit_json(d / "generation_config.json", temperature=None, top_p=None)  # greedy and nothing else: one statement
    assert _found(d, stated_twice) == []
    edit_json(d / "generation_config.json", do_sample=True, temperature=0.6)  # sampling, stated once
    assert _found(d, stated_twice) == []


def test_every_name_a_quantization_list_refers_to_must_resolve(tiny_llama_dir, tmp_path):
    d = copy(tiny_llama_dir, tmp_path / "m")
    mods = module_names(Checkpoint(d).tensors)
    assert {"model.layers.0.mlp.down_proj", "model.layers.0.self_attn.qkv_proj", "model.embed_tokens"} <= mods
    _config(d, quantization_config={"quant_method": "compressed-tensors", "ignore": [
        "model.embed_tokens", "re:.*down_proj$", "q_proj", "Linear", "model.vision_tower", "re:.*visual.*", "re:("]})
    assert _found(d, names_resolve) == [("quantization.name_unresolved", "warning",
                                         ["model.vision_tower", "re:.*visual.*", "re:("])]
    _config(d, quantization_config={"quant_method": "awq", "modules_to_not_convert": ["visual", "mlp", "lm_head", "vision_tower"]})
    assert _found(d, names_resolve) == [("quantization.name_unresolved", "warning", ["visual", "vision_tower"])]
    _config(d, quantization_config={"quant_method": "awq", "modules_to_not_convert": ["mlp.down_proj", "embed_tokens"]})
    assert _found(d, names_resolve) == []


def test_the_healthy_folder_gets_no_principle_finding(tiny_llama_dir):
    codes = [f.code for f in verify_folder(tiny_llama_dir, Target()).findings]
    assert [c for c in codes if c.startswith(("config.stated_twice", "quantization.name_unresolved"))] == []


def test_the_fast_tier_selects_by_the_tier_markers():
    """`make test-fast` is `pytest -m unit`: the tier markers (tests/suite_clock.py) must be on the items before
    `-m` deselects (they were added after it, and `-m unit` collected no test)."""
    import subprocess
    import sys

    def collected(marker: str) -> str:
        out = subprocess.run([sys.executable, "-m", "pytest", "-m", marker, "--collect-only", "-q", "-p",
                              "no:cacheprovider", "tests/unit/test_principles.py"], capture_output=True, text=True,
                             timeout=300)
        return out.stdout.strip().splitlines()[-1]

    assert collected("unit").startswith("13 tests collected")
    assert collected("slow").startswith("no tests collected (13 deselected)")
