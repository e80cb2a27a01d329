"""patch repairs ``tokenizer.eos_token.disagrees``: the tokenizer's eos becomes the first configured eos id's token."""

from __future__ import annotations

import json

import pytest

from modelyard.stages.patch import apply_plan, plan_patches
from modelyard.stages.verify import verify_folder
from tests.unit.test_checks_defects import copy, edit_json

CODE = "tokenizer.eos_token.disagrees"


@pytest.fixture
def wrong_eos(tiny_llama_dir, tmp_path):
    """The tiny Llama (config/generation eos 2 = ``<|im_end|>``) whose tokenizer says eos ``<s>`` (id 1, the bos)."""
    d = copy(tiny_llama_dir, tmp_path / "wrong-eos")
    edit_json(d / "tokenizer_config.json", eos_token="<s>")
    return d


def _codes(d) -> list[str]:
    return [f.code for f in verify_folder(d).findings]


def test_eos_token_string_is_repaired_once(wrong_eos):
    assert CODE in _codes(wrong_eos)
    plan = plan_patches(wrong_eos, verify_folder(wrong_eos))
    assert [(op.file, op.pointer, op.old, op.new, op.code) for op in plan.ops] == [
        ("tokenizer_config.json", "/eos_token", "<s>", "<|im_end|>", CODE)]
    apply_plan(plan, wrong_eos)
    assert json.loads((wrong_eos / "tokenizer_config.json").read_text())["eos_token"] == "<|im_end|>"
    after = verify_folder(wrong_eos)
    assert CODE not in [f.code for f in after.findings]
    assert plan_patches(wrong_eos, after).empty


def test_eos_token_added_token_dict_and_stale_id(wrong_eos):
    """An AddedToken dict keeps its flags (only ``content`` changes); a stale ``eos_token_id`` follows;
    generation_config's eos wins over config.json's."""
    edit_json(wrong_eos / "tokenizer_config.json", eos_token_id=1,
              eos_token={"__type": "AddedToken", "content": "<s>", "lstrip": False, "normalized": False,
                         "rstrip": False, "single_word": False, "special": True})
    edit_json(wrong_eos / "generation_config.json", eos_token_id=[3, 2])
    assert CODE in _codes(wrong_eos)
    plan = plan_patches(wrong_eos, verify_folder(wrong_eos))
    assert [(op.file, op.pointer, op.old, op.new) for op in plan.ops] == [
        ("tokenizer_config.json", "/eos_token/content", "<s>", "<|im_start|>"),
        ("tokenizer_config.json", "/eos_token_id", 1, 3)]
    apply_plan(plan, wrong_eos)
    tc = json.loads((wrong_eos / "tokenizer_config.json").read_text())
    assert tc["eos_token"] == {"__type": "AddedToken", "content": "<|im_start|>", "lstrip": False,
                               "normalized": False, "rstrip": False, "single_word": False, "special": True}
    after = verify_folder(wrong_eos)
    assert CODE not in [f.code for f in after.findings]
    assert plan_patches(wrong_eos, after).empty
