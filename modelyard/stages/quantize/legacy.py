"""legacy: the GPTQ and AutoAWQ checkpoint formats, for runtimes that want them.

The compressed-tensors output of llm-compressor (``pipeline/quantize.py``) is what vLLM loads
natively; these two older formats are optional extras, each made by its own library in its own venv
because their pins clash with the pipeline's (llm-compressor pins transformers 5.15-5.17):

- ``gptq``: PyPI ``gptqmodel`` 7.6.0 (the maintained successor of ``auto-gptq``; ``auto-gptq`` 0.7.1
  needs transformers 4.x and CUDA, so modelyard does not build on it) in ``.venv-gptq``
  (``MODELYARD_GPTQMODEL_PYTHON``), with transformers 5.24 and ``optimum`` to load GPTQ back.
  ``GPTQMODEL_CPU_WORKERS`` defaults to 2: fewer stalls on this 2-core host.
- ``awq-gemm``: PyPI ``autoawq`` 0.2.9 (archived upstream; AWQ now lives in llm-compressor) in
  ``.venv-awq`` (``MODELYARD_AUTOAWQ_PYTHON``) on transformers 4.51.3: 4.57 removed
  ``PytorchGELUTanh``, which autoawq imports. transformers 4.x does not read the transformers-5
  config keys (``rope_parameters``, ``dtype``), so the runner hands it a rewritten view.

Both run ``runtime/scripts/legacy_quantize.py`` as a subprocess with a timeout; the quality evaluation of both formats
runs in the gptqmodel venv (see the runner's docstring for why).
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelyard import progress
from modelyard.errors import LegacyBackendError, RuntimeNotFoundError
from modelyard.paths import CHECKOUT
from modelyard.runtime.process import run_script
from modelyard.runtime.scripts import SCRIPTS
from modelyard.runtime.venv import isolated_env
from modelyard.settings import Settings

RUNNER = SCRIPTS / "legacy_quantize.py"
_CHECKOUT = CHECKOUT


@dataclass(frozen=True)
class Backend:
    """A legacy quantization library: its PyPI distribution, the venv ``make setup-legacy`` builds
    for it, and the env var that points at another interpreter."""

    dist: str
    venv: str
    env: str

    def python(self, settings: Settings) -> Path:
        """The backend's interpreter: ``$<env>`` (as ``settings`` read it) or ``<checkout>/<venv>/bin/python``
        (may not exist)."""
        configured = getattr(settings, self.env.removeprefix("MODELYARD_").lower())
        return Path(configured).expanduser() if configured else _CHECKOUT / self.venv / "bin" / "python"


BACKENDS = {
    "gptqmodel": Backend("gptqmodel", ".venv-gptq", "MODELYARD_GPTQMODEL_PYTHON"),
    "autoawq": Backend("autoawq", ".venv-awq", "MODELYARD_AUTOAWQ_PYTHON"),
}
#: the backend whose venv evaluates both formats (transformers 5 + gptqmodel's CPU kernels).
EVALUATOR = "gptqmodel"


def interpreter(backend: str, settings: Settings) -> Path:
    """The interpreter of ``backend`` under ``settings``; raises :class:`RuntimeNotFoundError` (exit 2) when absent."""
    b = BACKENDS[backend]
    py = b.python(settings)
    if not py.exists():
        raise RuntimeNotFoundError(f"the {b.dist} interpreter {py} does not exist",
                                   fix=f"Run `make setup-legacy` (creates {b.venv}) or set {b.env}.")
    return py


def _run(backend: str, mode: str, model: Path, out: Path, spec: dict[str, Any], timeout: float, label: str,
         settings: Settings) -> dict[str, Any]:
    py = interpreter(backend, settings)
    with tempfile.TemporaryDirectory(prefix="modelyard-legacy-") as tmp:
        spec_file, result, log = Path(tmp) / "spec.json", Path(tmp) / "result.json", Path(tmp) / "log.txt"
        spec_file.write_text(json.dumps(spec))
        env = isolated_env(tmp)
        args = [mode, "--backend", backend, "--model", str(model), "--out", str(out), "--spec", str(spec_file),
                "--result", str(result)]
        with progress.task(label, total=None):  # cwd: gptqmodel logs to ./logs
            run = run_script(py, RUNNER, args, env=env, timeout=timeout, log=log, cwd=tmp, grace=0)
        if run.timed_out:
            raise LegacyBackendError(f"{label} did not finish within {timeout:.0f} s",
                                     fix="Raise MODELYARD_QUANTIZE_TIMEOUT or use a larger host.")
        if not result.is_file():
            tail = run.tail[-2000:]
            raise LegacyBackendError(f"{label}: the {backend} interpreter exited with code {run.returncode} "
                                     f"without a result; log tail:\n{tail}")
        r = json.loads(result.read_text())
    if not r.get("ok"):
        detail = f"\n{r.get('traceback')}" if settings.verbose else ""
        raise LegacyBackendError(f"{label} failed: {r.get('error')}{detail}",
                                 fix="Run with MODELYARD_VERBOSE=1 to see the backend's traceback; check that the "
                                     "backend supports the model's architecture.")
    return r


@dataclass(frozen=True)
class LegacyQuantized:
    """What the backend's runner reported of a quantization: its wall time (seconds, measured in the runner),
    the versions of the libraries it ran (distribution -> version, None when absent) and the tail of gptqmodel's
    per-layer log (None for a backend that writes none)."""

    seconds: float | None
    tools: dict[str, str | None]
    quant_log: str | None = None


@dataclass(frozen=True)
class LegacyEvaluation:
    """What the evaluator reported: the quality figures (``quality.compare``'s: perplexities, KL, top-1
    agreement), how the quantized checkpoint was loaded, and the versions of the libraries it ran."""

    quality: dict[str, Any]
    loaded_with: str | None
    tools: dict[str, str | None]


def quantize(model_dir: Path, tmp_out: Path, backend: str, quant: dict[str, Any], texts: list[str], *,
             max_seq_len: int, timeout: float, settings: Settings) -> LegacyQuantized:
    """Quantize ``model_dir`` with ``backend`` into ``tmp_out`` (which the caller renames into place),
    then make its config.json the parent's config.json plus the backend's ``quantization_config``
    (keeping the verified config; AutoAWQ would write transformers-4 keys). ``quant``: ``bits``,
    ``group_size``, ``sym``, ``desc_act``. ``settings``: the run's (the backend's interpreter, ``verbose``).
    Returns what the runner reported. Raises :class:`RuntimeNotFoundError`,
    :class:`LegacyBackendError`."""
    spec = {"quant": quant, "texts": texts, "max_seq_len": max_seq_len}
    r = _run(backend, "quantize", model_dir, tmp_out, spec, timeout, f"quantizing with {backend}", settings)
    qcfg = dict(r.pop("backend_config").get("quantization_config") or {})
    if not qcfg:
        raise LegacyBackendError(f"{backend} wrote no quantization_config into {tmp_out}/config.json")
    meta = qcfg.get("meta")
    if isinstance(meta, dict):  # gptqmodel records its temp offload folder: a path of this run, not of the model
        qcfg["meta"] = {k: v for k, v in meta.items() if k != "offload_to_disk_path"}
    cfg = json.loads((model_dir / "config.json").read_text())
    cfg["quantization_config"] = qcfg
    (tmp_out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    quant_log = None
    if (tmp_out / "quant_log.csv").is_file():  # gptqmodel's per-layer log: kept in the result, not in model/
        quant_log = (tmp_out / "quant_log.csv").read_text()[-4000:]
        (tmp_out / "quant_log.csv").unlink()
    return LegacyQuantized(seconds=r.get("seconds"), tools=dict(r.get("tools") or {}), quant_log=quant_log)


def evaluate(parent_dir: Path, quant_dir: Path, heldout: str, *, max_seq_len: int, timeout: float,
             settings: Settings) -> LegacyEvaluation:
    """Perplexity and KL of ``quant_dir`` (GPTQ or AWQ GEMM) against ``parent_dir`` on the text
    ``heldout``, both loaded with plain transformers in the gptqmodel venv (``settings``: as for :func:`quantize`).
    Returns what the evaluator reported."""
    spec = {"heldout": heldout, "max_seq_len": max_seq_len, "texts": [], "quant": {}}
    r = _run(EVALUATOR, "evaluate", parent_dir, quant_dir, spec, timeout, "quality: perplexity and KL (transformers)",
             settings)
    return LegacyEvaluation(quality=r["quality"], loaded_with=r.get("loaded_with"), tools=dict(r.get("tools") or {}))


def quantize_config(recipe: dict[str, Any], name: str) -> tuple[str, dict[str, Any]]:
    """``(backend, quantize_config)`` from a legacy recipe (``backend:`` and ``quantize_config:``
    keys); raises ValueError naming what is missing."""
    backend = recipe.get("backend")
    qc = recipe.get("quantize_config")
    if backend not in BACKENDS or not isinstance(qc, dict):
        raise ValueError(f"the {name} recipe needs 'backend' (one of {', '.join(BACKENDS)}) and a 'quantize_config' mapping")
    for k in ("bits", "group_size"):
        if not isinstance(qc.get(k), int):
            raise ValueError(f"the {name} recipe's quantize_config needs an integer {k!r}")
    return backend, {k: v for k, v in qc.items() if k != "strategy"}
