"""The numerical gate's judgement on exact values: agreement, the perplexity bound, degenerate answers."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from modelyard.checks import numeric


def _record(ids, actual, tops):
    """A runner record: ``actual[i]`` the actual token's log-probability, ``tops[i]`` vLLM's top list."""
    return {"ids": ids, "logprobs": [None, *actual], "top": [[], *tops], "continuation": " and so on"}


def test_identical_views_agree_exactly():
    lp = math.log(0.5)
    rec = _record([1, 7, 8], [lp, lp], [[[7, lp], [9, math.log(0.25)]], [[8, lp], [9, math.log(0.25)]]])
    ref = [{"actual": lp, "top": [lp, math.log(0.25)], "argmax": 7, "max": lp},
           {"actual": lp, "top": [lp, math.log(0.25)], "argmax": 8, "max": lp}]
    fig = numeric.text_figures("t", rec, ref)
    assert (fig.tokens, fig.ppl_vllm, fig.ppl_reference, fig.ppl_ratio, fig.kl_mean, fig.top1, fig.max_abs_diff) == (
        3, 2.0, 2.0, 1.0, 0.0, 1.0, 0.0)


def test_kl_over_the_top_k_partition():
    # vLLM: p = (0.5, 0.25, rest 0.25); reference: q = (0.25, 0.25, rest 0.5)
    kl = numeric._kl_partition([math.log(0.5), math.log(0.25)], [math.log(0.25), math.log(0.25)])
    assert kl == pytest.approx(0.5 * math.log(2) + 0.25 * math.log(0.5), abs=1e-12)


def test_near_ties_count_as_top1_agreement_and_real_misses_do_not():
    a, b = math.log(0.30), math.log(0.29)
    rec = _record([1, 2, 3], [a, a], [[[2, a], [5, b]], [[3, a], [5, b]]])
    ref = [{"actual": b, "top": [b, a], "argmax": 5, "max": a},  # swapped, 0.034 nats apart: a tie
           {"actual": math.log(0.1), "top": [math.log(0.1), math.log(0.6)], "argmax": 5, "max": math.log(0.6)}]
    assert numeric.text_figures("t", rec, ref).top1 == 0.5


def _fig(name, ppl, *, tokens=101, kl=0.0, top1=1.0, ratio=1.0, prose=False, compared=True):
    return numeric.TextFigures(name=name, tokens=tokens, ppl_vllm=ppl, ppl_reference=ppl / ratio if compared else None,
                               ppl_ratio=ratio if compared else None, kl_mean=kl if compared else None,
                               top1=top1 if compared else None, prose=prose)


def test_healthy_figures_pass():
    v, f = numeric.judge([_fig("prose-en", 22.25, prose=True), _fig("code", 3.1)], 49152)
    assert (v.passed, v.compared, v.bound_judged, v.prose_ppl, [x.code for x in f]) == (True, True, True, 22.25, [])


def test_a_wrong_tokenizer_fails_the_bound_though_both_implementations_agree():
    # the Gemma-3 GGUF import: 962.8 in vLLM and in transformers
    v, f = numeric.judge([_fig("prose-en", 962.8, prose=True, tokens=337)], 262144)
    assert (v.passed, [x.code for x in f]) == (False, ["smoke.numeric.perplexity_bound"])
    assert (f[0].value, f[0].limit) == ({"prose-en": 962.8}, {"prose-en": 100.0})
    assert f[0].message == ("perplexity above the bound that working language models meet on 1 of 1 reference text(s): "
                            "prose-en 962.8 > 100 (337 tokens): the model, or the tokenizer that feeds it, is broken")


def test_every_text_is_judged_against_its_own_bound():
    """Code whose whitespace the tokenizer cannot reach is judged by its own number, not by prose's alone."""
    figs = [_fig("prose-en", 17.9, prose=True), replace(_fig("code-python", 41.5), ppl_bound=16.0),
            replace(_fig("prose-es", 185.9), ppl_bound=750.0), _fig("unbounded", 5000.0)]
    v, f = numeric.judge(figs, 262144)
    assert (v.passed, v.bound_judged, v.ppl_bound, [x.code for x in f]) == (
        False, True, 100.0, ["smoke.numeric.perplexity_bound"])
    assert (f[0].value, f[0].limit) == ({"code-python": 41.5}, {"code-python": 16.0})
    assert "on 1 of 3 reference text(s): code-python 41.5 > 16 (101 tokens)" in f[0].message
    fig = numeric.text_figures("prose-en", _record([1, 7], [math.log(0.5)], [[[7, math.log(0.5)]]]), None, prose=True)
    assert (fig.ppl_bound, numeric.text_bound(fig)) == (100.0, 100.0)


def test_disagreement_names_the_text_and_the_limits():
    v, f = numeric.judge([_fig("prose-en", 22.0, prose=True), _fig("code", 3.0, kl=0.5, top1=0.6, ratio=1.4)], 49152)
    assert (v.passed, [x.code for x in f], v.kl_mean, v.top1, v.ppl_ratio_worst) == (
        False, ["smoke.numeric.disagreement"], 0.25, 0.8, 1.4)
    assert f[0].message.startswith("vLLM and transformers disagree on the same token ids (limits: KL <= 0.02, top-1 >= 0.9,"
                                   " perplexity ratio <= 1.05): code: KL 0.5, top-1 0.600, perplexity x1.4")
    assert (f[0].value, f[0].limit) == ({"kl_mean": 0.25, "top1": 0.8, "ppl_ratio_worst": 1.4},
                                        {"kl_mean": 0.02, "top1": 0.9, "ppl_ratio_worst": 1.05})


def test_quantized_limits_are_looser():
    figs = [_fig("prose-en", 25.0, prose=True, kl=0.05, top1=0.9, ratio=1.1)]
    assert numeric.judge(figs, 49152)[0].passed is False
    assert numeric.judge(figs, 49152, quantized=True)[0].passed is True


def test_a_small_test_vocabulary_is_judged_by_agreement_alone_and_says_so():
    v, f = numeric.judge([_fig("prose-en", 140.0, prose=True)], 128)
    assert (v.passed, v.bound_judged, [x.code for x in f]) == (True, False, ["smoke.numeric.bound_not_judged"])
    assert v.bound_not_judged.startswith("a vocabulary of 128 tokens is below 1000")


def test_not_compared_is_a_warning_never_silence():
    v, f = numeric.judge([_fig("prose-en", 22.0, prose=True, compared=False)], 49152, not_compared="too big")
    assert (v.passed, v.compared, [(x.code, x.severity.value) for x in f]) == (
        True, False, [("smoke.numeric.not_compared", "warning")])


@pytest.mark.parametrize(("seq", "finish", "expected"), [
    ([7] * 64, "length", "the answer repeats the 1-item cycle [7] over its last 64 of 64 items up to the length limit"),
    ([1, 2, 3] + [5, 6] * 20, "length", "the answer repeats the 2-item cycle [5, 6] over its last 40 of 43 items up to the length limit"),
    ([7] * 64, "stop", None),  # it stopped: not run to the limit
    (list(range(64)), "length", None),
    ([7] * 11, "length", None),  # too short to judge
    (list(range(40)) + [7] * 20, "length", None),  # less than half the answer
    ([2, 2], "stop", "the answer is 2 special tokens and no text"),
])
def test_degenerate_answers(seq, finish, expected):
    assert numeric.degenerate(seq, finish_reason=finish, special=frozenset({2})) == expected


def test_the_gemma_answer_is_degenerate_by_words_too():
    words = ("is " * 64).split()
    assert numeric.degenerate(words, finish_reason="length") == (
        "the answer repeats the 1-item cycle ['is'] over its last 64 of 64 items up to the length limit")


@pytest.mark.parametrize(("text", "expected"), [
    (None, None),
    ("", "empty (the end of text or special tokens only)"),
    (" \n \n \n \n", "whitespace only (8 characters)"),  # the Gemma-3 GGUF import's code continuation
    (" is" * 16, "the words ['is'] repeated"),
    (" a b" * 6, "the words ['a', 'b'] repeated"),
    (" a b" * 5, None),  # 10 words: a 16-token continuation of a real text may loop that short
    ("\n\nEl cielo, el cielo, el cielo", None),  # SmolLM2-135M-Instruct on prose-es, a healthy model
    ("```\n\nThis script uses the `read_lines` function to read a", None),
])
def test_degenerate_continuations(text, expected):
    assert numeric.degenerate_continuation(text) == expected


def test_a_degenerate_continuation_of_any_text_fails_the_gate_though_both_agree():
    code = replace(_fig("code-python", 3.9), continuation=" \n \n \n \n")
    prose = replace(_fig("prose-en", 17.9, prose=True), continuation=" said he, and")
    v, f = numeric.judge([prose, code], 262144)
    assert (v.passed, [x.code for x in f]) == (False, ["smoke.numeric.degenerate_continuation"])
    assert f[0].message == ("the greedy continuation of 1 of 2 reference text(s) is degenerate: code-python: "
                            "whitespace only (8 characters) (' \\n \\n \\n \\n')")
    assert f[0].value == {"code-python": " \n \n \n \n"}
    # a random-weight test model (a vocabulary below the bound's minimum) continues with anything
    v, f = numeric.judge([prose, code], 128)
    assert v.passed and "smoke.numeric.degenerate_continuation" not in [x.code for x in f]


def test_the_early_reference_reads_the_same_rows_and_reruns_texts_whose_ids_differ(tiny_llama_dir):
    """The reference started beside vLLM gives what the reference after vLLM gives, on the same ids; a
    record whose ids are not the early ones (another tokenizer) is run again on its own ids."""
    from modelyard.stages.smoke import numeric as stage

    ids = stage.early_ids(tiny_llama_dir, 256)
    assert len(ids) == len(stage.reference_texts()) and all(len(i) >= 2 for i in ids)
    records = [{"ids": i, "top": [[]] + [[[5, -1.0], [6, -2.0]]] * (len(i) - 1)} for i in ids]
    other = {"ids": [1, 7, 8, 9], "top": [[]] + [[[5, -1.0]]] * 3}
    early = stage.EarlyReference(tiny_llama_dir, 256)
    got = stage.reference_logprobs(tiny_llama_dir, records + [other], early)
    want = stage.reference_logprobs(tiny_llama_dir, records + [other])
    assert got == want
    assert [len(rows) for rows in got] == [len(i) - 1 for i in ids] + [3]
    assert set(early.result()[1]) == {tuple(i) for i in ids}


def test_the_early_reference_starts_only_where_both_fit(tiny_llama_dir, tmp_path):
    from modelyard.stages.smoke import numeric as stage

    small, big = tmp_path / "small", tmp_path / "big"
    small.write_text("MemAvailable:    1000000 kB\n")  # 1.02 GB: less than the KV cache alone
    big.write_text("MemAvailable:    20480000 kB\n")
    kv = 2**30
    assert stage.overlap_fits(tiny_llama_dir, 128, kv, small) is False
    assert stage.overlap_fits(tiny_llama_dir, 128, kv, big) is True
    assert stage.start_early_reference(tiny_llama_dir, 256, kv, small) is None
    assert isinstance(stage.start_early_reference(tiny_llama_dir, 256, kv, big), stage.EarlyReference)


def test_the_console_line_names_the_verdict_the_bound_and_the_agreement():
    n = {"passed": True, "compared": True, "bound_judged": True, "prose_ppl": 22.2474, "ppl_bound": 100.0,
         "reference": "transformers 5.17.0, float32, CPU", "kl_mean": 0.000721, "top1": 0.9825, "ppl_ratio_worst": 1.00729}
    assert numeric.summary_line(n) == (
        "numerical gate: passed; English prose perplexity 22.2474 (bound 100.0); against transformers 5.17.0, "
        "float32, CPU: mean KL 0.000721 nats/token, top-1 0.9825, worst perplexity ratio 1.00729")
    tiny = {"passed": False, "compared": False, "bound_judged": False, "bound_not_judged": "vocabulary of 128 tokens",
            "not_compared": "float32 weights and working memory need about 9.0 GB"}
    assert numeric.summary_line(tiny) == (
        "numerical gate: FAILED; perplexity bound not judged (vocabulary of 128 tokens); not compared: float32 "
        "weights and working memory need about 9.0 GB")
    assert numeric.summary_line(None) == "numerical gate: not run"
    # vLLM in float32 (an AMX host) against transformers in float32: the mean KL rounds to 0 at 6 decimals
    exact = {**n, "prose_ppl": 22.2485, "kl_mean": 0.0, "top1": 1.0, "ppl_ratio_worst": 1.0}
    assert numeric.summary_line(exact).endswith("mean KL < 0.000001 nats/token, top-1 1.0, worst perplexity ratio 1.0")


def test_dry_load_that_could_not_run_is_not_judged_never_a_pass():
    from modelyard.checks.base import Target
    from modelyard.stages.verify.runtime import dry_load_findings

    fs = dry_load_findings({"ok": False, "error": "ImportError: x"}, "0.32.0", Target())
    assert [(f.code, f.severity.value) for f in fs] == [("runtime.dry_load.not_judged", "not_judged")]
    assert dry_load_findings({"ok": True, "stage": "done", "target": "host", "tensor_parallel_size": 1}, "0.32.0",
                             Target()) == []
    fs = dry_load_findings({"ok": True, "stage": "track", "error": "ValueError", "uninitialized": ["a.weight", "b.weight"],
                            "target": "host", "tensor_parallel_size": 1}, "0.32.0", Target())
    assert [(f.code, f.field, f.value) for f in fs] == [("runtime.dry_load.uninitialized", "a.weight",
                                                         ["a.weight", "b.weight"])]


def test_a_derived_artifact_is_judged_against_its_parent_one_sided():
    # a quantized artifact that scores better than its parent on one text is no defect; one that departs is
    figs = [_fig("prose-en", 23.0, kl=0.04, top1=0.85, ratio=1.04), _fig("code", 3.0, kl=0.02, top1=0.9, ratio=0.97)]
    rec, f = numeric.judge_parent(figs, quantized=True, reference="r")
    assert (rec["compared"], rec["kl_mean"], rec["top1"], rec["ppl_ratio_worst"], f) == (True, 0.03, 0.875, 1.04, [])
    assert rec["ppl_ratio_mean"] == round(math.exp((math.log(1.04) + math.log(0.97)) / 2), 5)
    rec, f = numeric.judge_parent(figs, quantized=False)  # a patch changes no weight: the tight limits
    assert [(x.code, x.severity.value) for x in f] == [("smoke.numeric.parent_disagreement", "error")]
    assert f[0].message == ("the served artifact departs from its parent checkpoint (limits: KL <= 0.02, top-1 >= 0.9, "
                            "perplexity ratio <= 1.05): prose-en: KL 0.04, top-1 0.850, perplexity x1.04")
    assert f[0].limit == {"kl_mean": 0.02, "top1": 0.9, "ppl_ratio_worst": 1.05}


def test_a_parent_that_could_not_run_is_not_compared_never_a_pass():
    rec, f = numeric.judge_parent([_fig("prose-en", 23.0, compared=False)], quantized=True, not_compared="too big")
    assert (rec["compared"], rec["not_compared"], [(x.code, x.severity.value) for x in f]) == (
        False, "too big", [("smoke.numeric.parent_not_compared", "warning")])


def test_a_clean_dry_load_decides_the_weight_layout_rules():
    # a q_proj.bias on a Llama without attention_bias: vLLM's Llama loader skips it and answers as the healthy
    # model (differential family loader-weights); the hand rule's error becomes a warning, other errors stay
    from modelyard.checks.base import Finding, Severity
    from modelyard.stages.verify.runtime import RuntimeAnswer, defer_to_loader

    hand = [Finding("architecture.unexpected_tensors", Severity.ERROR, "1 tensor(s) are not parameters of X: b"),
            Finding("architecture.shape_mismatch", Severity.ERROR, "s")]
    clean = RuntimeAnswer(raw={"ok": True, "dry_load": {"ok": True, "stage": "done"}}, wall_seconds=1.0,
                          vllm_version="0.32.0")
    got = defer_to_loader(hand, clean)
    assert [(f.code, f.severity.value) for f in got] == [("architecture.unexpected_tensors", "warning"),
                                                         ("architecture.shape_mismatch", "error")]
    assert got[0].message == ("1 tensor(s) are not parameters of X: b; vLLM 0.32.0's own loader (dry load) places or "
                              "skips every checkpoint tensor and leaves no parameter empty, so vLLM serves it "
                              "(transformers and other loaders may still refuse)")
    refused = RuntimeAnswer(raw={"ok": True, "dry_load": {"ok": True, "stage": "load", "error": "ValueError: x"}},
                            wall_seconds=1.0, vllm_version="0.32.0")
    assert defer_to_loader(hand, refused) == hand
    assert defer_to_loader(hand, RuntimeAnswer(raw={"ok": True}, wall_seconds=1.0)) == hand


def test_the_slow_tokenizer_files_are_a_tokenizer(tiny_llama_dir, tmp_path):
    # vocab.json + merges.txt (GPT-2 / Qwen2 byte-level BPE) without tokenizer.json: vLLM serves it
    import shutil

    from modelyard.checks import Target
    from modelyard.stages.verify import verify_folder

    d = shutil.copytree(tiny_llama_dir, tmp_path / "m")
    (d / "tokenizer.json").unlink()
    assert "tokenizer.files.missing" in {f.code for f in verify_folder(d, Target()).findings}
    (d / "vocab.json").write_text('{"a": 0}')
    (d / "merges.txt").write_text("#version: 0.2\n")
    assert "tokenizer.files.missing" not in {f.code for f in verify_folder(d, Target()).findings}
