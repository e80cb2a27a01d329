"""The served tokenizer against an independent reading of its vocabulary (real vLLM, no mocks): vLLM's
``get_tokenizer`` over the probe texts, for healthy folders of three tokenizer formats and for tokenizers
broken the way public conversions break them. Every folder is built by code; one runtime process asks
vLLM about all of them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from modelyard.checks import Target
from modelyard.settings import Settings
from modelyard.stages.verify.runtime import ask_runtime_many, runtime_findings
from tests.fixtures import make_bpe_llama, make_spm_llama, make_tiktoken_llama

pytestmark = pytest.mark.vllm

CASES = ("bpe", "bpe-merges-cut", "bpe-no-pre-tokenizer", "bpe-no-decoder", "spm", "spm-json", "spm-json-stale",
         "tiktoken", "bpe-alternation")
#: a template that enforces strict user/assistant alternation and knows no tool role (public Mistral- and
#: Llama-2-era templates): fine for one question, HTTP 400 for conversations of other shapes
ALTERNATION = ("{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
               "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
               "{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
               "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def _edit_json(p: Path, fn) -> None:
    doc = json.loads(p.read_text())
    fn(doc)
    p.write_text(json.dumps(doc))


@pytest.fixture(scope="module")
def judged(tmp_path_factory):
    from transformers import AutoTokenizer

    base = tmp_path_factory.mktemp("tokprobe")
    bpe = make_bpe_llama(base / "bpe")
    for name in ("bpe-merges-cut", "bpe-no-pre-tokenizer", "bpe-no-decoder"):
        shutil.copytree(bpe, base / name)
    _edit_json(base / "bpe-merges-cut" / "tokenizer.json",  # a merge list cut short, as a truncated download or
               lambda d: d["model"].__setitem__("merges", d["model"]["merges"][: len(d["model"]["merges"]) // 4]))
    _edit_json(base / "bpe-no-pre-tokenizer" / "tokenizer.json", lambda d: d.__setitem__("pre_tokenizer", None))
    _edit_json(base / "bpe-no-decoder" / "tokenizer.json", lambda d: d.__setitem__("decoder", None))
    spm = make_spm_llama(base / "spm")
    shutil.copytree(spm, base / "spm-json")  # tokenizer.json converted by transformers beside its tokenizer.model
    AutoTokenizer.from_pretrained(str(spm)).save_pretrained(str(base / "spm-json"))
    shutil.copytree(base / "spm-json", base / "spm-json-stale")  # a tokenizer.json of another tokenizer.model
    other = make_spm_llama(base / "other", vocab_size=300)
    AutoTokenizer.from_pretrained(str(other)).save_pretrained(str(base / "other-json"))
    shutil.copy(base / "other-json" / "tokenizer.json", base / "spm-json-stale" / "tokenizer.json")
    make_tiktoken_llama(base / "tiktoken")
    shutil.copytree(bpe, base / "bpe-alternation")
    (base / "bpe-alternation" / "chat_template.jinja").unlink(missing_ok=True)
    _edit_json(base / "bpe-alternation" / "tokenizer_config.json", lambda d: d.__setitem__("chat_template", ALTERNATION))
    items = [(base / n, Target(serve="chat")) for n in CASES]
    answers = ask_runtime_many(items, Settings())
    return {n: [(f.code, f.severity.value, f.message) for f in runtime_findings(a, t)
                if f.code.startswith(("runtime.tokenizer", "runtime.chat_template.rejects_shape"))]
            for n, (_, t), a in zip(CASES, items, answers)}


def test_healthy_tokenizers_of_every_format_pass(judged):
    for name in ("bpe", "spm", "spm-json", "tiktoken"):
        assert judged[name] == [], name


def test_a_cut_merge_list_splits_single_token_words(judged):
    (code, sev, msg), = judged["bpe-merges-cut"]
    assert (code, sev) == ("runtime.tokenizer.splits_single_tokens", "error")
    assert msg.startswith("46 of 68 probe words that are single tokens of the vocabulary come out as several pieces in the "
                      "tokenizer vLLM 0.32.0 builds: 'truth' -> ['Ġt', 'r', 'u', 't', 'h']")


def test_a_missing_pre_tokenizer_splits_every_word(judged):
    (c1, s1, m1), (c2, s2, m2) = judged["bpe-no-pre-tokenizer"]
    assert (c1, s1, c2, s2) == ("runtime.tokenizer.splits_single_tokens", "error", "runtime.tokenizer.round_trip", "error")
    assert m1.startswith("68 of 68 probe words")
    # 22 checked: the 5 probe texts whose characters the toy vocabulary lacks are not counted; the spaces lost
    # by every other text are (a decoder that drops only whitespace is a round-trip failure)
    assert m2.endswith("back for 21 of 22 probe texts in the tokenizer vLLM 0.32.0 builds: 'The capital of France is Paris.' "
                       "comes back as 'ThecapitalofFranceisParis.'")


def test_a_missing_decoder_fails_the_round_trip(judged):
    assert judged["bpe-no-decoder"] == [(
        "runtime.tokenizer.round_trip", "error",
        "decoding does not give the text back for 27 of 27 probe texts in the tokenizer vLLM 0.32.0 builds: "
        "'The capital of France is Paris.' comes back as 'The Ġcapital Ġof ĠFrance Ġis ĠParis .'")]


def test_a_stale_tokenizer_json_disagrees_with_its_sentencepiece_model(judged):
    (code, sev, msg), = judged["spm-json-stale"]
    assert (code, sev) == ("runtime.tokenizer.sentencepiece_mismatch", "error")
    assert msg.endswith("10 of 10 probe texts encode otherwise in tokenizer.json (as vLLM 0.32.0 loads it) than in "
                        "tokenizer.model (SentencePiece): 27 tokens against 27, first at token 0: ['▁', '<0x54>', 'he', "
                        "'▁c'] [272, 87, 263, 261] against ['▁', '<0x54>', 'he', '▁c'] [292, 87, 263, 261]")


def test_conversation_shapes_the_template_refuses_are_named(judged):
    (code, sev, msg), = judged["bpe-alternation"]
    assert (code, sev) == ("runtime.chat_template.rejects_shape", "warning")
    assert msg == ("vLLM 0.32.0 cannot render 2 conversation shape(s) users send with the chat template (HTTP 400 for "
                   "them): user+user: VLLMValidationError: Conversation roles must alternate user/assistant/user/assistant/...; "
                   "tool-call+result: VLLMValidationError: Conversation roles must alternate user/assistant/user/assistant/...")
