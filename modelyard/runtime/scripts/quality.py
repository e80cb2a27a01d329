"""Perplexity and KL divergence of a quantized model against its parent: the math only.

Needs torch and transformers and nothing of modelyard, so the same code also runs inside the
legacy quantizer venvs (``legacy_quantize.py`` beside it loads this file by path), where the quantized model
can be loaded back with that backend's transformers. ``quantize.evaluate_quality`` wraps it in the
pipeline's venv.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence


def windows(ids: Sequence[int], max_seq_len: int) -> list[list[int]]:
    """Split token ids into consecutive windows of at most ``max_seq_len`` tokens (those of one token,
    which predict nothing, are dropped)."""
    return [list(ids[i:i + max_seq_len]) for i in range(0, len(ids), max_seq_len) if len(ids[i:i + max_seq_len]) > 1]


def model_device(model: Any) -> Any:
    """The device of ``model``'s first parameter (where its inputs must be); CPU for a model without
    parameters."""
    import torch  # heavy: torch, imported on first use

    return next((p.device for p in model.parameters()), torch.device("cpu"))


def compare(load_parent: Callable[[], Any], load_quant: Callable[[], Any], wins: list[list[int]],
            advance: Callable[[int], None] = lambda n: None) -> dict[str, float]:
    """Run the parent then the quantized model (one in memory at a time) over ``wins`` and return
    ``{"ppl_parent", "ppl_quantized", "ppl_ratio", "kl_mean", "tokens"}``: perplexities over every
    predicted token, and the mean per-token KL(parent || quantized) in nats. ``advance(1)`` is called
    per window and model.

    Each model runs where it was loaded (CPU or a GPU: the token ids go to :func:`model_device`); the
    logits come back to the CPU as float32, so the sums are the same code on both."""
    import torch  # heavy: torch, imported on first use
    import torch.nn.functional as F  # heavy: torch, imported on first use

    parent_logits = []
    model = load_parent()
    dev = model_device(model)
    with torch.no_grad():
        for w in wins:
            parent_logits.append(model(torch.tensor([w], device=dev)).logits[0, :-1].float().cpu())
            advance(1)
    del model
    quant = load_quant()
    dev = model_device(quant)
    nll_p = nll_q = kl_sum = 0.0
    n_tok = 0
    with torch.no_grad():
        for w, lp in zip(wins, parent_logits):
            lq = quant(torch.tensor([w], device=dev)).logits[0, :-1].float().cpu()
            target = torch.tensor(w[1:])
            nll_p += F.cross_entropy(lp, target, reduction="sum").item()
            nll_q += F.cross_entropy(lq, target, reduction="sum").item()
            p_log, q_log = F.log_softmax(lp, -1), F.log_softmax(lq, -1)
            kl_sum += (p_log.exp() * (p_log - q_log)).sum().item()
            n_tok += len(w) - 1
            advance(1)
    ppl_p, ppl_q = math.exp(nll_p / n_tok), math.exp(nll_q / n_tok)
    return {"ppl_parent": round(ppl_p, 4), "ppl_quantized": round(ppl_q, 4), "ppl_ratio": round(ppl_q / ppl_p, 4),
            "kl_mean": round(kl_sum / n_tok, 5), "tokens": n_tok}
