"""Real checkpoints nobody here made, judged end to end (tests/real_models.py downloads and keeps them).

Each GGUF is ingested through ``gguf://`` in its own serving mode and must be published with a sensible
answer that stops, numerical-gate figures within the bounds measured on them, and a served tokenizer that
reads the probe corpus (indented code, runs of spaces and tabs, CJK, accents, role markers) exactly as
llama.cpp itself reads the GGUF (llama-cpp-python, the ``reference`` extra).

What they caught: the Gemma-3 270M GGUF stores runs of spaces as user-defined tokens that llama.cpp matches
before SentencePiece; the rebuilt tokenizer could not reach them and the artifact continued indented code
with " \\n \\n \\n". The Qwen2.5-Coder GGUF was refused because the word check spelt " à" as "Ġà" instead of
through GPT-2's bytes-to-unicode map ("ĠÃł", one token).
"""

from __future__ import annotations

import pytest

from modelyard.checks.gguf_tokenizer import probe_texts
from modelyard.model.modes import PASSING_FINISH
from modelyard.stages.fetch import gguf
from tests import real_models
from tests.conftest import json_result, run_cli, store_artifacts

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]

#: perplexity per reference text that these real models stay under: the largest measured on the three (Gemma-3
#: 270M base, Qwen2.5-Coder-0.5B-Instruct, SmolLM2-135M-Instruct; docs/reference/smoke.md) times 1.5
BOUNDS = {"prose-en": 45.0, "code-python": 6.0, "code-open": 11.5, "prose-fr": 48.0, "prose-de": 115.0,
          "prose-es": 280.0}


@pytest.fixture(scope="module", params=real_models.CORPUS, ids=lambda m: m.name)
def ingested(request, tmp_path_factory):
    """``(model, ingest result, artifact folder)`` of one real GGUF ingested into a fresh store."""
    model = request.param
    path = real_models.gguf_path(model)
    home = tmp_path_factory.mktemp(model.name)
    r = run_cli("ingest", f"gguf://{path}", "--serve", model.serve, "--json", "--out", str(home), timeout=1500)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (art,) = store_artifacts(home)
    return model, json_result(r.stdout, "ingest"), art, path


def test_what_was_replaced_is_in_the_manifest_patch_list(ingested):
    """The Gemma GGUF's tokenizer.json is rebuilt from the GGUF's arrays; Qwen's converted one is kept."""
    from modelyard.artifact.manifest import Manifest

    model, _, art, _ = ingested
    m = Manifest.load(art)
    replaced = [(r.file, r.by) for r in m.patches.replaced] if m.patches else []
    want = [("tokenizer.json", "rebuilt from the GGUF's tokenizer.ggml.* arrays")] if model is real_models.GEMMA3_270M else []
    assert replaced == want


def test_a_real_model_is_published_with_a_sensible_answer_that_stops(ingested):
    model, res, art, _ = ingested
    smoke = res["smoke"]
    assert (smoke["passed"], smoke["mode"]) == (True, model.serve)
    assert model.word in smoke["text"], smoke["text"]
    assert smoke["finish_reason"] in PASSING_FINISH[model.serve]
    assert (art / "manifest.json").is_file()
    # what modelyard wrote instead of the source's is said (the Gemma GGUF's tokenizer is rebuilt, Qwen's is not)
    rebuilt = model is real_models.GEMMA3_270M
    assert ("## Files written instead of the source's" in (art / "report.md").read_text()) is rebuilt
    shown = run_cli("show", str(art))
    assert shown.returncode == 0 and ("replaced: tokenizer.json rebuilt from the GGUF's" in shown.stdout) is rebuilt


def test_the_numerical_gate_judges_every_text_of_a_real_model(ingested):
    model, res, _, _ = ingested
    n = res["smoke"]["numeric"]
    assert (n["passed"], n["compared"], n["bound_judged"]) == (True, True, True)
    for t in n["texts"]:
        assert t["continuation"].strip(), t  # the Gemma import's code continuation was whitespace only
        assert t["ppl_vllm"] < BOUNDS[t["name"]], t
        assert t["ppl_ratio"] == pytest.approx(1.0, abs=0.05), t
        assert t["top1"] >= 0.9, t
    assert n["prose_ppl"] < 100


def test_the_served_tokenizer_reads_text_as_llama_cpp_does(ingested):
    from transformers import AutoTokenizer

    model, _, art, path = ingested
    vocab = gguf.read_vocab(path)
    texts = probe_texts(markers=True)
    ref = gguf.llama_cpp_reference(path, vocab, texts)
    assert ref is not None and ref.error is None
    encode = ref.encode
    tok = AutoTokenizer.from_pretrained(str(art / "model"))
    compared = [t for t in texts if encode(t) is not None]
    assert len(compared) >= len(texts) - 1  # Qwen2.5: llama.cpp reads "</s>" as control, the GGUF says normal
    for t in compared:
        assert tok(t, add_special_tokens=False).input_ids == encode(t), t


def test_a_real_model_continues_indented_code_with_code(ingested):
    """The Gemma-3 import continued an open function with " \\n \\n \\n" before its whitespace tokens were
    reachable; with llama.cpp's ids it wrote the body."""
    _, res, _, _ = ingested
    code = next(t for t in res["smoke"]["numeric"]["texts"] if t["name"] == "code-open")
    body = code["continuation"]
    assert body.startswith("    ") and sum(c.isalpha() for c in body) >= 5, code
