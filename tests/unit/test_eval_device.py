"""Where the quality evaluation runs: the same code on CPU and on a GPU (inputs follow the model)."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from modelyard.runtime.scripts import quality as _quality
from modelyard.settings import Settings
from modelyard.stages import quantize as q
from tests.fixtures import make_tiny_llama


def test_model_device_is_where_the_weights_are():
    assert _quality.model_device(torch.nn.Linear(2, 2)) == torch.device("cpu")
    assert _quality.model_device(torch.nn.Linear(2, 2, device="meta")) == torch.device("meta")
    assert _quality.model_device(torch.nn.ReLU()) == torch.device("cpu")  # no parameters


def test_eval_device_follows_the_setting_then_torch(monkeypatch):
    monkeypatch.setenv("MODELYARD_EVAL_DEVICE", "cuda:1")
    assert q.eval_device(Settings()) == "cuda:1"
    monkeypatch.delenv("MODELYARD_EVAL_DEVICE")
    assert q.eval_device(Settings()) == ("cuda" if torch.cuda.is_available() else "cpu")


def test_compare_a_model_with_itself_on_its_device(tmp_path):
    d = make_tiny_llama(tmp_path / "m")
    load = lambda: AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32).to(q.eval_device(Settings()))  # noqa: E731
    m = _quality.compare(load, load, [[1, 5, 7, 9, 11], [4, 6, 8]])
    assert (m["ppl_ratio"], m["kl_mean"], m["tokens"]) == (1.0, 0.0, 6)
