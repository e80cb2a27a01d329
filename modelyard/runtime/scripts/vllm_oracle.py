"""Runs INSIDE the vLLM runtime interpreter (``MODELYARD_VLLM_PYTHON``), as a script.

Standard library + vLLM only: it must not import modelyard, whose pins clash with vLLM's. It asks
vLLM the decisions it makes at startup, without weights and without a GPU, and writes one JSON
object to ``--out`` (each part ``{"ok": bool, ...}`` or ``{"ok": false, "error": "Type: message"}``):

- ``model_config``: ``EngineArgs(...).create_model_config()`` with the target's ``max_model_len`` and
  ``dtype`` (and, when that is refused, once more without ``max_model_len`` to learn the derived length):
  derived ``max_model_len``, resolved dtype, quantization method, architectures, runner and convert type,
  the model registry's ``is_text_generation_model`` / ``is_pooling_model``;
- ``quant_config``: ``get_quant_config`` (the parsed quantization config, as the loader builds it);
- ``sampling``: ``ModelConfig.get_diff_sampling_param()`` (the defaults the OpenAI server takes from
  generation_config.json) and ``try_get_generation_config()``;
- ``tokenizer``: ``vllm.tokenizers.get_tokenizer``; the chat template as ``resolve_chat_template``
  resolves it, rendered through ``safe_apply_chat_template`` with and without ``add_generation_prompt``
  and a system message, and over the conversation shapes users send (two user turns in a row, multi-turn
  with assistant history, a tool call and its result: ``shape:*``); the stop set (tokenizer eos + generation config eos ids, as
  ``SamplingParams.update_from_generation_config`` builds it) and the token that closes a turn;
  ``probe``: that tokenizer over the job's ``probe_texts`` against an independent reading of the same
  vocabulary: words that are one token of the vocabulary after a space (``Ġword``, ``▁word``) must come out
  as that one token; decoding must give each text back; ``tokenizer_config.json``'s explicit
  ``add_bos_token`` must be what encoding does; and with a ``tokenizer.model`` beside it, SentencePiece's own
  encoding of each text (the source the fast tokenizer was converted from) must be the same ids;
- ``weights``: ``DefaultModelLoader._prepare_weights`` (the files the default loader reads) and the
  tensor names stored in more than one of them (read from the safetensors headers);
- ``dry_load``: the model built as vLLM builds it (``initialize_model`` under the engine config, the
  target's ``tensor_parallel_size`` as rank 0 of that split) on the meta device, and its own
  ``load_weights`` fed every checkpoint tensor through ``DefaultModelLoader.get_all_weights`` as a
  shape-only meta tensor read from the safetensors header (no weight byte is read); then
  ``track_weights_loading(quantized=True)``, vLLM's strict rule for parameters no tensor filled. With a
  target compute capability (``gpu_cc``) the platform answers as a CUDA device of that capability while
  the quantization config and the layers are built, so vLLM's own scheme checks and kernel selection
  (``_check_scheme_supported``, ``choose_mp_linear_kernel``, ``choose_scaled_mm_linear_kernel``) judge the
  target GPU; a question only the CUDA kernel library answers (a ``torch.ops._C`` op the CPU build lacks)
  is reported as not judged.
"""

import argparse
import json
import os
import re
import runpy
import struct
import sys
import time
import traceback

# vLLM kernels use AMX tiles where the CPU has them: SIGILL unless the process asks first (see that file)
_HERE = os.path.dirname(os.path.abspath(__file__))
runpy.run_path(os.path.join(_HERE, "amx.py"))["request_amx"]()

SENTINEL = "modelyardsentinelreply"


def _err(exc: BaseException) -> str:
    # pydantic's ValidationError puts the reason on the lines after "1 validation error for ...": keep them
    text = " ".join(line.strip() for line in str(exc).strip().splitlines() if line.strip())[:600]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _model_config(a, EngineArgs):
    kw = dict(model=a.model, trust_remote_code=False, dtype=a.dtype or "auto", seed=0)
    if a.max_model_len:
        kw["max_model_len"] = a.max_model_len
    if a.tokenizer_mode:
        kw["tokenizer_mode"] = a.tokenizer_mode
    return EngineArgs(**kw).create_model_config()


def _inspect_cause(model: str):
    """Why vLLM's registry could not inspect the architecture ("failed to be inspected"): import the model's
    own module here and return the import error (e.g. a package the runtime venv lacks), or None."""
    import importlib

    from vllm.model_executor.models.registry import ModelRegistry

    try:
        with open(os.path.join(model, "config.json"), encoding="utf-8") as fh:
            archs = json.load(fh).get("architectures") or []
    except (OSError, ValueError, AttributeError):
        return None
    for arch in archs:
        entry = ModelRegistry.models.get(arch)
        name = getattr(entry, "module_name", None)
        if not name:
            continue
        try:
            importlib.import_module(name)
        except ImportError as exc:
            return {"architecture": arch, "module": name, "error": _err(exc),
                    "missing": getattr(exc, "name", None)}
        except Exception as exc:
            return {"architecture": arch, "module": name, "error": _err(exc), "missing": None}
    return None


def _describe(mc) -> dict:
    reg = mc.registry
    archs = list(getattr(mc, "architectures", None) or [])
    out = {"ok": True, "max_model_len": mc.max_model_len, "dtype": str(mc.dtype).replace("torch.", ""),
           "quantization": mc.quantization, "architectures": archs, "runner_type": mc.runner_type,
           "convert_type": mc.convert_type}
    try:
        out["is_text_generation_model"] = bool(reg.is_text_generation_model(archs, mc))
        out["is_pooling_model"] = bool(reg.is_pooling_model(archs, mc))
    except Exception as exc:
        out["registry_error"] = _err(exc)
    try:
        from vllm.model_executor.models import registry as regmod

        gen = set(getattr(regmod, "_TEXT_GENERATION_MODELS", {})) | set(getattr(regmod, "_MULTIMODAL_MODELS", {}))
        out["pooling_table"] = sorted(a for a in archs if a in getattr(regmod, "_EMBEDDING_MODELS", {}) and a not in gen)
    except Exception as exc:
        out["pooling_table_error"] = _err(exc)
    try:
        _cls, arch = reg.resolve_model_cls(archs, mc)
        out["resolved_architecture"] = arch
    except Exception as exc:
        out["resolve_error"] = _err(exc)
    return out


def _turn_terminator(tok, rendered: str):
    idx = rendered.rfind(SENTINEL)
    if idx < 0:
        return None
    rest = rendered[idx + len(SENTINEL):].lstrip(" \t\r\n")
    if not rest:
        return None
    cands = {}
    for tid, added in (getattr(tok, "added_tokens_decoder", None) or {}).items():
        cands[getattr(added, "content", str(added))] = tid
    for t in getattr(tok, "all_special_tokens", []) or []:
        tid = tok.convert_tokens_to_ids(t)
        if isinstance(tid, int):
            cands.setdefault(t, tid)
    best = max((c for c in cands if c and rest.startswith(c)), key=len, default=None)
    return [best, cands[best]] if best else None


_WORD = re.compile(r"[^\W\d_]+", re.UNICODE)


def _norm_ws(text: str) -> str:
    return " ".join(text.split())


def _probe(tok, texts, folder) -> dict:  # noqa: C901
    """The served tokenizer over ``texts`` against an independent reading of its vocabulary (module doc)."""
    out: dict = {"ok": True, "texts": len(texts)}
    vocab = tok.get_vocab()
    skip = set(getattr(tok, "all_special_ids", None) or []) | set(getattr(tok, "added_tokens_decoder", None) or {})

    def enc(text, special=False):
        return list(tok.encode(text, add_special_tokens=special))

    from transformers.convert_slow_tokenizer import bytes_to_unicode as b2u

    words: dict = {}
    for t in texts:
        for w in (w for w in _WORD.findall(t) if w not in words):  # "▁w" (SentencePiece); " w" byte-level (" à": "ĠÃł")
            for spelt in ("\u2581" + w, "".join(b2u()[b] for b in (" " + w).encode("utf-8"))):
                tid = vocab.get(spelt)
                if tid is not None and tid not in skip:
                    words[w] = tid
                    break
    split = []
    for w, tid in words.items():
        if not any(tid in ids for ids in (enc(" " + w), enc(w), enc("The " + w))):
            split.append([w, tok.convert_ids_to_tokens(enc(" " + w))[:8]])
    out.update(single_token_words=len(words), split=split[:10], split_count=len(split))
    bad, unk_texts = [], 0
    unk = getattr(tok, "unk_token_id", None)
    for t in texts:
        ids = enc(t)
        if isinstance(unk, int) and unk in ids:  # a vocabulary without byte fallback that lacks the text
            unk_texts += 1
            continue
        back = tok.decode(ids, skip_special_tokens=True)
        if _norm_ws(back) != _norm_ws(t):
            if len(vocab) < 1000 and len(_norm_ws(back)) < len(_norm_ws(t)) and "".join(back.split()) != "".join(t.split()):
                # a toy vocabulary (a test fixture) that silently lacks some of the text's characters; a decoder
                # that loses only the spaces (no pre-tokenizer) is a round-trip failure all the same
                unk_texts += 1
                continue
            bad.append([t[:80], back[:80]])
    out.update(round_trip_failed=bad[:5], round_trip_failed_count=len(bad), round_trip_checked=len(texts) - unk_texts,
               unknown_token_texts=unk_texts)
    cfg = {}
    try:
        with open(os.path.join(folder, "tokenizer_config.json"), encoding="utf-8") as fh:
            cfg = json.load(fh)
    except (OSError, ValueError):
        pass
    bos = getattr(tok, "bos_token_id", None)
    if isinstance(cfg, dict) and isinstance(cfg.get("add_bos_token"), bool) and isinstance(bos, int) and texts:
        with_special, plain = enc(texts[0], True), enc(texts[0])
        adds = bool(with_special) and with_special[0] == bos and (not plain or plain[0] != bos)
        out["bos"] = {"declared": cfg["add_bos_token"], "adds": adds, "bos_token_id": bos}
    spm = os.path.join(folder, "tokenizer.model")
    if os.path.isfile(spm) and os.path.isfile(os.path.join(folder, "tokenizer.json")):
        try:
            import sentencepiece

            sp = sentencepiece.SentencePieceProcessor(model_file=spm)
            # a model trained with remove_extra_whitespaces collapses runs of spaces, which transformers'
            # LlamaConverter does not carry over: only texts without such runs are compared then
            collapses = list(sp.encode("a  b")) == list(sp.encode("a b"))
            diff, compared = [], 0
            for t in texts:
                if collapses and " ".join(t.split()) != t:
                    continue
                compared += 1
                want, got = list(sp.encode(t)), enc(t)
                if want != got:
                    k = next((i for i, (x, y) in enumerate(zip(got, want)) if x != y), min(len(got), len(want)))
                    diff.append({"text": t[:80], "tokens": len(got), "sentencepiece_tokens": len(want), "at": k,
                                 "got_ids": got[k:k + 4], "want_ids": want[k:k + 4],
                                 "got": tok.convert_ids_to_tokens(got[k:k + 4]),
                                 "want": [sp.id_to_piece(i) for i in want[k:k + 4]]})
            out["sentencepiece"] = {"ok": True, "mismatch": diff[:5], "mismatch_count": len(diff), "compared": compared,
                                    "collapses_whitespace": collapses}
        except Exception as exc:
            out["sentencepiece"] = {"ok": False, "error": _err(exc)}
    return out


def _tokenizer(a, mc, sampling) -> dict:
    from vllm.renderers.hf import resolve_chat_template, safe_apply_chat_template
    from vllm.tokenizers import get_tokenizer

    out: dict = {"ok": False}
    tok = get_tokenizer(a.model, tokenizer_mode=mc.tokenizer_mode, trust_remote_code=False)
    out.update(ok=True, cls=type(tok).__name__, eos_token=getattr(tok, "eos_token", None),
               eos_token_id=getattr(tok, "eos_token_id", None), bos_token=getattr(tok, "bos_token", None),
               vocab=len(tok))
    gen_eos = (sampling.get("generation_config") or {}).get("eos_token_id")
    stop = set()
    if isinstance(out["eos_token_id"], int):
        stop.add(out["eos_token_id"])
    for i in (gen_eos if isinstance(gen_eos, list) else [gen_eos]):
        if isinstance(i, int):
            stop.add(i)
    out["stop_token_ids"] = sorted(stop)
    if getattr(a, "probe_texts", None):
        try:
            out["probe"] = _probe(tok, a.probe_texts, a.model)
        except Exception as exc:
            out["probe"] = {"ok": False, "error": _err(exc)}
    try:
        template = resolve_chat_template(tok, None, None, model_config=mc)
    except Exception as exc:
        template, out["template_error"] = None, _err(exc)
    out["chat_template"] = template is not None
    if template is None:
        return out
    user = {"role": "user", "content": "What is the capital of France?"}
    system = {"role": "system", "content": "You are a helpful assistant."}
    reply = {"role": "assistant", "content": SENTINEL}
    renders = {}
    hello = {"role": "user", "content": "Hello!"}
    hi = {"role": "assistant", "content": "Hello! How can I help?"}
    call = {"role": "assistant", "content": "", "tool_calls": [{"id": "call_0", "type": "function", "function": {
        "name": "lookup", "arguments": '{"query": "capital of France"}'}}]}
    result = {"role": "tool", "tool_call_id": "call_0", "content": "Paris"}
    for name, conv, gen in (("user", [user], False), ("user+gen", [user], True),
                            ("system+user", [system, user], False), ("system+user+gen", [system, user], True),
                            ("user+assistant", [user, reply], False),
                            ("shape:user+user", [hello, user], True), ("shape:multi-turn", [hello, hi, user], True),
                            ("shape:tool-call+result", [user, call, result], True)):
        try:
            renders[name] = {"ok": True, "text": safe_apply_chat_template(
                mc, tok, conv, tokenize=False, add_generation_prompt=gen)}
        except Exception as exc:
            renders[name] = {"ok": False, "error": _err(exc)}
    out["renders"] = renders
    ua = renders["user+assistant"]
    out["turn_terminator"] = _turn_terminator(tok, ua["text"]) if ua.get("ok") else None
    return out


def _header(path: str) -> dict:
    """A safetensors file's header: ``{tensor name: {"dtype", "shape", ...}}`` without ``__metadata__``."""
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        if n > 100_000_000:
            return {}
        doc = json.loads(fh.read(n))
    return {k: v for k, v in doc.items() if k != "__metadata__"} if isinstance(doc, dict) else {}


def _header_names(path: str) -> list:
    return list(_header(path))


def _weights(a) -> dict:
    from vllm.config import LoadConfig
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

    loader = DefaultModelLoader(LoadConfig())
    folder, files, use_st, index = loader._prepare_weights(a.model, None, None, True, None)
    rel = sorted(os.path.relpath(f, folder) for f in files)
    out = {"ok": True, "files": rel, "use_safetensors": bool(use_st), "index_file": index,
           "load_format": "mistral" if index.startswith("consolidated") else "hf"}
    if use_st:
        seen: dict = {}
        dup: dict = {}
        for f in rel:
            try:
                names = _header_names(os.path.join(folder, f))
            except Exception:
                continue
            for n in names:
                if n in seen:
                    dup.setdefault(n, [seen[n]]).append(f)
                else:
                    seen[n] = f
        out["tensors_in_several_files"] = dict(sorted(dup.items())[:50])
        out["tensors_in_several_files_count"] = len(dup)
    return out


_DT = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64", "I32": "int32",
       "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}
_DIST = {"up": False}


def _meta_weights(files, *args, **kwargs):
    """``safetensors_weights_iterator``'s contract with shape-only tensors from the headers."""
    import torch

    for f in files:
        for name, spec in _header(f).items():
            dt = getattr(torch, _DT.get(spec.get("dtype"), ""), None) or torch.uint8
            yield name, torch.empty(spec["shape"], dtype=dt, device="meta")


def _not_judged(exc: BaseException) -> str | None:
    """Why vLLM's code could not be asked here, or None when ``exc`` is vLLM's own verdict."""
    text = str(exc)
    if "_OpNamespace" in text or "torch.ops._C" in text:
        return f"needs the CUDA kernel library's answer ({_err(exc)}), which the CPU build lacks"
    if "meta" in text.lower() and ("meta tensor" in text.lower() or "device='meta'" in text or "meta device" in text):
        return f"reads tensor values, which a shape-only dry load does not have ({_err(exc)})"
    if isinstance(exc, (NotImplementedError, ImportError)):
        return _err(exc)
    return None


def _dry_load(a, EngineArgs) -> dict:
    import tempfile

    import torch
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import parallel_state as ps
    from vllm.model_executor.model_loader import default_loader as dl
    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm.platforms import current_platform
    from vllm.platforms.interface import DeviceCapability, PlatformEnum
    from vllm.utils.torch_utils import set_default_torch_dtype

    tp = int(getattr(a, "tensor_parallel_size", None) or 1)
    cc = getattr(a, "gpu_cc", None)
    kw = dict(model=a.model, trust_remote_code=False, dtype=a.dtype or "auto", seed=0, enforce_eager=True)
    if a.max_model_len:
        kw["max_model_len"] = a.max_model_len
    ea = EngineArgs(**kw)
    vc = ea.create_engine_config()  # on the host platform: imports every quantization module as the host would
    out: dict = {"ok": True, "target": f"cuda {cc}" if cc else "host", "tensor_parallel_size": tp}
    plat = type(current_platform)
    saved = (plat._enum, plat.get_device_capability)
    tb = ""
    try:
        if cc:
            major, minor = (int(x) for x in str(cc).split(".")[:2])
            plat._enum = PlatformEnum.CUDA
            plat.get_device_capability = classmethod(lambda cls, device_id=0: DeviceCapability(major, minor))
            mc = ea.create_model_config()
            vc.model_config = mc
            vc.quant_config = VllmConfig._get_quantization_config(mc, vc.load_config)
        mc = vc.model_config
        with set_current_vllm_config(vc):
            if not _DIST["up"]:
                ps.init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                                distributed_init_method=f"file://{tempfile.mktemp(prefix='modelyard-')}")
                _DIST["up"] = True
            else:  # the groups depend on the model (an expert-parallel group only for MoE): rebuild per folder
                ps.destroy_model_parallel()
            ps.ensure_model_parallel_initialized(1, 1)
            ps._TP.world_size, ps._TP.rank_in_group = tp, 0  # rank 0 of the target's split
            vc.parallel_config.tensor_parallel_size = tp
            stage = "build"
            try:
                with set_default_torch_dtype(mc.dtype), torch.device("meta"):
                    model = initialize_model(vllm_config=vc, model_config=mc)
                out["kernels"] = sorted({f"{type(m.scheme).__name__}: {type(getattr(m.scheme, 'kernel', None)).__name__}"
                                         for m in model.modules() if getattr(m, "scheme", None) is not None
                                         and getattr(m.scheme, "kernel", None) is not None})
                out["quant_methods"] = sorted({type(m.quant_method).__name__ for m in model.modules()
                                               if getattr(m, "quant_method", None) is not None})
                stage = "load"
                loader = dl.DefaultModelLoader(vc.load_config)
                real_iter, dl.safetensors_weights_iterator = dl.safetensors_weights_iterator, _meta_weights
                try:
                    loaded = model.load_weights(loader.get_all_weights(mc, model))
                finally:
                    dl.safetensors_weights_iterator = real_iter
                out["parameters"] = sum(1 for _ in model.named_parameters())
                out["loaded"] = None if loaded is None else len(loaded)
                stage = "track"
                if loaded is not None:
                    loader.track_weights_loading(model, set(loaded), quantized=True)
                out["stage"] = "done"
            except Exception as exc:
                tb = traceback.format_exc()
                why = _not_judged(exc)
                out.update(stage=stage, error=_err(exc), not_judged=why,
                           quantization="/layers/quantization/" in tb or "/kernels/" in tb)
                if stage == "track":
                    msg = str(exc)
                    out["uninitialized"] = sorted(x.strip(" '") for x in msg[msg.find("{") + 1:msg.rfind("}")].split(","))[:50]
    except Exception as exc:  # the target's model config or quantization config refused
        tb = traceback.format_exc()
        out.update(stage="config", error=_err(exc), not_judged=_not_judged(exc), quantization=True)
    finally:
        plat._enum, plat.get_device_capability = saved
    return out


def answer(a, EngineArgs) -> dict:
    """Every decision for one folder (``a``: model, max_model_len, dtype, tokenizer_mode)."""
    result: dict = {}
    mc = None
    try:
        mc = _model_config(a, EngineArgs)
        result["model_config"] = _describe(mc)
        if a.max_model_len:  # accepted: is it above what vLLM derives on its own (an override key)?
            a2 = argparse.Namespace(**{**vars(a), "max_model_len": None})
            result["model_config_default_len"] = _describe(_model_config(a2, EngineArgs))
    except Exception as exc:
        result["model_config"] = {"ok": False, "error": _err(exc)}
        if "failed to be inspected" in str(exc):
            try:
                result["model_config"]["inspect_cause"] = _inspect_cause(a.model)
            except Exception as exc2:
                result["model_config"]["inspect_cause"] = {"error": _err(exc2), "missing": None}
        if a.max_model_len:  # learn what vLLM would derive on its own
            try:
                a2 = argparse.Namespace(**{**vars(a), "max_model_len": None})
                mc = _model_config(a2, EngineArgs)
                result["model_config_default_len"] = _describe(mc)
            except Exception as exc2:
                result["model_config_default_len"] = {"ok": False, "error": _err(exc2)}
                mc = None
    if mc is not None:
        if mc.quantization:
            try:
                from vllm.config import LoadConfig
                from vllm.model_executor.model_loader.weight_utils import (
                    get_quant_config,
                )

                qc = get_quant_config(mc, LoadConfig())
                result["quant_config"] = {"ok": True, "cls": type(qc).__name__, "name": qc.get_name()}
            except Exception as exc:
                result["quant_config"] = {"ok": False, "error": _err(exc)}
        try:
            result["sampling"] = {"ok": True, "defaults": mc.get_diff_sampling_param(),
                                  "generation_config": mc.try_get_generation_config()}
        except Exception as exc:
            result["sampling"] = {"ok": False, "error": _err(exc)}
        try:
            result["tokenizer"] = _tokenizer(a, mc, result.get("sampling") or {})
        except Exception as exc:
            result["tokenizer"] = {"ok": False, "error": _err(exc)}
    try:
        result["weights"] = _weights(a)
    except Exception as exc:
        result["weights"] = {"ok": False, "error": _err(exc)}
    if getattr(a, "dry_load", False) and mc is not None and (result.get("weights") or {}).get("use_safetensors"):
        try:
            result["dry_load"] = _dry_load(a, EngineArgs)
        except Exception as exc:
            result["dry_load"] = {"ok": False, "error": _err(exc)}
    result["ok"] = True
    return result


def _write(path: str, result: dict) -> None:
    with open(path + ".tmp", "w") as fh:
        json.dump(result, fh, default=str)
    os.replace(path + ".tmp", path)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--max-model-len", type=int, default=None)
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--tokenizer-mode", default=None)
    ap.add_argument("--out")
    ap.add_argument("--batch", default=None,
                    help="a JSON list of {model, max_model_len, dtype, out}: one import, many folders")
    a = ap.parse_args()
    jobs = [a] if not a.batch else [argparse.Namespace(**{"tokenizer_mode": None, "dtype": None, "max_model_len": None,
                                                          "dry_load": False, "gpu_cc": None, "tensor_parallel_size": 1, **j})
                                    for j in json.load(open(a.batch))]
    t0 = time.perf_counter()
    ok = True
    try:
        import logging

        import vllm
        from vllm.engine.arg_utils import EngineArgs

        logging.getLogger("vllm").setLevel(logging.ERROR)
        imported = round(time.perf_counter() - t0, 2)
        for job in jobs:
            t1 = time.perf_counter()
            try:
                result = answer(job, EngineArgs)
            except BaseException as exc:  # report, never hang: the parent reads the JSON
                result = {"ok": False, "error": _err(exc), "traceback": traceback.format_exc()[-3000:]}
            result.update(vllm_version=vllm.__version__, import_seconds=imported,
                          seconds=round(time.perf_counter() - t1 + (imported if job is jobs[0] else 0), 2))
            ok = ok and result["ok"]
            _write(job.out, result)
    except BaseException as exc:
        for job in jobs:
            if not os.path.exists(job.out):
                _write(job.out, {"ok": False, "error": _err(exc), "traceback": traceback.format_exc()[-3000:],
                                 "seconds": round(time.perf_counter() - t0, 2)})
        ok = False
    sys.stdout.flush()
    os._exit(0 if ok else 3)


if __name__ == "__main__":
    main()
