"""quantize: produce a checkpoint the target vLLM loads natively, with llm-compressor.

Primary backend: PyPI ``llmcompressor`` (the vLLM project's own), output in compressed-tensors
format. One recipe YAML per scheme lives in ``modelyard/recipes/`` (``--recipe FILE`` overrides);
the *effective* recipe (after :func:`fit_recipe`) and its sha256 go into the record with the
library versions, the calibration data's digest and the quality measurements.

Rules of judgement kept here (the rest is llm-compressor's):

- group size: a Linear whose input width is not a multiple of the group cannot be group-quantized
  (llm-compressor ``validate_group_size_divisibility``; compressed-tensors fails at save or run).
  SmolLM2-135M's hidden_size 576 is not a multiple of 128, so the group is lowered to the largest of
  128, 64, 32 that divides every input width, and the change is recorded.
- preflight: RAM about 2.5 x the weight bytes + 1.5 GiB (the model, its calibration activations and
  GPTQ Hessians), disk about the output size; refused before anything starts when they do not fit.
- CPU-only hosts: see :func:`_cpu_only_workarounds`.

The concerns live in their own modules, re-exported here: :mod:`.schemes`, :mod:`.recipe`, :mod:`.calibration`,
:mod:`.resources` (the preflight), :mod:`.quality`; :mod:`.legacy` (the legacy formats' venvs) and :mod:`.compat` (what the
runtime loads). This module quantizes and judges.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator

import yaml

from modelyard import progress
from modelyard.checks import Report
from modelyard.errors import QualityGateError, QuantizeError
from modelyard.model.checkpoint import Checkpoint
from modelyard.settings import Settings
from modelyard.stages.quantize import compat, legacy
from modelyard.stages.quantize.calibration import DATA, Calibration, data_digest, load_calibration
from modelyard.stages.quantize.quality import Quality, eval_device, evaluate_quality, quality_from, quiet_libraries
from modelyard.stages.quantize.recipe import RECIPES, Recipe, fit_recipe, input_widths, load_recipe, make_recipe
from modelyard.stages.quantize.resources import GIB, Preflight, preflight
from modelyard.stages.quantize.schemes import ALL_SCHEMES, LEGACY_SCHEMES, SCHEMES, Scheme, scheme
from modelyard.version import library_versions

__all__ = [
    "ALL_SCHEMES", "Calibration", "compat", "DATA", "data_digest", "eval_device", "evaluate_quality", "fit_recipe",
    "GIB", "input_widths", "judge", "legacy", "LEGACY_SCHEMES", "load_calibration", "load_recipe", "make_recipe",
    "manifest_record", "Preflight", "preflight", "Quality", "quality_from", "quality_gate", "QuantizeResult",
    "quantize_model", "quiet_libraries", "RECIPES", "Recipe", "Scheme", "scheme", "SCHEMES", "tool_versions",
    "variant_digest",
]


@dataclass(frozen=True)
class QuantizeResult:
    scheme: str
    model_dir: Path
    recipe: Recipe
    calibration: dict[str, Any]
    quality: Quality | None
    preflight: Preflight
    seconds: float
    tools: dict[str, str | None] = field(default_factory=dict)
    backend: str = "llm-compressor"
    loaded_with: str | None = None  # how the quality evaluation loaded the output (legacy formats)

    def record(self) -> dict[str, Any]:
        """The ``quantization`` record for the manifest and ``quantization.json``."""
        return {"scheme": self.scheme, "backend": self.backend, "loaded_with": self.loaded_with,
                "recipe": {"sha256": self.recipe.sha256, "source": self.recipe.source,
                           "adjustments": list(self.recipe.adjustments), "text": self.recipe.text},
                "calibration": self.calibration, "quality": asdict(self.quality) if self.quality else None,
                "preflight": asdict(self.preflight), "seconds": round(self.seconds, 2), "tools": self.tools}


def _cpu_only_workarounds() -> None:
    """llm-compressor 0.14's AWQ grid search pins cached activations in page-locked memory
    (``IntermediatesCache.pin_memory``, called from ``AWQModifier._apply_smoothing``); on a host
    without an accelerator torch raises "Cannot access accelerator device when none is available".
    Pinning only speeds host-to-device copies, so without an accelerator it is made a no-op."""
    import torch  # noqa: PLC0415 - heavy: torch, imported on first use

    if torch.accelerator.is_available():
        return
    from llmcompressor.pipelines.cache import IntermediatesCache  # noqa: PLC0415 - heavy: llm-compressor, imported on first use

    IntermediatesCache.pin_memory = lambda self, batch_index, input_names=None: None  # type: ignore[method-assign]


def tool_versions() -> dict[str, str | None]:
    """Versions of the libraries that quantized (None when one is not installed)."""
    return dict(library_versions(("llmcompressor", "compressed-tensors", "transformers", "torch")))


#: files of the source copied byte for byte next to the quantized weights.
_CARRY = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json",
          "chat_template.jinja", "generation_config.json", "vocab.json", "merges.txt", "added_tokens.json")


@contextlib.contextmanager
def _staged_output(model_dir: Path, out_model: Path) -> Iterator[Path]:
    """Yield a temp folder beside ``out_model`` for the backend to save into; on success copy the
    source's tokenizer and generation files (:data:`_CARRY`) next to the weights and rename the
    folder to ``out_model`` (complete or absent); on any failure remove it."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_model.name}.", dir=out_model.parent))
    try:
        yield tmp
        for name in _CARRY:
            if (model_dir / name).is_file():
                shutil.copyfile(model_dir / name, tmp / name)
        os.chmod(tmp, 0o755)
        if out_model.exists():
            raise QuantizeError(f"{out_model} already exists", fix="Pass a new output folder.")
        os.rename(tmp, out_model)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def quantize_model(model_dir: Path, out_model: Path, scheme_name: str, *, settings: Settings,  # noqa: PLR0913
                   recipe_file: Path | None = None, calibration: Path | None = None, num_samples: int = 64,
                   max_seq_len: int = 512, quality_text: Path | None = None, max_ppl_ratio: float | None = None,
                   max_kl: float | None = None, evaluate: bool = True) -> QuantizeResult:
    """Quantize the model folder ``model_dir`` with ``scheme_name`` into ``out_model`` (created
    through a temp folder and a rename: complete or absent), then measure its quality against the
    parent on ``quality_text`` (default ``modelyard/data/heldout.txt``, never the calibration text;
    ``evaluate=False`` skips that, for benchmarks). ``settings``: the run's (``verbose``, ``eval_device``, and for
    the legacy formats ``quantize_timeout`` and the backends' interpreters).

    ``num_samples`` calibration samples of at most ``max_seq_len`` tokens. Raises
    :class:`QuantizeError`, :class:`InsufficientResourcesError`; the quality verdict is in the
    result (the caller gates on it).

    The samples are calibrated in a fixed order (llm-compressor's ``shuffle_calibration_samples=False``; its
    default shuffles them with an unseeded ``RandomSampler``, so GPTQ's Hessian was summed in another order on
    every run): one model, recipe and data give the same weights byte for byte."""

    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: PLC0415 - heavy: transformers, imported on first use

    sch = scheme(scheme_name)
    ckpt = Checkpoint(model_dir)
    cfg = ckpt.text_config
    if not cfg:
        raise QuantizeError(f"{model_dir}/config.json is missing or invalid", fix="Verify the folder first.")
    recipe = make_recipe(scheme_name, cfg, recipe_file)
    out_model = Path(out_model)
    pf = preflight(model_dir, sch, out_model.parent)
    if sch.backend != "llm-compressor":
        return _quantize_legacy(model_dir, out_model, sch, recipe, pf, settings=settings, calibration=calibration,
                                num_samples=num_samples, max_seq_len=max_seq_len, quality_text=quality_text,
                                max_ppl_ratio=max_ppl_ratio, max_kl=max_kl, evaluate=evaluate)
    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    calib = load_calibration(calibration, num_samples=num_samples, max_seq_len=max_seq_len, tokenizer=tok)
    kw: dict[str, Any] = {}
    with quiet_libraries(settings.verbose):
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype="auto", local_files_only=True)
        _cpu_only_workarounds()
        from llmcompressor import oneshot  # noqa: PLC0415 - heavy: llm-compressor, imported on first use

        if sch.needs_data:  # data-free schemes (fp8-dynamic, nvfp4a16) skip the datasets import and the tokenizing
            from datasets import Dataset  # noqa: PLC0415 - heavy: datasets, imported on first use

            ds = Dataset.from_dict({"text": list(calib.texts)}).map(
                lambda r: tok(r["text"], truncation=True, max_length=max_seq_len, add_special_tokens=False),
                remove_columns=["text"])
            kw = {"dataset": ds, "max_seq_length": max_seq_len, "num_calibration_samples": len(calib.texts),
                  "shuffle_calibration_samples": False}
    layers = int(cfg.get("num_hidden_layers") or 1)
    with _staged_output(model_dir, out_model) as tmp:
        with progress.task(f"quantizing {sch.name} (llm-compressor, {layers} layers)", total=None):
            with quiet_libraries(settings.verbose):
                oneshot(model=model, recipe=recipe.text, **kw)
                model.save_pretrained(str(tmp), save_compressed=True)
    seconds = time.perf_counter() - t0
    del model
    quality = None
    if evaluate:  # False only for benchmarks that time the quantization alone
        with quiet_libraries(settings.verbose):
            quality = evaluate_quality(model_dir, out_model, quality_text, device=eval_device(settings),
                                       max_seq_len=max_seq_len, max_ppl_ratio=max_ppl_ratio or sch.max_ppl_ratio,
                                       max_kl=max_kl or sch.max_kl)
    calib_rec = {"source": calib.source, "sha256": calib.sha256, "samples": len(calib.texts),
                 "max_seq_len": max_seq_len, "used": sch.needs_data}
    return QuantizeResult(sch.name, out_model, recipe, calib_rec, quality, pf, seconds, tool_versions())


def _quantize_legacy(model_dir: Path, out_model: Path, sch: Scheme, recipe: Recipe, pf: Preflight, *,  # noqa: PLR0913
                     settings: Settings, calibration: Path | None, num_samples: int, max_seq_len: int, quality_text: Path | None,
                     max_ppl_ratio: float | None, max_kl: float | None, evaluate: bool) -> QuantizeResult:
    """:func:`quantize_model` for the legacy formats: the backend runs in its own venv
    (``stages/quantize/legacy.py``); the output is renamed into place only when complete."""


    try:
        backend, qc = legacy.quantize_config(yaml.safe_load(recipe.text), sch.name)
    except ValueError as exc:
        raise QuantizeError(f"recipe {recipe.source}: {exc}", fix="See modelyard/recipes/gptq.yaml.") from exc
    if backend != sch.backend:
        raise QuantizeError(f"recipe {recipe.source} names backend {backend!r}; scheme {sch.name} uses {sch.backend!r}",
                            fix=f"Set 'backend: {sch.backend}' in the recipe.")
    legacy.interpreter(backend, settings)  # fail before any work when the venv is missing
    calib = load_calibration(calibration, num_samples=num_samples, max_seq_len=max_seq_len)
    timeout = settings.quantize_timeout
    t0 = time.perf_counter()
    with _staged_output(model_dir, out_model) as tmp:
        r = legacy.quantize(model_dir, tmp, backend, qc, list(calib.texts), max_seq_len=max_seq_len, timeout=timeout,
                            settings=settings)
    seconds = time.perf_counter() - t0
    quality, loaded_with, tools = None, None, dict(r.tools)
    if evaluate:
        text = Path(quality_text) if quality_text else DATA / "heldout.txt"
        raw = text.read_bytes()
        e = legacy.evaluate(model_dir, out_model, raw.decode("utf-8"), max_seq_len=max_seq_len, timeout=timeout,
                            settings=settings)
        quality = quality_from(e.quality, max_ppl_ratio or sch.max_ppl_ratio, max_kl or sch.max_kl,
                               hashlib.sha256(raw).hexdigest())
        loaded_with = e.loaded_with
        tools.update({f"evaluate:{k}": v for k, v in e.tools.items()})
    calib_rec = {"source": calib.source, "sha256": calib.sha256, "samples": len(calib.texts),
                 "max_seq_len": max_seq_len, "used": True}
    return QuantizeResult(sch.name, out_model, recipe, calib_rec, quality, pf, seconds, tools,
                          backend=backend, loaded_with=loaded_with)


def variant_digest(model_dir: Path, options: Any) -> str:
    """sha256 (hex) identifying a quantized variant: scheme, effective recipe, calibration data and
    sizes. ``options`` has ``quantize`` (the scheme's name), ``recipe``, ``calibration`` (paths or None),
    ``num_samples`` and ``max_seq_len`` (the flow's ``QuantizeOptions``). Same inputs, same digest: the store
    reuses the artifact instead of quantizing again."""
    cfg = Checkpoint(model_dir).text_config
    recipe = make_recipe(options.quantize, cfg, Path(options.recipe) if options.recipe else None)
    key = json.dumps({"scheme": options.quantize, "recipe": recipe.sha256,
                      "calibration": data_digest(Path(options.calibration) if options.calibration else None),
                      "num_samples": options.num_samples, "max_seq_len": options.max_seq_len}, sort_keys=True)
    return hashlib.sha256(key.encode()).hexdigest()


def manifest_record(record: dict[str, Any]) -> dict[str, Any]:
    """The quantization record as the manifest and the report keep it: without the recipe's text
    (``recipe.yaml`` beside ``model/`` holds it)."""
    return {k: v for k, v in record.items() if k != "recipe"} | {"recipe": {k: v for k, v in record["recipe"].items() if k != "text"}}


def judge(model_dir: Path, result: QuantizeResult, report: Report, runtime: str | None, settings: Settings) -> Report:
    """The quantized model's report: ``report`` (the verification of ``model_dir``) plus whether
    ``runtime`` loads its format (:func:`compat.check_runtime`, this host's measured row read under ``settings``),
    with the quantization record.
    ``modelyard quantize`` and the ingest flow both judge through it; gate with
    :func:`modelyard.stages.verify.gate` and :func:`quality_gate`."""
    findings = tuple(compat.check_runtime(model_dir, runtime, settings))
    return replace(report, findings=report.findings + findings).with_quantization(manifest_record(result.record()))


def quality_gate(result: QuantizeResult, *, accept: bool = False) -> None:
    """Raise :class:`QualityGateError` (exit 1) when the quality thresholds were exceeded, unless
    ``accept`` (``--accept-quality-loss``)."""
    q = result.quality
    if q is None or q.passed or accept:
        return
    raise QualityGateError(
        f"{result.scheme} lost too much quality: perplexity {q.ppl_parent} -> {q.ppl_quantized} (x{q.ppl_ratio}, "
        f"limit x{q.max_ppl_ratio}), mean KL {q.kl_mean} nats/token (limit {q.max_kl})",
        fix="Use more or better calibration data (--calibration, --num-samples), a gentler scheme (w8a8), or "
            "pass --accept-quality-loss to publish anyway.")
