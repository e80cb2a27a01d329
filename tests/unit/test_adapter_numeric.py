"""The LoRA adapter's numerical gate (checks.adapter_numeric): the base's NLL with and without the adapter, on
figures with exact values."""

from __future__ import annotations

import math

import pytest

from modelyard.checks import adapter_numeric
from modelyard.checks.adapter_numeric import NLL_INCREASE_MAX, judge_adapter
from modelyard.checks.numeric import TextFigures, summary_line
from modelyard.checks.report import numeric_md

pytestmark = pytest.mark.unit


def _t(name: str, tokens: int, ppl: float, cont: str | None = " and so on") -> TextFigures:
    return TextFigures(name=name, tokens=tokens, ppl_vllm=round(ppl, 4), continuation=cont)  # as text_figures rounds


BASE = [_t("prose-en", 101, 20.0), _t("code-python", 51, 4.0)]


def test_an_adapter_that_keeps_the_numbers_passes_with_its_figures():
    adapter = [_t("prose-en", 101, 20.0 * math.e ** 0.3), _t("code-python", 51, 4.0 * math.e ** 0.6)]
    rec, found = judge_adapter(adapter, BASE, 49152, reference="vLLM 0.32.0")
    assert found == []
    # token-weighted: (0.3 * 100 + 0.6 * 50) / 150
    assert (rec["passed"], rec["nll_increase_mean"], rec["nll_increase_worst"], rec["ppl_ratio_mean"]) == (
        True, 0.4, 0.6, round(math.exp(0.4), 4))
    assert [(t["name"], t["ppl_base"], t["nll_increase"]) for t in rec["texts"]] == [
        ("prose-en", 20.0, 0.3), ("code-python", 4.0, 0.6)]
    assert summary_line(rec) == ("numerical gate: passed; the adapter against its base (vLLM 0.32.0): NLL +0.4 "
                                 "nats/token, perplexity x1.4918 (limit +1.5), worst text +0.6")
    md = numeric_md(rec, [])
    assert md[1] == "### Numerical gate, the adapter against its base (vLLM 0.32.0): passed"
    assert md[-1] == "| code-python | 51 | 4.0 | 7.2885 | 0.6 | ' and so on' |"


def test_an_adapter_that_wrecks_the_numbers_fails_with_the_fix():
    adapter = [_t("prose-en", 101, 20.0 * math.e ** 2.0), _t("code-python", 51, 4.0 * math.e ** 0.5)]
    rec, found = judge_adapter(adapter, BASE, 49152)
    assert rec["passed"] is True and rec["nll_increase_mean"] == 1.5 and NLL_INCREASE_MAX == 1.5  # at the limit: passes
    adapter[0] = _t("prose-en", 101, 20.0 * math.e ** 2.1)
    rec, found = judge_adapter(adapter, BASE, 49152)
    assert [f.code for f in found] == ["smoke.numeric.adapter_degrades"]
    assert found[0].message.startswith("the adapter raises its base's negative log-likelihood on the reference texts by "
                                       "1.567 nats per token (perplexity x4.79; limit 1.5, x4.48)")
    assert (found[0].value, found[0].limit, rec["passed"]) == ({"nll_increase_mean": 1.5667}, {"nll_increase_mean": 1.5},
                                                                False)


def test_a_looping_continuation_through_the_adapter_fails_and_an_empty_one_does_not():
    adapter = [_t("prose-en", 101, 21.0, cont=""), _t("code-python", 51, 4.1, cont=" \n \n \n")]
    rec, found = judge_adapter(adapter, BASE, 49152)
    assert [f.code for f in found] == ["smoke.numeric.degenerate_continuation"]
    assert found[0].value == {"code-python": " \n \n \n"}
    # a test model's vocabulary: continuations say nothing
    assert judge_adapter(adapter, BASE, 128)[1] == []


def test_texts_that_differ_are_refused():
    with pytest.raises(ValueError, match="are not the base's"):
        judge_adapter(BASE[:1], BASE, 49152)
    assert adapter_numeric.SOURCE.startswith("an adapter must not wreck its base's numbers")
