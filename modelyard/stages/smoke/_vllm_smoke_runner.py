"""Runs INSIDE the vLLM runtime interpreter (``MODELYARD_VLLM_PYTHON``), as a script.

Standard library + vLLM only: it must not import modelyard, whose pins clash with vLLM's.
Loads ``--model`` with the vLLM offline API, asks one question greedily (``--max-tokens``), and
writes one JSON object to ``--out``. ``--mode chat`` sends it as a user turn through the model's own
chat template (``LLM.chat``, what ``/v1/chat/completions`` serves); ``--mode completion`` sends it as
plain text (``LLM.generate``, what ``/v1/completions`` serves), so a base model without a chat
template can be smoked the way it will be served.
"""

import argparse
import json
import os
import runpy
import sys
import time
import traceback

# vLLM kernels use AMX tiles where the CPU has them: SIGILL unless the process asks first (see that file)
_STAGES = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
runpy.run_path(os.path.join(_STAGES, "_vllm_amx.py"))["request_amx"]()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--question", required=True)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--max-model-len", type=int, default=None)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--out", required=True)
    ap.add_argument("--enforce-eager", action="store_true")
    ap.add_argument("--mode", choices=("chat", "completion"), default="chat")
    a = ap.parse_args()
    result = {"ok": False, "mode": a.mode}
    try:
        t0 = time.perf_counter()
        import vllm
        from vllm import LLM, SamplingParams

        result["vllm_version"] = vllm.__version__
        llm = LLM(model=a.model, max_model_len=a.max_model_len, dtype=a.dtype, seed=0, tensor_parallel_size=1,
                  enforce_eager=a.enforce_eager)
        result["load_seconds"] = round(time.perf_counter() - t0, 2)
        params = SamplingParams(temperature=0.0, max_tokens=a.max_tokens)
        t1 = time.perf_counter()
        if a.mode == "completion":
            outs = llm.generate([a.question], params, use_tqdm=False)
        else:
            outs = llm.chat([{"role": "user", "content": a.question}], params, use_tqdm=False)
        gen = time.perf_counter() - t1
        req = outs[0]
        o = req.outputs[0]
        tok = llm.get_tokenizer()
        ids = list(o.token_ids)
        result.update(
            ok=True,
            text=o.text,
            text_with_special_tokens=tok.decode(ids, skip_special_tokens=False) if ids else "",
            finish_reason=o.finish_reason,
            stop_reason=o.stop_reason,
            prompt_tokens=len(req.prompt_token_ids or []),
            completion_tokens=len(ids),
            last_token=tok.convert_ids_to_tokens(ids[-1]) if ids else None,
            last_token_id=ids[-1] if ids else None,
            generate_seconds=round(gen, 3),
            tokens_per_second=round(len(ids) / gen, 2) if gen > 0 else None,
            max_model_len=llm.llm_engine.model_config.max_model_len,
        )
    except BaseException as exc:  # report, never hang: the parent reads the JSON
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["traceback"] = traceback.format_exc()[-4000:]
    with open(a.out + ".tmp", "w") as fh:
        json.dump(result, fh)
    os.replace(a.out + ".tmp", a.out)
    sys.stdout.flush()
    # vLLM's engine threads can keep the interpreter alive; leave now that the result is on disk.
    os._exit(0 if result["ok"] else 3)


if __name__ == "__main__":
    main()
