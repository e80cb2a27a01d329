"""GPU quantize overhead: modelyard's quantize stage against a direct llm-compressor ``oneshot`` call, on one GPU.

Model: a Llama-3.2-1B-shaped checkpoint (the config of meta-llama/Llama-3.2-1B: vocab 128256, hidden 2048,
intermediate 8192, 16 layers, 32 heads, 8 KV heads, tied embeddings; 1.24e9 parameters, bf16) built on the GPU
from that config with seeded random weights and saved once; random weights are fine for time and memory, not for
quality. Tokenizer: the one given by ``--tokenizer`` (any tokenizers-JSON folder; its ids fall inside the vocab).

Calibration: ``--num-samples`` texts of at least ``--max-seq-len`` tokens (modelyard's calibration paragraphs,
rotated and joined), written once to a text file that both sides read.

Baseline ("direct"): a fresh process that reads that file, loads tokenizer and model with transformers, tokenizes
the samples, calls ``llmcompressor.oneshot`` with the recipe text modelyard's ``make_recipe`` produced for the
scheme (written to a file first) and saves with ``save_compressed=True``. It imports nothing of modelyard.
Candidate ("modelyard"): a fresh process that calls ``modelyard.stages.quantize.quantize_model`` on the same
folder and calibration file with ``evaluate=False``. ``--eval`` adds one "modelyard+eval" run per scheme (the
quality evaluation included, on the GPU), which is extra work by design and not part of the ratio.

Each process runs with ``CUDA_VISIBLE_DEVICES`` = ``--gpu`` and reports: wall seconds from after its imports to
after the save; ``torch.cuda.max_memory_allocated`` and ``max_memory_reserved`` (bytes); the peak of NVML's
used memory of that GPU, sampled every 20 ms, minus its value at the start (bytes, includes the CUDA context);
peak host RSS (``ru_maxrss``). Runs alternate direct/modelyard, the order flipped on each repeat. Medians are
compared: target modelyard <= 1.05 x direct on each figure.

``BENCH_PROFILE=PREFIX`` also dumps a cProfile of each process's timed part to ``PREFIX.<pid>``.

Prints the table and writes ``rows.jsonl`` (one line per process, as they finish) and ``gpu-quantize.json``
under ``--out``. ``--summarize ROWS.jsonl ...`` recomputes the summary from rows of earlier runs.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GIB = 1024**3

#: meta-llama/Llama-3.2-1B config.json (transformers 5 spelling of the rope keys).
LLAMA_32_1B = dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                   num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=131072,
                   rms_norm_eps=1e-5, hidden_act="silu", tie_word_embeddings=True, bos_token_id=128000,
                   eos_token_id=128001, attention_bias=False, mlp_bias=False,
                   rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                                    "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                    "original_max_position_embeddings": 8192})

BUILD = r"""
import json, shutil, sys, time
from pathlib import Path
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
out, tok_dir, paragraphs_file, calib_file, n, L = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6])
cfg = LlamaConfig(**json.loads(sys.argv[7]))
t0 = time.perf_counter()
torch.manual_seed(0)
with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
params = sum(p.numel() for p in model.parameters())
model.save_pretrained(str(out))
tok = AutoTokenizer.from_pretrained(tok_dir)
tok.save_pretrained(str(out))
paras = [p.strip().replace("\n", " ") for p in open(paragraphs_file, encoding="utf-8").read().split("\n\n") if p.strip()]
samples = []
for i in range(n):
    parts, k = [], 0
    while len(tok(" ".join(parts), add_special_tokens=False)["input_ids"]) < L:
        parts.append(paras[(i + k) % len(paras)]); k += 1
    samples.append(" ".join(parts))
open(calib_file, "w", encoding="utf-8").write("\n\n".join(samples) + "\n")
print(json.dumps({"params": params, "seconds": time.perf_counter() - t0}))
"""

PRELUDE = r"""
import json, os, resource, sys, threading, time
t0 = time.perf_counter()
import pynvml
try:
    pynvml.nvmlInit()
    _h = pynvml.nvmlDeviceGetHandleByIndex(int(os.environ.get("CUDA_VISIBLE_DEVICES") or 0))
    _used = lambda: pynvml.nvmlDeviceGetMemoryInfo(_h).used
except pynvml.NVMLError:  # no NVIDIA driver: the CPU smoke run of this script
    _used = lambda: 0
_base = _used()
_peak = [_base]
_stop = threading.Event()
def _sample():
    while not _stop.is_set():
        _peak[0] = max(_peak[0], _used())
        _stop.wait(0.02)
_th = threading.Thread(target=_sample, daemon=True)
_prof = None
def prof_start():
    global _prof
    if os.environ.get("BENCH_PROFILE"):  # a cProfile of the timed part, for finding where a gap comes from
        import cProfile
        _prof = cProfile.Profile()
        _prof.enable()
def prof_stop():
    if _prof is not None:
        _prof.disable()
        _prof.dump_stats(os.environ["BENCH_PROFILE"] + f".{os.getpid()}")
def report(t1, t2, extra):
    import torch
    _stop.set(); _th.join()
    print(json.dumps({"wall_s": t2 - t1, "import_s": t1 - t0,
                      "cuda_max_allocated": torch.cuda.max_memory_allocated(),
                      "cuda_max_reserved": torch.cuda.max_memory_reserved(),
                      "nvml_peak_used": _peak[0] - _base,
                      "rss_peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, **extra}))
"""

CHILD_DIRECT = PRELUDE + r"""
import torch
from datasets import Dataset
from llmcompressor import oneshot
from transformers import AutoModelForCausalLM, AutoTokenizer
model_dir, out, recipe_file, calib_file, n, L, needs_data = sys.argv[1:8]
n, L = int(n), int(L)
recipe = open(recipe_file, encoding="utf-8").read()
_th.start()
t1 = time.perf_counter()
prof_start()
texts = [p.strip() for p in open(calib_file, encoding="utf-8").read().split("\n\n") if p.strip()][:n]
tok = AutoTokenizer.from_pretrained(model_dir)
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="auto")
kw = {}
if needs_data == "1":
    ds = Dataset.from_dict({"text": texts}).map(
        lambda r: tok(r["text"], truncation=True, max_length=L, add_special_tokens=False), remove_columns=["text"])
    kw = {"dataset": ds, "max_seq_length": L, "num_calibration_samples": len(texts)}
oneshot(model=model, recipe=recipe, **kw)
model.save_pretrained(out, save_compressed=True)
t2 = time.perf_counter()
prof_stop()
report(t1, t2, {})
"""

CHILD_MODELYARD = PRELUDE + r"""
from pathlib import Path
import torch, transformers, llmcompressor, datasets
from modelyard.settings import Settings
from modelyard.stages import quantize as q
model_dir, out, calib_file, n, L, scheme, ev = sys.argv[1:8]
settings = Settings()
_th.start()
t1 = time.perf_counter()
prof_start()
res = q.quantize_model(Path(model_dir), Path(out), scheme, settings=settings, calibration=Path(calib_file), num_samples=int(n),
                       max_seq_len=int(L), evaluate=ev == "1")
t2 = time.perf_counter()
prof_stop()
from dataclasses import asdict
report(t1, t2, {"recipe_sha256": res.recipe.sha256, "quantize_seconds": res.seconds,
                "eval_device": q.eval_device(settings) if ev == "1" else None,
                "quality": asdict(res.quality) if res.quality else None})
"""

WARMUP = r"""
import sys, time
t0 = time.perf_counter()
import torch, transformers, datasets, llmcompressor, compressed_tensors, pynvml
import modelyard.stages.quantize
from pathlib import Path
for f in Path(sys.argv[1]).iterdir():
    f.read_bytes()
torch.zeros(1, device="cuda" if torch.cuda.is_available() else "cpu")
print(f"warm-up {time.perf_counter() - t0:.1f} s")
"""

FIGURES = ("wall_s", "cuda_max_allocated", "nvml_peak_used", "rss_peak")


def child(code: str, args: list[str], gpu: str, timeout: float = 900) -> dict:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpu, "TQDM_DISABLE": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=timeout)
    if r.returncode:
        return {"error": r.stderr[-4000:]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for dist in ("torch", "transformers", "llmcompressor", "compressed-tensors", "datasets", "accelerate",
                 "safetensors", "nvidia-ml-py"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            out[dist] = None
    import torch

    out["torch_cuda"] = torch.version.cuda
    return out


def machine() -> dict:
    smi = shutil.which("nvidia-smi")
    gpus = []
    if smi:
        q = subprocess.run([smi, "--query-gpu=index,name,memory.total,compute_cap,driver_version",
                            "--format=csv,noheader,nounits"], capture_output=True, text=True).stdout
        gpus = [dict(zip(("index", "name", "memory_mib", "compute_capability", "driver"),
                         (x.strip() for x in line.split(",")))) for line in q.strip().splitlines()]
    return {"gpus": gpus, "cpus": os.cpu_count(), "platform": platform.platform(), "kernel": platform.release()}


def summarize(rows: list[dict]) -> dict:
    """Medians per (scheme, run) of :data:`FIGURES` and the modelyard / direct ratios."""
    out: dict = {}
    for sch in dict.fromkeys(r["scheme"] for r in rows):
        med = {}
        for run in ("direct", "modelyard", "modelyard+eval"):
            rs = [r for r in rows if r["scheme"] == sch and r["run"] == run and "error" not in r]
            if rs:
                med[run] = {f: statistics.median(r[f] for r in rs) for f in FIGURES} | {"n": len(rs)}
        if "direct" in med and "modelyard" in med:
            med["ratio_modelyard_over_direct"] = {f: round(med["modelyard"][f] / med["direct"][f], 4)
                                                  for f in FIGURES if med["direct"][f]}
        out[sch] = med
    return out


def print_table(summary: dict) -> None:
    print(f"{'scheme':<13}{'run':<16}{'n':>3}{'wall s':>9}{'cuda alloc GiB':>16}{'nvml GiB':>10}{'RSS GiB':>9}"
          f"{'wall x':>8}{'alloc x':>8}{'nvml x':>8}{'RSS x':>7}")
    for sch, med in summary.items():
        ratio = med.get("ratio_modelyard_over_direct", {})
        for run in ("direct", "modelyard", "modelyard+eval"):
            if run not in med:
                continue
            m = med[run]
            rx = ("".join(f"{ratio.get(f, float('nan')):>{w}.3f}" for f, w in zip(FIGURES, (8, 8, 8, 7)))
                  if run == "modelyard" else "")
            print(f"{sch:<13}{run:<16}{m['n']:>3}{m['wall_s']:>9.2f}{m['cuda_max_allocated'] / GIB:>16.2f}"
                  f"{m['nvml_peak_used'] / GIB:>10.2f}{m['rss_peak'] / GIB:>9.2f}{rx}")
    ratios = [m["ratio_modelyard_over_direct"] for m in summary.values() if "ratio_modelyard_over_direct" in m]
    worst = {f: max(r[f] for r in ratios if f in r) for f in FIGURES if any(f in r for r in ratios)}
    print("baseline: direct llmcompressor.oneshot; target modelyard <= 1.05x on each figure; worst ratio: "
          + ", ".join(f"{f} {v:.3f} ({'PASS' if v <= 1.05 else 'MISS'})" for f, v in worst.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for rows.jsonl and gpu-quantize.json")
    ap.add_argument("--work", type=Path, default=Path("/tmp/gpu-quantize"), help="model and outputs (large)")
    ap.add_argument("--tokenizer", type=Path, help="a tokenizer folder to put beside the model")
    ap.add_argument("--schemes", nargs="+", default=["w4a16", "fp8-dynamic", "nvfp4"])
    ap.add_argument("--num-samples", type=int, default=64)
    ap.add_argument("--max-seq-len", type=int, default=512)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--first", choices=("direct", "modelyard"), default="direct", help="who runs first in repeat 0")
    ap.add_argument("--eval", action="store_true", help="also one modelyard run per scheme with the quality evaluation")
    ap.add_argument("--gpu", default="0")
    ap.add_argument("--tiny", action="store_true", help="a 2-layer model of hidden 256 (a smoke run on CPU)")
    ap.add_argument("--summarize", type=Path, nargs="*", help="only summarize these rows.jsonl files")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    if a.summarize:
        rows = [json.loads(line) for f in a.summarize for line in f.read_text().splitlines() if line.strip()]
        summary = summarize(rows)
        print_table(summary)
        print(json.dumps(summary, indent=1))
        return
    sys.path.insert(0, str(ROOT))
    from modelyard.model.checkpoint import Checkpoint
    from modelyard.stages import quantize as q

    config = LLAMA_32_1B | (dict(vocab_size=49152, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2) if a.tiny else {})
    info = {"machine": machine(), "versions": versions(), "model": {"config": config},
            "calibration": {"samples": a.num_samples, "max_seq_len": a.max_seq_len}}
    model, calib = a.work / "model", a.work / "calibration.txt"
    if not (model / "config.json").is_file():
        a.work.mkdir(parents=True, exist_ok=True)
        r = subprocess.run([sys.executable, "-c", BUILD, str(model), str(a.tokenizer), str(q.DATA / "calibration.txt"),
                            str(calib), str(a.num_samples), str(a.max_seq_len), json.dumps(config)],
                           capture_output=True, text=True, env={**os.environ, "CUDA_VISIBLE_DEVICES": a.gpu})
        if r.returncode:
            sys.exit(f"building the model failed:\n{r.stderr[-3000:]}")
        info["model"] |= json.loads(r.stdout.strip().splitlines()[-1])
        print(f"built {model}: {info['model']['params']:,} parameters in {info['model']['seconds']:.1f} s", flush=True)
    info["model"]["weight_bytes"] = sum(t.end - t.begin for t in Checkpoint(model).tensors.values())
    info["calibration"]["sha256"] = q.data_digest(calib)
    w = subprocess.run([sys.executable, "-c", WARMUP, str(model)], capture_output=True, text=True,
                       env={**os.environ, "CUDA_VISIBLE_DEVICES": a.gpu,
                            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])})
    print((w.stdout or w.stderr[-2000:]).strip(), flush=True)
    cfg = Checkpoint(model).text_config
    rows_file = a.out / "rows.jsonl"
    rows: list[dict] = []

    def record(row: dict) -> None:
        rows.append(row)
        with rows_file.open("a") as f:
            f.write(json.dumps(row) + "\n")
        brief = {k: (round(v / GIB, 3) if k in FIGURES[1:] else round(v, 2)) for k, v in row.items()
                 if k in FIGURES + ("import_s",)}
        print(row["scheme"], row["run"], row.get("repeat"), brief if "error" not in row else row["error"], flush=True)

    for rep in range(a.repeat):
        flip = (rep % 2 == 1) != (a.first == "modelyard")
        for sch in a.schemes:
            recipe = q.make_recipe(sch, cfg)
            rfile = a.work / f"{sch}.recipe.yaml"
            rfile.write_text(recipe.text)
            needs = "1" if q.scheme(sch).needs_data else "0"
            for run in (("modelyard", "direct") if flip else ("direct", "modelyard")):
                out = a.work / f"{sch}-{run}-{rep}-{time.time_ns()}"
                if run == "direct":
                    r = child(CHILD_DIRECT, [str(model), str(out), str(rfile), str(calib), str(a.num_samples),
                                             str(a.max_seq_len), needs], a.gpu)
                else:
                    r = child(CHILD_MODELYARD, [str(model), str(out), str(calib), str(a.num_samples),
                                                str(a.max_seq_len), sch, "0"], a.gpu)
                    if "recipe_sha256" in r and r["recipe_sha256"] != recipe.sha256:
                        r["error"] = f"recipe differs: {r['recipe_sha256']} != {recipe.sha256}"
                if out.is_dir():
                    r["out_bytes"] = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
                    if rep or run == "direct":  # the first modelyard output of each scheme stays, for doctor
                        shutil.rmtree(out)
                record({"scheme": sch, "run": run, "repeat": rep, "recipe_sha256": recipe.sha256} | r)
    if a.eval:
        for sch in a.schemes:
            out = a.work / f"{sch}-eval-{time.time_ns()}"
            r = child(CHILD_MODELYARD, [str(model), str(out), str(calib), str(a.num_samples), str(a.max_seq_len),
                                        sch, "1"], a.gpu)
            shutil.rmtree(out, ignore_errors=True)
            record({"scheme": sch, "run": "modelyard+eval", "repeat": 0} | r)
    summary = summarize(rows)
    print_table(summary)
    (a.out / "gpu-quantize.json").write_text(json.dumps(info | {"summary": summary, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
