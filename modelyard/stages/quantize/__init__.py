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
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator

import yaml

from modelyard import paths, progress
from modelyard.checks import Report
from modelyard.errors import InsufficientResourcesError, QualityGateError, QuantizeError
from modelyard.model.checkpoint import Checkpoint
from modelyard.runtime.scripts import quality as _quality
from modelyard.settings import Settings
from modelyard.stages.quantize import compat, legacy
from modelyard.version import library_versions

RECIPES = paths.RECIPES
DATA = paths.DATA
GIB = 1024**3


@dataclass(frozen=True)
class Scheme:
    """A quantization scheme: its recipe file, family, whether it needs calibration data, the
    weight bits (for disk estimates) and the quality thresholds of its family."""

    name: str
    family: str
    needs_data: bool
    weight_bits: int
    max_ppl_ratio: float  # quantized / parent perplexity on the held-out text
    max_kl: float  # mean per-token KL(parent || quantized), nats
    backend: str = "llm-compressor"  # or a legacy backend of stages/quantize/legacy.py


#: Thresholds are per family: 8-bit schemes should be near-lossless; 4-bit ones lose more, most on
#: small models (measured on SmolLM2-135M: see README "Quantization").
SCHEMES: dict[str, Scheme] = {
    "w4a16": Scheme("w4a16", "int4", True, 4, 1.35, 0.35),
    "awq": Scheme("awq", "int4", True, 4, 1.35, 0.35),
    "w8a8": Scheme("w8a8", "int8", True, 8, 1.10, 0.10),
    "fp8-dynamic": Scheme("fp8-dynamic", "fp8", False, 8, 1.10, 0.10),
    "nvfp4": Scheme("nvfp4", "fp4", True, 4, 1.60, 0.60),
    "nvfp4a16": Scheme("nvfp4a16", "fp4", False, 4, 1.50, 0.50),
}
#: legacy formats (stages/quantize/legacy.py), each made by its own library in its own venv.
LEGACY_SCHEMES: dict[str, Scheme] = {
    "gptq": Scheme("gptq", "int4", True, 4, 1.35, 0.35, backend="gptqmodel"),
    "awq-gemm": Scheme("awq-gemm", "int4", True, 4, 1.35, 0.35, backend="autoawq"),
}
ALL_SCHEMES = {**SCHEMES, **LEGACY_SCHEMES}
#: groups used by llm-compressor's preset schemes (compressed-tensors quant_scheme.py).
_PRESET_GROUP = {"NVFP4": 16, "NVFP4A16": 16, "MXFP4": 32, "W4A16": 128, "W4A16_ASYM": 128}


@dataclass(frozen=True)
class Recipe:
    """The effective recipe: YAML ``text``, its ``sha256``, where it came from, and what
    :func:`fit_recipe` changed (``adjustments``, human-readable)."""

    text: str
    sha256: str
    source: str
    adjustments: tuple[str, ...] = ()


@dataclass(frozen=True)
class Calibration:
    """Calibration samples (texts), the data's sha256 and origin."""

    texts: tuple[str, ...]
    sha256: str
    source: str
    max_seq_len: int


@dataclass(frozen=True)
class Preflight:
    """Estimates and what is available, bytes."""

    weight_bytes: int
    ram_needed: int
    ram_available: int | None
    disk_needed: int
    disk_available: int


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


def scheme(name: str) -> Scheme:
    """The :class:`Scheme` called ``name``; raises :class:`QuantizeError` listing the valid names."""
    try:
        return ALL_SCHEMES[name]
    except KeyError as exc:
        raise QuantizeError(f"--quantize/--scheme {name!r} is not a scheme modelyard knows",
                            fix=f"Use one of: {', '.join(ALL_SCHEMES)}.") from exc


def load_recipe(name: str, recipe_file: Path | None = None) -> tuple[dict[str, Any], str]:
    """The recipe dict of scheme ``name`` (or of ``recipe_file``) and its source label.
    Raises :class:`QuantizeError` for an unreadable or non-YAML recipe."""
    path = Path(recipe_file) if recipe_file else RECIPES / f"{name}.yaml"
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise QuantizeError(f"recipe {path}: cannot read it as YAML ({exc})",
                            fix="Pass an llm-compressor recipe YAML file.") from exc
    if not isinstance(data, dict):
        raise QuantizeError(f"recipe {path} is not a YAML mapping of stages", fix="See modelyard/recipes/*.yaml.")
    return data, (f"modelyard/recipes/{name}.yaml" if recipe_file is None else str(path))


def input_widths(cfg: dict[str, Any]) -> dict[str, int]:
    """Input widths (elements) of the Linear layers of a decoder: q/k/v/gate/up read hidden_size,
    o_proj reads heads x head_dim, down_proj reads intermediate_size."""
    heads, hidden = cfg.get("num_attention_heads"), cfg.get("hidden_size")
    out = {}
    if isinstance(hidden, int):
        out["hidden_size"] = hidden
    head_dim = cfg.get("head_dim") if isinstance(cfg.get("head_dim"), int) else (
        hidden // heads if isinstance(hidden, int) and isinstance(heads, int) and heads else None)
    if isinstance(heads, int) and head_dim:
        out["num_attention_heads x head_dim"] = heads * head_dim
    for k in ("intermediate_size", "moe_intermediate_size"):
        if isinstance(cfg.get(k), int):
            out[k] = cfg[k]
    return out


def fit_recipe(recipe: dict[str, Any], cfg: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Lower every ``group_size`` (128 -> 64 -> 32) until it divides every Linear input width of
    ``cfg``; returns the new recipe and what changed. Raises :class:`QuantizeError` when no group
    down to 32 fits, or a preset scheme's fixed group does not."""
    widths = input_widths(cfg)
    out = copy.deepcopy(recipe)
    notes: list[str] = []

    def bad(g: int) -> list[str]:
        return [f"{k} {w}" for k, w in widths.items() if w % g]

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            g = node.get("group_size")
            if isinstance(g, int) and g > 0 and node.get("strategy") == "group" and bad(g):
                new = next((c for c in (g // 2, g // 4) if c >= 32 and not bad(c)), None)
                if new is None:
                    raise QuantizeError(f"group_size {g}: {', '.join(bad(g))} is not a multiple of it, nor of 64 or 32",
                                        fix="Use a per-channel scheme (w8a8, fp8-dynamic) for this model.")
                notes.append(f"group_size {g} -> {new}: {', '.join(bad(g))} is not a multiple of {g}")
                node["group_size"] = new
            preset = node.get("scheme")
            if isinstance(preset, str) and preset in _PRESET_GROUP and bad(_PRESET_GROUP[preset]):
                raise QuantizeError(f"scheme {preset} quantizes in groups of {_PRESET_GROUP[preset]}, and "
                                    f"{', '.join(bad(_PRESET_GROUP[preset]))} is not a multiple of it",
                                    fix="Choose another scheme for this model.")
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(out)
    return out, notes


def make_recipe(name: str, cfg: dict[str, Any], recipe_file: Path | None = None) -> Recipe:
    """Load, fit to ``cfg`` and serialize the recipe of scheme ``name``."""
    data, source = load_recipe(name, recipe_file)
    fitted, notes = fit_recipe(data, cfg)
    text = yaml.safe_dump(fitted, sort_keys=False)
    return Recipe(text, hashlib.sha256(text.encode()).hexdigest(), source, tuple(notes))


def load_calibration(path: Path | None, *, num_samples: int, max_seq_len: int, tokenizer: Any = None) -> Calibration:
    """Calibration texts from ``path``: a text file (samples separated by blank lines), a JSONL file
    (``{"text": ...}`` or ``{"messages": [...]}`` rendered with the chat template), or a folder saved
    with ``datasets.save_to_disk`` (column ``text``); default: ``modelyard/data/calibration.txt``.
    Local only. ``num_samples`` caps the count. Raises :class:`QuantizeError` for unreadable or
    empty data."""
    path = Path(path) if path else DATA / "calibration.txt"
    h = hashlib.sha256()
    texts: list[str] = []
    try:
        if path.is_dir():
            import datasets  # noqa: PLC0415 - heavy: datasets, imported on first use

            ds = datasets.load_from_disk(str(path))
            if isinstance(ds, datasets.DatasetDict):
                ds = ds[next(iter(ds))]
            if "text" not in ds.column_names:
                raise QuantizeError(f"--calibration {path}: the dataset has no 'text' column ({ds.column_names})",
                                    fix="Save a dataset with a 'text' column.")
            texts = [t for t in ds["text"][: num_samples * 4] if isinstance(t, str) and t.strip()]
            for f in sorted(p for p in path.rglob("*") if p.is_file()):
                h.update(f.relative_to(path).as_posix().encode() + b"\0" + f.read_bytes())
        else:
            raw = path.read_bytes()
            h.update(raw)
            text = raw.decode("utf-8")
            if path.suffix in (".jsonl", ".json"):
                for n, line in enumerate(text.splitlines(), 1):
                    if not line.strip():
                        continue
                    rec = json.loads(line)
                    if isinstance(rec, dict) and isinstance(rec.get("text"), str):
                        texts.append(rec["text"])
                    elif isinstance(rec, dict) and isinstance(rec.get("messages"), list) and tokenizer is not None:
                        texts.append(tokenizer.apply_chat_template(rec["messages"], tokenize=False))
                    else:
                        raise QuantizeError(f"--calibration {path}: line {n} has neither 'text' nor 'messages'",
                                            fix='Write one {"text": "..."} or {"messages": [...]} object per line.')
            else:
                texts = [p.strip() for p in text.split("\n\n") if p.strip()]
    except QuantizeError:
        raise
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise QuantizeError(f"--calibration {path}: cannot read it ({exc})",
                            fix="Pass a UTF-8 text or JSONL file, or a datasets folder.") from exc
    if not texts:
        raise QuantizeError(f"--calibration {path} holds no samples", fix="Pass a file with text in it.")
    return Calibration(tuple(texts[:num_samples]), h.hexdigest(), str(path), max_seq_len)


def preflight(model_dir: Path, sch: Scheme, out_parent: Path) -> Preflight:
    """Estimate RAM and disk for quantizing ``model_dir`` and refuse when they do not fit.

    RAM: 2.5 x the weight bytes (the model, calibration activations, GPTQ Hessians) + 1.5 GiB for
    the interpreter and libraries; disk: the weights at ``weight_bits`` plus 10% and 64 MiB.
    Raises :class:`InsufficientResourcesError` naming both numbers."""
    ckpt = Checkpoint(model_dir)
    weight_bytes = sum(t.end - t.begin for t in ckpt.tensors.values())
    ram_needed = int(weight_bytes * 2.5 + 1.5 * GIB)
    disk_needed = int(weight_bytes * sch.weight_bits / 16 * 1.1 + 64 * 1024**2)
    ram_avail = _mem_available()
    out_parent.mkdir(parents=True, exist_ok=True)
    disk_avail = shutil.disk_usage(out_parent).free
    pf = Preflight(weight_bytes, ram_needed, ram_avail, disk_needed, disk_avail)
    if ram_avail is not None and ram_needed > ram_avail:
        raise InsufficientResourcesError(
            f"quantizing {model_dir.name} ({weight_bytes / GIB:.1f} GiB of weights) needs about {ram_needed / GIB:.1f} GiB "
            f"of RAM; {ram_avail / GIB:.1f} GiB is available", fix="Run it on a host with more memory (or a GPU host).")
    if disk_needed > disk_avail:
        raise InsufficientResourcesError(
            f"the {sch.name} output needs about {disk_needed / GIB:.2f} GiB under {out_parent}; "
            f"{disk_avail / GIB:.2f} GiB is free", fix="Free disk space there or pass another --out.")
    return pf


def _mem_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


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


def quantize_model(model_dir: Path, out_model: Path, scheme_name: str, *, recipe_file: Path | None = None,  # noqa: PLR0913
                   calibration: Path | None = None, num_samples: int = 64, max_seq_len: int = 512,
                   quality_text: Path | None = None, max_ppl_ratio: float | None = None,
                   max_kl: float | None = None, evaluate: bool = True) -> QuantizeResult:
    """Quantize the model folder ``model_dir`` with ``scheme_name`` into ``out_model`` (created
    through a temp folder and a rename: complete or absent), then measure its quality against the
    parent on ``quality_text`` (default ``modelyard/data/heldout.txt``, never the calibration text;
    ``evaluate=False`` skips that, for benchmarks).

    ``num_samples`` calibration samples of at most ``max_seq_len`` tokens. Raises
    :class:`QuantizeError`, :class:`InsufficientResourcesError`; the quality verdict is in the
    result (the caller gates on it)."""

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
        return _quantize_legacy(model_dir, out_model, sch, recipe, pf, calibration=calibration,
                                num_samples=num_samples, max_seq_len=max_seq_len, quality_text=quality_text,
                                max_ppl_ratio=max_ppl_ratio, max_kl=max_kl, evaluate=evaluate)
    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    calib = load_calibration(calibration, num_samples=num_samples, max_seq_len=max_seq_len, tokenizer=tok)
    kw: dict[str, Any] = {}
    with _quiet_libraries():
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype="auto", local_files_only=True)
        _cpu_only_workarounds()
        from llmcompressor import oneshot  # noqa: PLC0415 - heavy: llm-compressor, imported on first use

        if sch.needs_data:  # data-free schemes (fp8-dynamic, nvfp4a16) skip the datasets import and the tokenizing
            from datasets import Dataset  # noqa: PLC0415 - heavy: datasets, imported on first use

            ds = Dataset.from_dict({"text": list(calib.texts)}).map(
                lambda r: tok(r["text"], truncation=True, max_length=max_seq_len, add_special_tokens=False),
                remove_columns=["text"])
            kw = {"dataset": ds, "max_seq_length": max_seq_len, "num_calibration_samples": len(calib.texts)}
    layers = int(cfg.get("num_hidden_layers") or 1)
    with _staged_output(model_dir, out_model) as tmp:
        with progress.task(f"quantizing {sch.name} (llm-compressor, {layers} layers)", total=None):
            with _quiet_libraries():
                oneshot(model=model, recipe=recipe.text, **kw)
                model.save_pretrained(str(tmp), save_compressed=True)
    seconds = time.perf_counter() - t0
    del model
    quality = None
    if evaluate:  # False only for benchmarks that time the quantization alone
        with _quiet_libraries():
            quality = evaluate_quality(model_dir, out_model, quality_text, max_seq_len=max_seq_len,
                                       max_ppl_ratio=max_ppl_ratio or sch.max_ppl_ratio, max_kl=max_kl or sch.max_kl)
    calib_rec = {"source": calib.source, "sha256": calib.sha256, "samples": len(calib.texts),
                 "max_seq_len": max_seq_len, "used": sch.needs_data}
    return QuantizeResult(sch.name, out_model, recipe, calib_rec, quality, pf, seconds, tool_versions())


def _quantize_legacy(model_dir: Path, out_model: Path, sch: Scheme, recipe: Recipe, pf: Preflight, *,  # noqa: PLR0913
                     calibration: Path | None, num_samples: int, max_seq_len: int, quality_text: Path | None,
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
    legacy.interpreter(backend)  # fail before any work when the venv is missing
    calib = load_calibration(calibration, num_samples=num_samples, max_seq_len=max_seq_len)
    timeout = Settings().quantize_timeout
    t0 = time.perf_counter()
    with _staged_output(model_dir, out_model) as tmp:
        r = legacy.quantize(model_dir, tmp, backend, qc, list(calib.texts), max_seq_len=max_seq_len, timeout=timeout)
    seconds = time.perf_counter() - t0
    quality, loaded_with, tools = None, None, dict(r.get("tools") or {})
    if evaluate:
        text = Path(quality_text) if quality_text else DATA / "heldout.txt"
        raw = text.read_bytes()
        e = legacy.evaluate(model_dir, out_model, raw.decode("utf-8"), max_seq_len=max_seq_len, timeout=timeout)
        quality = quality_from(e["quality"], max_ppl_ratio or sch.max_ppl_ratio, max_kl or sch.max_kl,
                               hashlib.sha256(raw).hexdigest())
        loaded_with = e.get("loaded_with")
        tools.update({f"evaluate:{k}": v for k, v in (e.get("tools") or {}).items()})
    calib_rec = {"source": calib.source, "sha256": calib.sha256, "samples": len(calib.texts),
                 "max_seq_len": max_seq_len, "used": True}
    return QuantizeResult(sch.name, out_model, recipe, calib_rec, quality, pf, seconds, tools,
                          backend=backend, loaded_with=loaded_with)


class _quiet_libraries:
    """Keep llm-compressor's loguru stream, the libraries' tqdm bars and their warnings off the
    terminal while quantizing or evaluating: stdout and stderr (Python's and file descriptors 1
    and 2) go to /dev/null for the duration. modelyard's CLI reports through its own duplicate of the terminal's
    stderr, so its progress stays visible. ``MODELYARD_VERBOSE=1`` shows everything."""

    def __enter__(self) -> None:

        self._stack = contextlib.ExitStack()
        if Settings().verbose:
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


def evaluate_quality(parent_dir: Path, quant_dir: Path, text_file: Path | None = None, *, max_seq_len: int = 512,
                     max_ppl_ratio: float = 1.35, max_kl: float = 0.35) -> Quality:
    """Perplexity of both models on ``text_file`` (default: modelyard's held-out text) in windows
    of ``max_seq_len`` tokens, and the mean per-token KL(parent || quantized) in nats, computed
    with transformers (the quantized model is loaded from its saved compressed-tensors
    files, as it will be served) on :func:`eval_device`."""
    import torch  # noqa: PLC0415 - heavy: torch, imported on first use
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: PLC0415 - heavy: transformers, imported on first use


    path = Path(text_file) if text_file else DATA / "heldout.txt"
    raw = path.read_bytes()
    tok = AutoTokenizer.from_pretrained(str(parent_dir), local_files_only=True)
    wins = _quality.windows(tok(raw.decode("utf-8"), add_special_tokens=False)["input_ids"], max_seq_len)
    dev = eval_device()
    place: dict[str, Any] = {} if dev == "cpu" else {"device_map": dev}
    with progress.task("quality: perplexity and KL", total=len(wins) * 2, unit="windows") as adv:
        m = _quality.compare(
            lambda: AutoModelForCausalLM.from_pretrained(str(parent_dir), dtype=torch.float32, local_files_only=True,
                                                         **place),
            # "auto": compressed-tensors layers keep their scales in the checkpoint dtype (NVFP4 fails in float32).
            lambda: AutoModelForCausalLM.from_pretrained(str(quant_dir), dtype="auto", local_files_only=True, **place),
            wins, adv)
    return quality_from(m, max_ppl_ratio, max_kl, hashlib.sha256(raw).hexdigest())


def eval_device() -> str:
    """Where :func:`evaluate_quality` runs both models: ``MODELYARD_EVAL_DEVICE`` when set (``cpu``,
    ``cuda``, ``cuda:1``), else ``cuda`` when torch sees a CUDA GPU, else ``cpu``. Quantization
    itself needs no such choice: llm-compressor onloads each layer to the accelerator it finds."""
    import torch  # noqa: PLC0415 - heavy: torch, imported on first use

    configured = (Settings().eval_device or "").strip()
    if configured:
        return configured
    return "cuda" if torch.cuda.is_available() else "cpu"


def quality_from(m: dict[str, Any], max_ppl_ratio: float, max_kl: float, text_sha256: str) -> Quality:
    """A :class:`Quality` from :func:`_quality.compare`'s figures and the thresholds."""
    return Quality(m["ppl_parent"], m["ppl_quantized"], m["ppl_ratio"], m["kl_mean"], m["tokens"], max_ppl_ratio,
                   max_kl, m["ppl_ratio"] <= max_ppl_ratio and m["kl_mean"] <= max_kl, text_sha256)


def data_digest(path: Path | None) -> str:
    """sha256 of a calibration source (file bytes, or a folder's relative paths and bytes);
    the default set when ``path`` is None."""
    path = Path(path) if path else DATA / "calibration.txt"
    h = hashlib.sha256()
    try:
        if path.is_dir():
            for f in sorted(p for p in path.rglob("*") if p.is_file()):
                h.update(f.relative_to(path).as_posix().encode() + b"\0" + f.read_bytes())
        else:
            h.update(path.read_bytes())
    except OSError as exc:
        raise QuantizeError(f"--calibration {path}: cannot read it ({exc.strerror})",
                            fix="Pass a readable file or folder.") from exc
    return h.hexdigest()


def variant_digest(model_dir: Path, options: Any) -> str:
    """sha256 (hex) identifying a quantized variant: scheme, effective recipe, calibration data and
    sizes. ``options`` has ``scheme``, ``recipe``, ``calibration`` (paths or None), ``num_samples`` and
    ``max_seq_len`` (the flow's ``QuantizeOptions``). Same inputs, same digest: the store reuses the
    artifact instead of quantizing again."""
    cfg = Checkpoint(model_dir).text_config
    recipe = make_recipe(options.scheme, cfg, Path(options.recipe) if options.recipe else None)
    key = json.dumps({"scheme": options.scheme, "recipe": recipe.sha256,
                      "calibration": data_digest(Path(options.calibration) if options.calibration else None),
                      "num_samples": options.num_samples, "max_seq_len": options.max_seq_len}, sort_keys=True)
    return hashlib.sha256(key.encode()).hexdigest()


def manifest_record(record: dict[str, Any]) -> dict[str, Any]:
    """The quantization record as the manifest and the report keep it: without the recipe's text
    (``recipe.yaml`` beside ``model/`` holds it)."""
    return {k: v for k, v in record.items() if k != "recipe"} | {"recipe": {k: v for k, v in record["recipe"].items() if k != "text"}}


def judge(model_dir: Path, result: QuantizeResult, report: Report, runtime: str | None) -> Report:
    """The quantized model's report: ``report`` (the verification of ``model_dir``) plus whether
    ``runtime`` loads its format (:func:`compat.check_runtime`), with the quantization record.
    ``modelyard quantize`` and the ingest flow both judge through it; gate with
    :func:`modelyard.stages.verify.gate` and :func:`quality_gate`."""
    findings = tuple(compat.check_runtime(model_dir, runtime))
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
