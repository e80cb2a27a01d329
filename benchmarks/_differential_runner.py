"""Runs INSIDE the vLLM runtime interpreter (stdlib + vLLM only), for benchmarks/differential.py.

Reads a JSON list of jobs (``{"id", "model", "mode", "prompt", "max_model_len", "max_tokens", "messages"?, "score"?}``) and, for
each job not yet in the JSONL output, loads the model with the vLLM offline API (engine in-process,
``VLLM_ENABLE_V1_MULTIPROCESSING=0``, eager), asks one greedy question (chat through the model's
template, or a plain completion) with the server's defaults from generation_config.json
(``LLM.get_default_sampling_params``), and appends one JSON line: ``{"id", "stage": "load"|"request"|"done",
"error"?, "text"?, "token_ids"?, "finish_reason"?, "seconds"}``. The parent restarts it after a crash.
"""

import gc
import json
import math
import os
import sys
import time
import traceback


def _err(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0][:400] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def main() -> int:
    jobs_path, out_path = sys.argv[1], sys.argv[2]
    jobs = json.load(open(jobs_path))
    done = set()
    if os.path.exists(out_path):
        for line in open(out_path):
            try:
                done.add(json.loads(line)["id"])
            except (ValueError, KeyError):
                pass
    import logging

    from vllm import LLM

    logging.getLogger("vllm").setLevel(logging.ERROR)
    for job in jobs:
        if job["id"] in done:
            continue
        with open(out_path + ".current", "w") as fh:  # the parent reads it to name a job that crashed the process
            fh.write(job["id"])
        t0 = time.perf_counter()
        rec = {"id": job["id"]}
        llm = None
        try:
            llm = LLM(model=job["model"], enforce_eager=True, max_model_len=job.get("max_model_len"), seed=0,
                      tensor_parallel_size=1, trust_remote_code=False)
        except BaseException as exc:
            rec.update(stage="load", error=_err(exc), tb=traceback.format_exc()[-1500:])
        if llm is not None:
            try:
                params = llm.get_default_sampling_params()
                params.temperature = 0.0
                params.top_p, params.top_k, params.min_p = 1.0, 0, 0.0
                if params.max_tokens is None or params.max_tokens == 16 and not _has_default_max(llm):
                    params.max_tokens = job["max_tokens"]
                if job["mode"] == "chat":
                    outs = llm.chat(job.get("messages") or [{"role": "user", "content": job["prompt"]}], params,
                                    use_tqdm=False)
                else:
                    outs = llm.generate([job["prompt"]], params, use_tqdm=False)
                o = outs[0].outputs[0]
                rec.update(stage="done", text=o.text, token_ids=list(o.token_ids), finish_reason=o.finish_reason,
                           max_tokens=params.max_tokens)
                if job.get("score"):  # vLLM's own perplexity of a plain text, through the served tokenizer
                    from vllm import SamplingParams

                    so = llm.generate([job["score"]], SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=1),
                                      use_tqdm=False)[0]
                    lps = [d[t].logprob for t, d in zip(so.prompt_token_ids[1:], so.prompt_logprobs[1:]) if d]
                    rec.update(score_tokens=len(so.prompt_token_ids),
                               score_ppl=round(math.exp(-sum(lps) / max(len(lps), 1)), 3))
            except BaseException as exc:
                rec.update(stage="request", error=_err(exc), tb=traceback.format_exc()[-1500:])
        rec["seconds"] = round(time.perf_counter() - t0, 2)
        with open(out_path, "a") as fh:
            fh.write(json.dumps(rec) + "\n")
        del llm
        gc.collect()
    os._exit(0)


def _has_default_max(llm) -> bool:
    """True when generation_config.json set the default max_tokens (max_new_tokens)."""
    try:
        return "max_tokens" in llm.llm_engine.model_config.get_diff_sampling_param()
    except Exception:
        return False


if __name__ == "__main__":
    main()
