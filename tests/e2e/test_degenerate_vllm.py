"""A model that answers one repeated token never passes a smoke, in completion mode too (where
``finish_reason`` ``length`` is otherwise fine): a tiny Llama built so that greedy decoding can only
ever pick ``w5`` (every decoder layer's output projections zero, every embedding row the same, the head
scoring only ``w5``) is smoked in a real vLLM (CPU). Both implementations agree on its numbers, so only
the degenerate-answer check can fail it, and it must."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from modelyard.settings import Settings
from modelyard.stages.smoke import smoke_load
from tests.fixtures import VOCAB, make_tiny_llama

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]


def make_one_word_llama(out):
    make_tiny_llama(out, hidden=128, intermediate=256)  # head_dim 32: vLLM CPU attention needs >= 32
    path = out / "model.safetensors"
    t = load_file(str(path))
    for name in t:
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            t[name] = torch.zeros_like(t[name])  # the residual stream stays the token's embedding
    t["model.embed_tokens.weight"] = torch.full_like(t["model.embed_tokens.weight"], 0.5)
    head = torch.zeros_like(t["lm_head.weight"])
    head[VOCAB.index("w5")] = 1.0
    t["lm_head.weight"] = head
    save_file(t, str(path), metadata={"format": "pt"})
    return out


def test_one_repeated_token_fails_the_completion_smoke(tmp_path):
    d = make_one_word_llama(tmp_path / "one-word")
    r = smoke_load(d, Settings(home=tmp_path / "home"), question="w1 w2 w3", max_tokens=16, mode="completion",
                   timeout=600)
    assert (r.passed, r.finish_reason, r.completion_tokens) == (False, "length", 16)
    assert r.text.split() == ["w5"] * 16
    judged = [(f["code"], f["severity"]) for f in r.findings]
    assert judged == [("smoke.numeric.bound_not_judged", "info"), ("smoke.answer.degenerate", "error")]
    assert r.error == ("the smoke's answer is degenerate: the answer repeats the 1-item cycle [9] over its last 16 "
                       "of 16 items up to the length limit")
    # the two implementations agree on it: agreement alone would have passed it
    n = r.numeric
    assert (n["compared"], n["bound_judged"]) == (True, False)
    assert not [f for f in r.findings if f["code"] == "smoke.numeric.disagreement"]
