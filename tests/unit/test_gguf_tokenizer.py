"""A GGUF's converted tokenizer against llama.cpp's reading of its own arrays: the Gemma-3 defect, built by
code (a SentencePiece-BPE GGUF that transformers converts as a Unigram model without bos), repaired."""

from __future__ import annotations

import json

import pytest

from modelyard.checks.gguf_tokenizer import GgufVocab, byte_level, compare, hand_encode, partition, spm_encode
from modelyard.model.source import parse_source
from modelyard.settings import Settings
from modelyard.stages.fetch import gguf
from tests.fixtures import WHITESPACE_TOKENS, make_gemma3_gguf, tiny_corpus, train_spm_bpe

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
    assert (rec["model"], rec["checked"], rec["repaired"], rec["after"]) == ("llama", 31, True, [])
    assert rec["reference"] == "llama.cpp (llama-cpp-python 0.3.36)"
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


CODE = "def f(n):\n    if n:\n        return n\n\treturn  0\n"


def test_whitespace_tokens_are_cut_out_before_the_model_as_llama_cpp_does(gemma3):
    """The Gemma-3 GGUF stores runs of spaces as user-defined tokens that llama.cpp matches before SentencePiece;
    a tokenizer that turns every space into ▁ first never reaches them (the artifact then answered code with
    " \\n \\n \\n")."""
    path, snap = gemma3
    vocab = gguf.read_vocab(path)
    ws = {t: vocab.index[t] for t in WHITESPACE_TOKENS}
    parts = partition(vocab, CODE)
    assert [p for p in parts if isinstance(p, int)] == [ws["\n"], ws["    "], ws["\n"], ws["        "], ws["\n"],
                                                        ws["\t"], ws["  "], ws["\n"]]
    assert [p for p in parts if isinstance(p, str)] == ["def f(n):", "if n:", "return n", "return", "0"]
    want = hand_encode(vocab, CODE)
    assert want is not None and [i for i in want if i in ws.values()] == [p for p in parts if isinstance(p, int)]


def test_the_hand_reading_and_the_repaired_tokenizer_are_llama_cpp_itself(gemma3):
    from transformers import AutoTokenizer

    path, snap = gemma3
    vocab = gguf.read_vocab(path)
    texts = gguf.probe_texts(markers=True) + [CODE]
    ref = gguf.llama_cpp_reference(path, vocab, texts)
    assert ref is not None and (ref.error, ref.overridden) == (None, frozenset())
    encode = ref.encode
    tok = AutoTokenizer.from_pretrained(str(snap.root))
    assert [hand_encode(vocab, t) for t in texts] == [encode(t) for t in texts]
    assert [tok(t, add_special_tokens=False).input_ids for t in texts] == [encode(t) for t in texts]


def test_byte_level_words_are_spelt_through_bytes_to_unicode():
    """Qwen2.5-Coder's GGUF was refused: "à" looked up as "Ġà" (bytes 20 E0, another token) instead of "ĠÃł"."""
    assert (byte_level(" à"), byte_level(" Paris"), byte_level(" 東")) == ("ĠÃł", "ĠParis", "ĠæĿ±")
    tokens = ("Ġà", "ĠÃł", "ĠParis", "Ã", "ł")
    vocab = GgufVocab(model="gpt2", tokens=tokens, token_types=(1,) * len(tokens), add_bos_token=False)
    table = {" à": [1], " Paris": [2], "à Paris": [3, 4, 2]}
    assert compare(vocab, lambda t, special: table.get(t, [3, 4, 2]), ["à Paris"]) == []
    wrong = compare(vocab, lambda t, special: {" à": [3, 4]}.get(t, table.get(t, [])), ["à Paris"])
    assert [f.message for f in wrong] == ["1 of 2 words that are single tokens of the GGUF vocabulary are split by the "
                                          "converted tokenizer: 'à' -> ['Ã', 'ł']"]


def test_a_vocabulary_llama_cpp_cannot_load_is_judged_by_hand_not_a_crash(tmp_path):
    """llama.cpp aborts its process (GGML_ASSERT) on a vocabulary that lists a token twice: it runs in a child."""
    import gguf as gguf_py

    path = tmp_path / "dup.gguf"
    w = gguf_py.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("llama")
    w.add_token_list(["<unk>", "<s>", "</s>", "▁a", "▁a"])
    w.add_token_scores([0.0] * 5)
    w.add_token_types([2, 3, 3, 1, 1])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    vocab = gguf.read_vocab(path)
    ref = gguf.llama_cpp_reference(path, vocab, ["a"])
    assert ref is not None and ref.ids == {} and ref.encode("a") is None
    assert ref.error is not None and ref.error.startswith("llama.cpp could not read the vocabulary (exit status -6): ")
    assert "GGML_ASSERT(id_to_token.size() == token_to_id.size()) failed" in ref.error


def test_a_conversion_parses_the_gguf_header_once(gemma3, tmp_path, monkeypatch):
    """transformers' tokenizer (twice: AutoTokenizer, then the tokenizer's own __init__), config and model loaders
    and modelyard's two header reads each construct a GGUFReader; the conversion shares one per file (the parses of
    a 262,144-token header were 60 s of a 115 s Gemma-3 270M conversion)."""
    import gguf as gguf_py

    path, _ = gemma3
    made: list[str] = []
    original = gguf_py.GGUFReader

    class Counting(original):  # type: ignore[misc, valid-type]
        def __init__(self, p, mode="r"):
            made.append(str(p))
            super().__init__(p, mode)

    monkeypatch.setattr(gguf_py, "GGUFReader", Counting)
    (tmp_path / "a").mkdir()
    gguf._convert(path, tmp_path / "a", "bfloat16")
    assert made == [str(path)] * 6  # without sharing: transformers x4 (tokenizer x2, config, model), modelyard x2
    made.clear()
    (tmp_path / "b").mkdir()
    gguf.convert_gguf(path, tmp_path / "b")
    assert made == [str(path)]
    assert gguf_py.GGUFReader is Counting  # restored after the block
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == sorted(p.name for p in (tmp_path / "b").iterdir())
