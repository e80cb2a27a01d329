"""The numerical gate of every smoke: vLLM's log-likelihoods on fixed texts, against a second implementation.

The smoke asks vLLM for ``prompt_logprobs`` of the reference texts (``modelyard/data/reference-texts.yaml``,
:func:`reference_spec`) with the served tokenizer; :func:`reference_logprobs` runs transformers' forward
of the same checkpoint on the same token ids (float32, on the CPU, after vLLM has exited, so the two
never share memory); :func:`numeric_gate` hands both to :mod:`modelyard.checks.numeric` for the verdict.

The reference runs only where the model fits (:func:`fits_on_host`: its float32 weights at most half of
the host's available memory); elsewhere the record says "not compared" and why, as a warning.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import logging
from pathlib import Path
from typing import Any

import yaml

from modelyard import paths
from modelyard.checks import numeric
from modelyard.checks.base import Finding
from modelyard.model.checkpoint import read_safetensors_header

DATA = paths.DATA
TEXTS = DATA / "reference-texts.yaml"
TOP_K = 5  # vLLM prompt_logprobs per position: the partition the KL is measured on
CONTINUATION_TOKENS = 16
MEMINFO = Path("/proc/meminfo")


def reference_texts() -> list[dict[str, Any]]:
    """The reference texts: ``[{name, text, prose, source}]`` from :data:`TEXTS`."""
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


def reference_logprobs(model_dir: Path, records: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """transformers' view of ``records`` (the runner's, :func:`numeric.text_figures`): per text, per
    position i >= 1, ``{actual, top, argmax, max}`` read from its float32 log-softmax at i - 1. Raises
    whatever transformers raises when it cannot build or run the model."""
    import torch  # noqa: PLC0415 - heavy: torch, imported on first use
    import transformers  # noqa: PLC0415 - heavy: transformers, imported on first use
    from transformers import AutoModelForCausalLM  # noqa: PLC0415 - heavy: transformers, imported on first use

    transformers.utils.logging.disable_progress_bar()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model.eval()
    out: list[list[dict[str, Any]]] = []
    with torch.no_grad():
        for rec in records:
            ids = rec["ids"]
            logp = torch.log_softmax(model(torch.tensor([ids])).logits[0, :-1].float(), -1)
            mx, am = logp.max(-1)
            rows = []
            for i in range(1, len(ids)):
                row = logp[i - 1]
                rows.append({"actual": float(row[ids[i]]), "top": [float(row[t]) for t, _ in rec["top"][i]],
                             "argmax": int(am[i - 1]), "max": float(mx[i - 1])})
            out.append(rows)
    del model
    return out


def _quantized(model_dir: Path) -> bool:
    try:
        return "quantization_config" in json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return False


def numeric_gate(model_dir: Path, records: list[dict[str, Any]], vocab_size: int,
                 meminfo: Path = MEMINFO) -> tuple[numeric.NumericVerdict, list[Finding]]:
    """Judge the runner's ``records`` of ``model_dir`` (a model of ``vocab_size`` tokens): compare them
    with :func:`reference_logprobs` where :func:`fits_on_host` allows, then
    :func:`modelyard.checks.numeric.judge` (quantized limits for a checkpoint with a
    ``quantization_config``). A reference that fails to run is "not compared" with its error, never a
    pass by silence."""
    prose = {t["name"]: bool(t.get("prose")) for t in reference_texts()}
    why = fits_on_host(model_dir, meminfo)
    refs: list[Any] = [None] * len(records)
    label = None
    if why is None:
        try:
            refs = reference_logprobs(model_dir, records)
            label = f"transformers {md.version('transformers')}, float32, CPU"
        except Exception as exc:  # noqa: BLE001 - any failure of the second implementation is reported, not raised
            why = f"transformers could not run the checkpoint: {type(exc).__name__}: {str(exc)[:300]}"
    texts = [numeric.text_figures(r["name"], r, ref, prose=prose.get(r["name"], False)) for r, ref in zip(records, refs)]
    return numeric.judge(texts, vocab_size, quantized=_quantized(model_dir), not_compared=why, reference=label)
