"""The numerical gate of every smoke: vLLM's log-likelihoods on fixed texts, against a second implementation.

The smoke asks vLLM for ``prompt_logprobs`` of the reference texts (``modelyard/data/reference-texts.yaml``,
:func:`reference_spec`) with the served tokenizer; :func:`reference_logprobs` runs transformers' forward
of the same checkpoint on the same token ids (float32, on the CPU: in a thread while vLLM loads where both
fit in memory at once, :class:`EarlyReference`, else after vLLM has exited); :func:`numeric_gate` hands
both to :mod:`modelyard.checks.numeric` for the verdict.

The reference runs only where the model fits (:func:`fits_on_host`: its float32 weights at most half of
the host's available memory); elsewhere the record says "not compared" and why, as a warning.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import yaml

from modelyard import paths
from modelyard.checks import adapter_numeric, numeric
from modelyard.checks.base import Finding
from modelyard.model.checkpoint import read_safetensors_header

DATA = paths.DATA
TEXTS = DATA / "reference-texts.yaml"
TOP_K = 5  # vLLM prompt_logprobs per position: the partition the KL is measured on
CONTINUATION_TOKENS = 16
MEMINFO = Path("/proc/meminfo")


def reference_texts() -> list[dict[str, Any]]:
    """The reference texts: ``[{name, text, prose, ppl_bound, source}]`` from :data:`TEXTS`."""
    return yaml.safe_load(TEXTS.read_text(encoding="utf-8"))["texts"]


def reference_spec() -> dict[str, Any]:
    """What the vLLM runners score: ``{texts: [{name, text}], top_k, continuation_tokens}``."""
    return {"texts": [{"name": t["name"], "text": t["text"]} for t in reference_texts()], "top_k": TOP_K,
            "continuation_tokens": CONTINUATION_TOKENS}


def parameter_count(model_dir: Path) -> int:
    """Elements of every tensor in ``model_dir``'s ``*.safetensors`` headers (header reads only)."""
    total = 0
    for shard in sorted(model_dir.glob("*.safetensors")):
        for info in read_safetensors_header(shard).tensors.values():
            n = 1
            for d in info.shape:
                n *= d
            total += n
    return total


def available_memory(meminfo: Path = MEMINFO) -> int | None:
    """``MemAvailable`` of ``meminfo`` in bytes, or None when unreadable."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def fits_on_host(model_dir: Path, meminfo: Path = MEMINFO) -> str | None:
    """None when transformers can run ``model_dir`` in float32 here (4 bytes per stored element, packed
    quantized weights counted as stored, times 2 for the forward's working memory, at most the host's
    available memory); else the reason, naming both sizes in GB."""
    need = parameter_count(model_dir) * 4 * 2
    have = available_memory(meminfo)
    if have is None:
        return "the host's available memory is unknown (no MemAvailable in /proc/meminfo)"
    if need > have:
        return f"float32 weights and working memory need about {need / 1e9:.1f} GB, the host has {have / 1e9:.1f} GB available"
    return None


def _load_reference(model_dir: Path) -> Any:
    import torch  # noqa: PLC0415 - heavy: torch, imported on first use
    import transformers  # noqa: PLC0415 - heavy: transformers, imported on first use
    from transformers import AutoModelForCausalLM  # noqa: PLC0415 - heavy: transformers, imported on first use

    transformers.utils.logging.disable_progress_bar()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model.eval()
    return model


def _log_softmax(model: Any, ids: list[int]) -> Any:
    """float32 log-softmax of the next-token logits at positions 0 .. len(ids) - 2: ``[len(ids) - 1, V]``."""
    import torch  # noqa: PLC0415 - heavy: torch, imported on first use

    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0, :-1].float(), -1)


def _read(logp: Any, rec: dict[str, Any]) -> list[dict[str, Any]]:
    ids = rec["ids"]
    mx, am = logp.max(-1)
    return [{"actual": float(logp[i - 1][ids[i]]), "top": [float(logp[i - 1][t]) for t, _ in rec["top"][i]],
             "argmax": int(am[i - 1]), "max": float(mx[i - 1])} for i in range(1, len(ids))]


def early_ids(model_dir: Path, max_model_len: int) -> list[list[int]]:
    """The reference texts' token ids as the runners make them (the model's tokenizer with its own special
    tokens, cut to ``max_model_len - continuation - 1`` tokens), read with this venv's transformers."""
    from transformers import AutoTokenizer  # noqa: PLC0415 - heavy: transformers, imported on first use

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    return [list(tok(t["text"]).input_ids)[: max(2, max_model_len - CONTINUATION_TOKENS - 1)] for t in reference_texts()]


class EarlyReference:
    """transformers' forward on the reference texts, started in a thread beside the vLLM runtime (whose load
    takes most of a smoke's wall time) on the ids :func:`early_ids` makes. :func:`reference_logprobs` uses a
    text's rows only when vLLM's ids for it are the same, so the comparison stays on the same token ids;
    a text whose ids differ is run again on vLLM's ids. Only started where both fit in memory at once
    (:func:`overlap_fits`)."""

    def __init__(self, model_dir: Path, max_model_len: int) -> None:
        from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415 - only when a smoke starts one

        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="modelyard-reference")
        self._future = self._pool.submit(self._run, model_dir, max_model_len)
        self._pool.shutdown(wait=False)

    @staticmethod
    def _run(model_dir: Path, max_model_len: int) -> tuple[Any, dict[tuple[int, ...], Any]]:
        model = _load_reference(model_dir)
        return model, {tuple(ids): _log_softmax(model, ids) for ids in early_ids(model_dir, max_model_len)}

    def result(self) -> tuple[Any, dict[tuple[int, ...], Any]]:
        """``(model, {ids: log-softmax})``; raises what the forward raised."""
        return self._future.result()


def overlap_fits(model_dir: Path, vocab_size: int, kv_cache_bytes: int, meminfo: Path = MEMINFO) -> bool:
    """May transformers' reference run while vLLM holds the model? Its float32 weights and working memory
    (as :func:`fits_on_host`), the reference rows it keeps (tokens x ``vocab_size`` x 4 bytes, at most 1024
    tokens counted), and vLLM's copy (the stored bytes plus ``kv_cache_bytes``) must all fit in the host's
    available memory."""
    have = available_memory(meminfo)
    if have is None:
        return False
    stored = sum(p.stat().st_size for p in model_dir.glob("*.safetensors"))
    need = parameter_count(model_dir) * 4 * 2 + 1024 * max(vocab_size, 0) * 4 + stored + kv_cache_bytes
    return need <= have


def start_early_reference(model_dir: Path, max_model_len: int, kv_cache_bytes: int,
                          meminfo: Path = MEMINFO) -> EarlyReference | None:
    """An :class:`EarlyReference` where :func:`overlap_fits` and :func:`fits_on_host` allow, else None (the
    reference then runs after vLLM has exited)."""
    try:
        vocab = int(json.loads((model_dir / "config.json").read_text()).get("vocab_size") or 0)
    except (OSError, ValueError, AttributeError, TypeError):
        return None
    if fits_on_host(model_dir, meminfo) is not None or not overlap_fits(model_dir, vocab, kv_cache_bytes, meminfo):
        return None
    return EarlyReference(model_dir, max_model_len)


def reference_logprobs(model_dir: Path, records: list[dict[str, Any]],
                       early: EarlyReference | None = None) -> list[list[dict[str, Any]]]:
    """transformers' view of ``records`` (the runner's, :func:`numeric.text_figures`): per text, per
    position i >= 1, ``{actual, top, argmax, max}`` read from its float32 log-softmax at i - 1, on the
    record's own ids (``early``'s rows where its ids are the same). Raises whatever transformers raises when
    it cannot build or run the model."""
    model: Any = None
    rows: dict[Any, Any] = {}
    if early is not None:
        try:
            model, rows = early.result()
        except Exception:  # noqa: BLE001 - run again below, where the error is reported
            model, rows = None, {}
    out: list[list[dict[str, Any]]] = []
    for rec in records:
        logp = rows.get(tuple(rec["ids"]))
        if logp is None:
            model = model if model is not None else _load_reference(model_dir)
            logp = _log_softmax(model, rec["ids"])
        out.append(_read(logp, rec))
    del model, rows
    return out


def _quantized(model_dir: Path) -> bool:
    try:
        return "quantization_config" in json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return False


def numeric_gate(model_dir: Path, records: list[dict[str, Any]], vocab_size: int,
                 meminfo: Path = MEMINFO, early: EarlyReference | None = None,
                 parent: Path | None = None) -> tuple[numeric.NumericVerdict, list[Finding]]:
    """Judge the runner's ``records`` of ``model_dir`` (a model of ``vocab_size`` tokens): compare them
    with :func:`reference_logprobs` where :func:`fits_on_host` allows, then
    :func:`modelyard.checks.numeric.judge` (quantized limits for a checkpoint with a
    ``quantization_config``). ``early`` is the reference started beside vLLM, if one was. A reference that
    fails to run is "not compared" with its error, never a pass by silence.

    ``parent``: the checkpoint ``model_dir`` was derived from (quantized or patched from; it shares the
    tokenizer, so the same ids apply): transformers' forward of it on the same ids is compared with vLLM's
    numbers by :func:`modelyard.checks.numeric.judge_parent`, recorded as the verdict's ``parent``."""
    declared = {t["name"]: t for t in reference_texts()}
    why = fits_on_host(model_dir, meminfo)
    refs: list[Any] = [None] * len(records)
    label = None
    if why is None:
        try:
            refs = reference_logprobs(model_dir, records, early)
            label = f"transformers {md.version('transformers')}, float32, CPU"
        except Exception as exc:  # noqa: BLE001 - any failure of the second implementation is reported, not raised
            why = f"transformers could not run the checkpoint: {type(exc).__name__}: {str(exc)[:300]}"
    texts = [numeric.text_figures(r["name"], r, ref, prose=bool(declared.get(r["name"], {}).get("prose")),
                                  ppl_bound=declared.get(r["name"], {}).get("ppl_bound")) for r, ref in zip(records, refs)]
    verdict, found = numeric.judge(texts, vocab_size, quantized=_quantized(model_dir), not_compared=why, reference=label)
    if parent is None or Path(parent).resolve() == Path(model_dir).resolve():
        return verdict, found
    pwhy = fits_on_host(Path(parent), meminfo)
    prefs: list[Any] = [None] * len(records)
    if pwhy is None:
        try:
            prefs = reference_logprobs(Path(parent), records)
        except Exception as exc:  # noqa: BLE001 - reported as not compared, never raised
            pwhy = f"transformers could not run the parent checkpoint: {type(exc).__name__}: {str(exc)[:300]}"
    ptexts = [numeric.text_figures(r["name"], r, ref) for r, ref in zip(records, prefs)]
    rec, pfound = numeric.judge_parent(ptexts, quantized=_quantized(model_dir), not_compared=pwhy,
                                       reference=f"transformers {md.version('transformers')}, float32, CPU, on the parent")
    passed = verdict.passed and not any(f.severity.value == "error" for f in pfound)
    return replace(verdict, parent=rec, passed=passed), found + pfound


def adapter_gate(records: list[dict[str, Any]], base_records: list[dict[str, Any]], vocab_size: int,
                 runtime: str) -> tuple[dict[str, Any], list[Finding]]:
    """A LoRA adapter's numerical gate: the runner's ``records`` of the reference texts through the adapter
    against ``base_records``, the same texts through the base alone in the same engine (``runtime`` names it,
    e.g. "vLLM 0.32.0"): :func:`modelyard.checks.adapter_numeric.judge_adapter`'s record and findings. No
    transformers reference runs: the base's own numbers were judged against it when the base was ingested."""
    adapter = [numeric.text_figures(r["name"], r, None) for r in records]
    base = [numeric.text_figures(r["name"], r, None) for r in base_records]
    return adapter_numeric.judge_adapter(adapter, base, vocab_size,
                                         reference=f"{runtime}, the base without the adapter, same engine and token ids")


def vocab_size(model_dir: Path) -> int:
    """``vocab_size`` of ``model_dir``'s config.json (its ``text_config``'s for a multimodal one); 0 when unknown."""
    try:
        cfg = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return 0
    v = cfg.get("vocab_size") or (cfg.get("text_config") or {}).get("vocab_size")
    return v if isinstance(v, int) else 0


def score_over_api(client: httpx.Client, name: str, spec: dict[str, Any], max_model_len: int) -> list[dict[str, Any]]:
    """The reference texts of ``spec`` (:func:`numeric.reference_spec`) scored through the server's own
    OpenAI API, as the ``load`` runner scores them offline: one ``/v1/completions`` request per text with
    the text as the prompt (so the served tokenizer encodes it, with its own bos policy), vLLM's extra
    parameters ``return_token_ids`` (the prompt's ids come back as ``prompt_token_ids``),
    ``truncate_prompt_tokens`` with ``truncation_side="right"`` (the first ``max_model_len -
    continuation - 1`` tokens, the load runner's cut) and ``prompt_logprobs``, and a greedy continuation.
    Only ``/v1/`` is used, so it works through a front that exposes nothing else (``/tokenize`` is not
    public behind the generated nginx). Returns the runner's record shape
    (:func:`modelyard.checks.numeric.text_figures`); raises ``httpx.HTTPStatusError`` on a failed request."""
    k, cont = spec["top_k"], spec["continuation_tokens"]
    records = []
    for t in spec["texts"]:
        r = client.post("/v1/completions", json={
            "model": name, "prompt": t["text"], "max_tokens": cont, "temperature": 0, "prompt_logprobs": k,
            "return_token_ids": True, "truncate_prompt_tokens": max(2, max_model_len - cont - 1),
            "truncation_side": "right"})
        r.raise_for_status()
        choice = r.json()["choices"][0]
        ids = [int(i) for i in choice["prompt_token_ids"]]
        logprobs: list[float | None] = [None]
        top: list[list[list[float]]] = [[]]
        for pos, entry in enumerate(choice["prompt_logprobs"][1:len(ids)], start=1):
            logprobs.append(float(entry[str(ids[pos])]["logprob"]))
            ranked = sorted(entry.items(), key=lambda kv: kv[1]["rank"])[:k]
            top.append([[int(i), float(v["logprob"])] for i, v in ranked])
        records.append({"name": t["name"], "ids": ids, "logprobs": logprobs, "top": top, "continuation": choice.get("text")})
    return records

def served_max_model_len(client: httpx.Client, name: str) -> int | None:
    """The ``max_model_len`` (tokens) that the server at ``client`` reports for model ``name`` in ``/v1/models``
    (vLLM's model card carries it); None when it does not say, or the request fails."""
    try:
        data = client.get("/v1/models").json().get("data") or []
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    n = next((m.get("max_model_len") for m in data if isinstance(m, dict) and m.get("id") == name), None)
    return n if isinstance(n, int) and n > 0 else None
