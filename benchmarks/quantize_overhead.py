"""Quantize overhead: modelyard's quantize stage against a direct llm-compressor ``oneshot`` call.

Baseline: a fresh process that reads the same calibration text, loads the model with transformers,
tokenizes the samples, calls ``llmcompressor.oneshot`` with the same (fitted) recipe text and saves with
``save_compressed=True``. Candidate: a fresh process that calls
``modelyard.stages.quantize.quantize_model`` on the same folder, without (then with) the quality
evaluation, which is extra work by design. Each runs ``--repeat`` times; the medians are compared.
Prints wall time and peak RSS (``ru_maxrss`` of the child) and the ratios; target <= 1.05x.

The model is a generated Llama (hidden 512, intermediate 1536, 4 layers, random weights) so one
run takes seconds on a 2-core CPU; ``--model DIR`` uses another folder.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD_DIRECT = r"""
import json, resource, sys, time
t0 = time.perf_counter()
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from datasets import Dataset
from llmcompressor import oneshot
from modelyard.model.checkpoint import Checkpoint
from modelyard.stages import quantize as q
model_dir, out, scheme, n, L = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
recipe = q.make_recipe(scheme, Checkpoint(__import__("pathlib").Path(model_dir)).text_config).text
t1 = time.perf_counter()
# What any caller does: read the calibration text (blank-line separated, as modelyard's default set).
texts = [p.strip() for p in open(q.DATA / "calibration.txt", encoding="utf-8").read().split("\n\n") if p.strip()][:n]
tok = AutoTokenizer.from_pretrained(model_dir)
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="auto")
ds = Dataset.from_dict({"text": texts}).map(lambda r: tok(r["text"], truncation=True, max_length=L, add_special_tokens=False), remove_columns=["text"])
q._cpu_only_workarounds()
oneshot(model=model, recipe=recipe, dataset=ds, max_seq_length=L, num_calibration_samples=len(texts))
model.save_pretrained(out, save_compressed=True)
t2 = time.perf_counter()
print(json.dumps({"wall": t2 - t1, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

CHILD_MODELYARD = r"""
import json, resource, sys, time
from pathlib import Path
import torch, transformers, llmcompressor, datasets
from modelyard.settings import Settings
from modelyard.stages import quantize as q
model_dir, out, scheme, n, L, ev = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6] == "1"
settings = Settings()
t1 = time.perf_counter()
q.quantize_model(Path(model_dir), Path(out), scheme, settings=settings, num_samples=n, max_seq_len=L, evaluate=ev)
t2 = time.perf_counter()
print(json.dumps({"wall": t2 - t1, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def run(code: str, *args: str) -> dict:
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, "TQDM_DISABLE": "1", "PYTHONPATH": str(ROOT)})
    if r.returncode:
        sys.exit(f"child failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scheme", default="w8a8")
    ap.add_argument("--model", type=Path)
    ap.add_argument("--num-samples", type=int, default=16)
    ap.add_argument("--max-seq-len", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="modelyard-bench-q-") as tmp:
        model = a.model
        if model is None:
            sys.path.insert(0, str(ROOT))
            from tests.fixtures import make_tiny_llama

            model = make_tiny_llama(Path(tmp) / "model", layers=4, hidden=512, intermediate=1536)
        rows: dict[str, list[dict]] = {"direct oneshot": [], "modelyard (no eval)": [], "modelyard (with eval)": []}
        for i in range(a.repeat):
            common = (str(model), a.scheme, str(a.num_samples), str(a.max_seq_len))
            rows["direct oneshot"].append(run(CHILD_DIRECT, common[0], f"{tmp}/d{i}", *common[1:]))
            rows["modelyard (no eval)"].append(run(CHILD_MODELYARD, common[0], f"{tmp}/m{i}", *common[1:], "0"))
            rows["modelyard (with eval)"].append(run(CHILD_MODELYARD, common[0], f"{tmp}/e{i}", *common[1:], "1"))
    med = {k: (statistics.median(r["wall"] for r in v), max(r["rss_mb"] for r in v)) for k, v in rows.items()}
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    print(f"scheme {a.scheme}, {a.num_samples} samples x {a.max_seq_len} tokens, median of {a.repeat} runs, model "
          f"{'generated Llama hidden 512 x 4 layers' if a.model is None else a.model}")
    print(f"{'run':<24}{'wall s':>10}{'peak RSS MB':>14}{'wall ratio':>12}{'RSS ratio':>11}")
    base_w, base_r = med["direct oneshot"]
    for k, (w, r) in med.items():
        print(f"{k:<24}{w:>10.2f}{r:>14.0f}{w / base_w:>12.3f}{r / base_r:>11.3f}")
    w, r = med["modelyard (no eval)"]
    print(f"target <= 1.05x (modelyard without the quality evaluation vs direct): wall "
          f"{'PASS' if w / base_w <= 1.05 else 'MISS'}, RSS {'PASS' if r / base_r <= 1.05 else 'MISS'}")


if __name__ == "__main__":
    main()
