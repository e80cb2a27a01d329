"""Every folder of ../shared/cases judged as ingest judges it when the runtime venv exists: the hand rules
plus the runtime oracle and the dry load of the real vLLM (one runtime process for all of them). Each gets
its EXPECTED.json verdict, except where vLLM 0.32's own code decides otherwise, named here with the reason."""

from __future__ import annotations

import pytest

from modelyard.settings import Settings
from modelyard.stages.verify import verify_folder
from modelyard.stages.verify.runtime import ask_runtime_many
from tests.unit.test_shared_cases import SHARED_CASES, _cases, to_target, verdict

pytestmark = pytest.mark.vllm

#: (case, expected, vLLM 0.32's verdict, the finding that decides it)
RUNTIME_DECIDES = {
    # vLLM 0.32 no longer derives yarn's original_max_position_embeddings x factor as the limit
    "C05a-yarn-derived-len": ("pass", "error", "runtime.model_config.max_model_len_refused"),
    # targets ["Linear"] with an empty ignore list does not map to vLLM 0.32's ParallelLMHead, whose loader then
    # refuses lm_head.weight_shape ("There is no module or parameter named 'lm_head.weight_shape'"), on CPU and 9.0
    "C32-quantized-lm-head": ("warning", "error", "runtime.dry_load.rejected"),
}


def test_shared_cases_get_their_verdicts_with_the_runtime_oracle():
    if not SHARED_CASES.is_dir():
        pytest.skip("../shared/cases is not present")
    items = [(SHARED_CASES / p.values[0], to_target(p.values[1]), p.values[2]) for p in _cases()]
    items = [i for i in items if not i[1].vllm_version]  # another vLLM version: the local one does not judge it
    answers = ask_runtime_many([(d, t) for d, t, _ in items], Settings())
    got = {}
    for (d, t, exp), a in zip(items, answers):
        r = verify_folder(d, t, runtime_answer=a)
        v = verdict(r)
        if v != exp:
            got[d.name] = (exp, v, sorted({f.code for f in r.findings if f.severity.value == v})[0])
    assert len(items) == 62
    assert got == RUNTIME_DECIDES
