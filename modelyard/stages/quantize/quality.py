"""The quantized model's quality against its parent: perplexity of both and the mean per-token KL on a held-out
text, computed with transformers, and the libraries kept quiet while they run."""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelyard import paths, progress
from modelyard.runtime.scripts import quality as _quality
from modelyard.settings import Settings

DATA = paths.DATA


@dataclass(frozen=True)
class Quality:
    """Perplexity of parent and quantized model on the held-out text, mean per-token
    KL(parent || quantized) in nats, over ``tokens`` tokens; thresholds and verdict."""

    ppl_parent: float
    ppl_quantized: float
    ppl_ratio: float
    kl_mean: float
    tokens: int
    max_ppl_ratio: float
    max_kl: float
    passed: bool
    text_sha256: str


class quiet_libraries:
    """Keep llm-compressor's loguru stream, the libraries' tqdm bars and their warnings off the
    terminal while quantizing or evaluating: stdout and stderr (Python's and file descriptors 1
    and 2) go to /dev/null for the duration. modelyard's CLI reports through its own duplicate of the terminal's
    stderr, so its progress stays visible. ``verbose`` (the run's ``settings.verbose``, ``MODELYARD_VERBOSE=1``)
    shows everything."""

    def __init__(self, verbose: bool) -> None:
        self.verbose = verbose

    def __enter__(self) -> None:

        self._stack = contextlib.ExitStack()
        if self.verbose:
            return
        self._stack.enter_context(warnings.catch_warnings())
        warnings.simplefilter("ignore")
        devnull = self._stack.enter_context(open(os.devnull, "w"))
        for fd, stream in ((1, sys.stdout), (2, sys.stderr)):  # llm-compressor's loguru sink is stdout
            try:
                stream.flush()
                saved = os.dup(fd)
            except (OSError, ValueError, AttributeError):
                continue
            os.dup2(devnull.fileno(), fd)
            self._stack.callback(os.close, saved)
            self._stack.callback(os.dup2, saved, fd)
        self._stack.enter_context(contextlib.redirect_stderr(devnull))
        self._stack.enter_context(contextlib.redirect_stdout(devnull))

    def __exit__(self, *exc: object) -> None:
        self._stack.close()


def evaluate_quality(parent_dir: Path, quant_dir: Path, text_file: Path | None = None, *, device: str,
                     max_seq_len: int = 512, max_ppl_ratio: float = 1.35, max_kl: float = 0.35) -> Quality:
    """Perplexity of both models on ``text_file`` (default: modelyard's held-out text) in windows
    of ``max_seq_len`` tokens, and the mean per-token KL(parent || quantized) in nats, computed
    with transformers (the quantized model is loaded from its saved compressed-tensors
    files, as it will be served) on ``device`` (:func:`eval_device` of the run's settings)."""
    import torch  # noqa: PLC0415 - heavy: torch, imported on first use
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: PLC0415 - heavy: transformers, imported on first use


    path = Path(text_file) if text_file else DATA / "heldout.txt"
    raw = path.read_bytes()
    tok = AutoTokenizer.from_pretrained(str(parent_dir), local_files_only=True)
    wins = _quality.windows(tok(raw.decode("utf-8"), add_special_tokens=False)["input_ids"], max_seq_len)
    place: dict[str, Any] = {} if device == "cpu" else {"device_map": device}
    with progress.task("quality: perplexity and KL", total=len(wins) * 2, unit="windows") as adv:
        m = _quality.compare(
            lambda: AutoModelForCausalLM.from_pretrained(str(parent_dir), dtype=torch.float32, local_files_only=True,
                                                         **place),
            # "auto": compressed-tensors layers keep their scales in the checkpoint dtype (NVFP4 fails in float32).
            lambda: AutoModelForCausalLM.from_pretrained(str(quant_dir), dtype="auto", local_files_only=True, **place),
            wins, adv)
    return quality_from(m, max_ppl_ratio, max_kl, hashlib.sha256(raw).hexdigest())


def eval_device(settings: Settings) -> str:
    """Where :func:`evaluate_quality` runs both models: ``settings.eval_device`` (``MODELYARD_EVAL_DEVICE``) when
    set (``cpu``, ``cuda``, ``cuda:1``), else ``cuda`` when torch sees a CUDA GPU, else ``cpu``. Quantization
    itself needs no such choice: llm-compressor onloads each layer to the accelerator it finds."""
    import torch  # noqa: PLC0415 - heavy: torch, imported on first use

    configured = (settings.eval_device or "").strip()
    if configured:
        return configured
    return "cuda" if torch.cuda.is_available() else "cpu"


def quality_from(m: dict[str, Any], max_ppl_ratio: float, max_kl: float, text_sha256: str) -> Quality:
    """A :class:`Quality` from :func:`_quality.compare`'s figures and the thresholds."""
    return Quality(m["ppl_parent"], m["ppl_quantized"], m["ppl_ratio"], m["kl_mean"], m["tokens"], max_ppl_ratio,
                   max_kl, m["ppl_ratio"] <= max_ppl_ratio and m["kl_mean"] <= max_kl, text_sha256)
