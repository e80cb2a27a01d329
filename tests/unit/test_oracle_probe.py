"""The runtime tokenizer probe's word check (modelyard/runtime/scripts/vllm_oracle.py ``_probe``, which runs in the
vLLM venv) on a byte-level BPE vocabulary, read here with the pipeline venv's transformers: a word with a non-ASCII
letter is spelt through GPT-2's bytes-to-unicode map, as the vocabulary spells it."""

from __future__ import annotations

import importlib.util

from modelyard import paths


def _oracle():
    spec = importlib.util.spec_from_file_location("vllm_oracle", paths.PACKAGE / "runtime" / "scripts" / "vllm_oracle.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _byte_level_tokenizer():
    """A byte-level BPE (GPT-2 / Llama-3 / Qwen style) whose vocabulary holds " à" as one token, "ĠÃł", and the
    token "Ġà" (bytes 20 E0, half of another letter), which a raw "Ġ" + "à" lookup finds instead."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {c: i for i, c in enumerate(sorted(alphabet))}
    merges = [("Ã", "ł"), ("Ġ", "Ãł"), ("Ġ", "à"), ("P", "a"), ("Pa", "r"), ("Par", "i"), ("Pari", "s"), ("Ġ", "Paris")]
    for left, right in merges:
        vocab[left + right] = len(vocab)
    tk = Tokenizer(models.BPE(vocab, merges))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tk)


def test_a_non_ascii_word_of_a_byte_level_vocabulary_is_not_reported_split(tmp_path):
    tok = _byte_level_tokenizer()
    assert tok.convert_ids_to_tokens(tok(" à", add_special_tokens=False).input_ids) == ["ĠÃł"]
    out = _oracle()._probe(tok, ["voilà à Paris"], str(tmp_path))
    assert (out["single_token_words"], out["split_count"], out["split"]) == (2, 0, [])
