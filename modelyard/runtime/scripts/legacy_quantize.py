"""Runs INSIDE a legacy quantizer's own venv (gptqmodel or autoawq), as a script.

Stdlib + that backend + its transformers; nothing of modelyard is imported except the quality math,
``quality.py``, loaded by file path. Called by ``stages/quantize/legacy.py``::

    python legacy_quantize.py quantize --backend gptqmodel|autoawq --model DIR --out DIR --spec spec.json --result r.json
    python legacy_quantize.py evaluate --model PARENT --out QUANTIZED --spec spec.json --result r.json

``spec.json``: ``{"quant": {"bits", "group_size", "sym", "desc_act"}, "texts": [...], "max_seq_len": N,
"heldout": "text"}``. The result JSON has ``ok``, ``error``, ``traceback``, ``tools`` and, for
``quantize``, ``seconds`` and ``backend_config`` (the config.json the backend wrote); for ``evaluate``,
``quality`` (``quality.compare``'s figures) and ``loaded_with``.

``evaluate`` runs in the gptqmodel venv for both formats: its transformers 5 loads GPTQ and AWQ GEMM
checkpoints on CPU through gptqmodel's torch kernels (``TorchAtenLinear`` / ``TorchAtenAwqLinear``),
while AutoAWQ's transformers 4.x refuses AWQ on a CPU without intel-extension-for-pytorch (none
exists for torch 2.13). Loading AutoAWQ's output with another implementation also proves the format.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

os.environ.setdefault("GPTQMODEL_CPU_WORKERS", "2")  # gptqmodel 7.6 on a 2-core host stalls with fewer
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _tf_major() -> int:
    return int(md.version("transformers").split(".")[0])


def legacy_view(src: Path, dst: Path) -> Path:
    """A folder of links to ``src`` whose config.json and tokenizer_config.json are rewritten for
    transformers 4.x: ``rope_parameters`` -> ``rope_theta`` + ``rope_scaling``, ``dtype`` ->
    ``torch_dtype``, the transformers-5 tokenizer class ``TokenizersBackend`` ->
    ``PreTrainedTokenizerFast``. transformers 4.x ignores the 5.x keys silently (a model would run
    with the default rope_theta), hence the rewrite. With transformers >= 5, ``src`` itself."""
    if _tf_major() >= 5:
        return src
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.name not in ("config.json", "tokenizer_config.json"):
            os.symlink(f.resolve(), dst / f.name)
    cfg = json.loads((src / "config.json").read_text())
    rp = cfg.pop("rope_parameters", None)
    if isinstance(rp, dict):
        rp = dict(rp)
        cfg.setdefault("rope_theta", rp.pop("rope_theta", 10000.0))
        if rp.get("rope_type", "default") != "default":
            cfg["rope_scaling"] = rp
    if "dtype" in cfg:
        cfg["torch_dtype"] = cfg.pop("dtype")
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    if (src / "tokenizer_config.json").is_file():
        tc = json.loads((src / "tokenizer_config.json").read_text())
        if tc.get("tokenizer_class") in ("TokenizersBackend", None):
            tc["tokenizer_class"] = "PreTrainedTokenizerFast"
        if isinstance(tc.get("extra_special_tokens"), list):  # a dict in 4.x
            tc["additional_special_tokens"] = tc.pop("extra_special_tokens")
        (dst / "tokenizer_config.json").write_text(json.dumps(tc, indent=2))
    return dst


def _truncate(tok, texts: list[str], max_seq_len: int) -> list[str]:
    out = []
    for t in texts:
        ids = tok(t, add_special_tokens=False)["input_ids"][:max_seq_len]
        out.append(tok.decode(ids))
    return out


def quantize_gptqmodel(src: Path, out: Path, quant: dict, texts: list[str]) -> None:
    from gptqmodel import GPTQModel, QuantizeConfig

    cfg = QuantizeConfig(bits=quant["bits"], group_size=quant["group_size"], desc_act=quant.get("desc_act", False),
                         sym=quant.get("sym", True))
    model = GPTQModel.load(str(src), cfg)
    model.quantize(texts, batch_size=1)
    model.save(str(out))


def quantize_autoawq(src: Path, out: Path, quant: dict, texts: list[str], max_seq_len: int) -> None:
    from awq import AutoAWQForCausalLM
    from transformers import AutoTokenizer

    model = AutoAWQForCausalLM.from_pretrained(str(src))
    tok = AutoTokenizer.from_pretrained(str(src))
    qc = {"zero_point": not quant.get("sym", False), "q_group_size": quant["group_size"], "w_bit": quant["bits"],
          "version": "GEMM"}
    # n_parallel_calib_samples=None: every sample in one forward (small calibration sets, CPU).
    model.quantize(tok, quant_config=qc, calib_data=texts, max_calib_seq_len=max_seq_len,
                   n_parallel_calib_samples=None)
    model.save_quantized(str(out))


def _tools(*dists: str) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for dist in dists:
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            out[dist] = None
    return out


def run_quantize(a: argparse.Namespace, spec: dict, res: dict) -> None:
    from transformers import AutoTokenizer

    res["tools"] = _tools("transformers", "torch", a.backend)
    tmp = Path(tempfile.mkdtemp(prefix="modelyard-legacy-"))
    try:
        src = legacy_view(a.model, tmp / "src")
        tok = AutoTokenizer.from_pretrained(str(src))
        texts = _truncate(tok, spec["texts"], spec["max_seq_len"])
        t0 = time.perf_counter()
        if a.backend == "gptqmodel":
            quantize_gptqmodel(src, a.out, spec["quant"], texts)
        else:
            quantize_autoawq(src, a.out, spec["quant"], texts, spec["max_seq_len"])
        res["seconds"] = round(time.perf_counter() - t0, 2)
        res["backend_config"] = json.loads((a.out / "config.json").read_text())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run_evaluate(a: argparse.Namespace, spec: dict, res: dict) -> None:
    """Perplexity/KL of ``--out`` against ``--model``, both loaded with plain transformers
    ``AutoModelForCausalLM`` (the quantized one through its ``quantization_config``)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    res["tools"] = _tools("transformers", "torch", "gptqmodel", "optimum")
    sq = importlib.util.spec_from_file_location("_modelyard_quality", Path(__file__).with_name("quality.py"))
    assert sq is not None and sq.loader is not None  # a .py file's spec, with its source loader
    quality = importlib.util.module_from_spec(sq)
    sq.loader.exec_module(quality)
    tok = AutoTokenizer.from_pretrained(str(a.model))
    wins = quality.windows(tok(spec["heldout"], add_special_tokens=False)["input_ids"], spec["max_seq_len"])
    loaded = {}

    def load_quant():
        m = AutoModelForCausalLM.from_pretrained(str(a.out), device_map="cpu")
        lin = next((type(x) for n, x in m.named_modules() if n.endswith("q_proj")), None)
        loaded["how"] = f"transformers.AutoModelForCausalLM ({lin.__module__}.{lin.__name__})" if lin else None
        return m

    res["quality"] = quality.compare(
        lambda: AutoModelForCausalLM.from_pretrained(str(a.model), dtype=torch.float32), load_quant, wins)
    res["loaded_with"] = loaded.get("how")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=("quantize", "evaluate"))
    ap.add_argument("--backend", choices=("gptqmodel", "autoawq"), default="gptqmodel")
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--spec", type=Path, required=True)
    ap.add_argument("--result", type=Path, required=True)
    a = ap.parse_args()
    spec = json.loads(a.spec.read_text())
    res: dict = {"ok": False}
    try:
        (run_quantize if a.mode == "quantize" else run_evaluate)(a, spec, res)
        res["ok"] = True
    except BaseException as exc:  # noqa: BLE001 - reported to the parent process as data
        res["error"] = f"{type(exc).__name__}: {exc}"
        res["traceback"] = traceback.format_exc()[-4000:]
    a.result.write_text(json.dumps(res))
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
