"""A GGUF's converted tokenizer against llama.cpp's reading of its own arrays: the Gemma-3 defect, built by
code (a SentencePiece-BPE GGUF that transformers converts as a Unigram model without bos), repaired."""

from __future__ import annotations

import json

import pytest

from modelyard.checks.gguf_tokenizer import GgufVocab, spm_encode
from modelyard.model.source import parse_source
from modelyard.settings import Settings
from modelyard.stages.fetch import gguf
from tests.fixtures import make_gemma3_gguf, tiny_corpus, train_spm_bpe

SENTENCE = "The capital of France is Paris."


def _lines() -> list[str]:
    return gguf.probe_texts() * 3 + tiny_corpus()


def test_spm_encode_is_sentencepiece_itself():
    sp = train_spm_bpe(_lines())
    n = sp.get_piece_size()
    vocab = GgufVocab(model="llama", tokens=tuple(sp.id_to_piece(i) for i in range(n)),
                      scores=tuple(sp.get_score(i) for i in range(n)), unk_token_id=0, add_space_prefix=True)
    texts = [*gguf.probe_texts(), "naïve café 東京 zebra-quux"]
    assert [spm_encode(vocab, t) for t in texts] == [sp.encode(t) for t in texts]


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    d = tmp_path_factory.mktemp("gemma3")
    path = make_gemma3_gguf(d / "gemma3-tiny.gguf", _lines())
    snap = gguf.fetch_gguf(parse_source(f"gguf://{path}"), Settings(home=d / "store"))
    return path, snap


def test_gemma3_gguf_conversion_is_found_broken_and_repaired(gemma3):
    path, snap = gemma3
    rec = snap.provenance["tokenizer_check"]
    assert (rec["model"], rec["checked"], rec["repaired"], rec["after"]) == ("llama", 18, True, [])
    assert [f["code"] for f in rec["findings"]] == ["tokenizer.gguf.bos_policy", "tokenizer.gguf.splits_single_tokens",
                                                    "tokenizer.gguf.encoding_mismatch"]
    assert rec["findings"][0]["message"] == ("the converted tokenizer does not add the bos token '<s>' (id 1), "
                                             "but the GGUF says add_bos_token=True")
    assert json.loads((snap.root / gguf.CHECK_FILE).read_text()) == rec
    assert gguf.CHECK_FILE not in {f.path for f in snap.files}


def test_the_repaired_tokenizer_reads_text_as_the_gguf_does(gemma3):
    from transformers import AutoTokenizer

    path, snap = gemma3
    vocab = gguf.read_vocab(path)
    tok = AutoTokenizer.from_pretrained(str(snap.root))
    ids = tok(SENTENCE).input_ids
    assert ids == [1, *spm_encode(vocab, SENTENCE)]
    assert tok.convert_ids_to_tokens(ids)[-2:] == ["▁Paris", "."]
    assert tok.decode(ids, skip_special_tokens=True) == SENTENCE
    for word in ("capital", "France", "Paris", "that"):
        assert tok(" " + word, add_special_tokens=False).input_ids == [vocab.index["▁" + word]]
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert tok.convert_ids_to_tokens(tok(text, add_special_tokens=False).input_ids)[:2] == ["<s>", "<start_of_turn>"]
