"""One healthy tiny Llama per tokenizer format the runtime reads, each verified clean for chat serving.

vLLM builds its tokenizer with transformers ``AutoTokenizer``; with no ``tokenizer.json``, transformers 5
converts ``tokenizer.model`` at load: a SentencePiece proto through ``sentencepiece`` (+ ``protobuf``),
anything else through ``tiktoken`` (``TikTokenConverter``). The verifier must read all three, so the
pipeline venv carries both libraries (pyproject ``dependencies``).
"""

from __future__ import annotations

import json

import pytest

from modelyard.checks import Target
from modelyard.model.checkpoint import Checkpoint
from modelyard.stages.verify import verify_folder
from tests.fixtures import make_spm_llama, make_tiktoken_llama, make_tiny_llama

#: builder -> (the tokenizer files it writes, the exact findings (code, severity) a chat target gets).
FORMATS = {
    "tokenizers-json": (make_tiny_llama, {"tokenizer.json"}, []),
    # Llama 2 ships no pad token; the info says batch tools may want one (vLLM does not).
    "sentencepiece": (make_spm_llama, {"tokenizer.model"}, [("tokenizer.pad_token.missing", "info")]),
    "tiktoken": (make_tiktoken_llama, {"tokenizer.model"}, []),
}


@pytest.fixture(autouse=True)
def _no_tiktoken_cache(monkeypatch):
    """tiktoken caches a BPE file under the SHA1 of its *path* (``read_file_cached``), so a file rewritten at the
    same path would be read stale; an empty ``TIKTOKEN_CACHE_DIR`` turns the cache off."""
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "")


@pytest.mark.parametrize("fmt", FORMATS)
def test_each_tokenizer_format_verifies_clean_for_chat(tmp_path, fmt):
    build, files, want = FORMATS[fmt]
    d = build(tmp_path / fmt)
    present = {p.name for p in d.iterdir()} & {"tokenizer.json", "tokenizer.model"}
    assert present == files
    report = verify_folder(d, Target(serve="chat"))
    assert [(f.code, f.severity.value) for f in report.findings] == want
    tok, err = Checkpoint(d).hf_tokenizer
    cfg = json.loads((d / "config.json").read_text())
    assert err is None and len(tok) == cfg["vocab_size"] and tok.eos_token_id == cfg["eos_token_id"]
    rendered = tok.apply_chat_template([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}],
                                       tokenize=False)
    assert rendered.rstrip().endswith(tok.eos_token)  # the turn terminator is the eos, so replies stop


def test_sentencepiece_tokenizer_is_the_trained_model(tmp_path):
    """The fast tokenizer transformers converts from tokenizer.model tokenizes as sentencepiece itself does."""
    import sentencepiece as spm

    d = make_spm_llama(tmp_path / "spm")
    tok, _ = Checkpoint(d).hf_tokenizer
    sp = spm.SentencePieceProcessor(model_file=str(d / "tokenizer.model"))
    text = "the model serves tiny experts"
    assert tok(text, add_special_tokens=False)["input_ids"] == sp.encode(text)
    assert tok.convert_ids_to_tokens([0, 1, 2]) == ["<unk>", "<s>", "</s>"]


def test_tiktoken_vocab_larger_than_the_embeddings_is_an_error(tmp_path):
    """The broken twin: one more special token declared after the last embedding row (id = vocab_size)."""
    d = make_tiktoken_llama(tmp_path / "tk")
    vocab = json.loads((d / "config.json").read_text())["vocab_size"]
    tc = json.loads((d / "tokenizer_config.json").read_text())
    tc["added_tokens_decoder"][str(vocab)] = {**tc["added_tokens_decoder"][str(vocab - 1)], "content": "<|extra|>"}
    (d / "tokenizer_config.json").write_text(json.dumps(tc, indent=2))
    report = verify_folder(d, Target(serve="chat"))
    assert [(f.code, f.severity.value, f.field) for f in report.findings] == [
        ("tokenizer.vocab.exceeds_embeddings", "error", "vocab_size")]
