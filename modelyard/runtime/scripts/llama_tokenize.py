"""llama.cpp's own tokenizer of one GGUF over a list of texts, in a child process of modelyard's interpreter.

Run as ``python llama_tokenize.py GGUF JOB OUT``: ``JOB`` is JSON ``{texts: [str]}``; ``OUT`` gets
``{version, n_tokens, control, ids: [[int]]}``: the llama-cpp-python version, the vocabulary size llama.cpp
loaded, the ids llama.cpp treats as control (its attribute bit, which its end-of-generation heuristic sets on
"control-looking" normal tokens), and each text's ids (``parse_special``, no bos). Only the vocabulary is read
(``vocab_only``). A child because llama.cpp aborts the whole process on a vocabulary it cannot load
(``GGML_ASSERT``, e.g. a token listed twice): the caller reads the exit status and the reason llama.cpp
printed on stderr (its whole log goes there, verbose: the caller keeps it in a temp file) instead of dying.
"""

from __future__ import annotations

import importlib.metadata
import json
import sys


def main() -> None:
    import llama_cpp

    gguf, job, out = sys.argv[1:4]
    llm = llama_cpp.Llama(model_path=gguf, vocab_only=True, verbose=True)  # its log: the caller's temp file
    vocab = llama_cpp.llama_model_get_vocab(llm._model.model)
    n = llama_cpp.llama_vocab_n_tokens(vocab)
    control = [i for i in range(n) if llama_cpp.llama_vocab_get_attr(vocab, i) & llama_cpp.LLAMA_TOKEN_ATTR_CONTROL]
    with open(job, encoding="utf-8") as fh:
        texts = json.load(fh)["texts"]
    ids = [[int(i) for i in llm.tokenize(t.encode("utf-8"), add_bos=False, special=True)] for t in texts]
    with open(out, "w", encoding="utf-8") as fh:
        json.dump({"version": importlib.metadata.version("llama-cpp-python"), "n_tokens": n, "control": control,
                   "ids": ids}, fh)


if __name__ == "__main__":
    main()
