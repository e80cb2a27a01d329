"""What a GGUF conversion costs with its header parsed once instead of once per reader.

Baseline: the conversion as it ran before (``modelyard.stages.fetch.gguf._convert``): transformers' tokenizer, config
and model loaders and modelyard's special-token and vocabulary reads each construct PyPI ``gguf``'s ``GGUFReader``
of the same file, six header parses. Candidate: ``convert_gguf`` (the same conversion inside
``one_reader_per_file``: one reader per file for every caller). Each run is a fresh interpreter with torch and
transformers imported before the clock starts; runs interleave (baseline, candidate, ...) ``--repeat`` times and the
script prints each wall time, the medians and the candidate's ratio to the baseline.

The GGUF is the real Gemma-3 270M Q4_K_M (262,144-token vocabulary) of the test corpus (``tests/real_models.py``
downloads and keeps it), or ``--gguf FILE``.

    .venv/bin/python benchmarks/gguf_convert.py [--repeat 2] [--gguf FILE]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RUN = """
import sys, tempfile, time
from pathlib import Path
import torch, transformers  # imported before the clock
from modelyard.stages.fetch import gguf
path, which = Path(sys.argv[1]), sys.argv[2]
with tempfile.TemporaryDirectory() as d:
    t = time.perf_counter()
    if which == "candidate":
        gguf.convert_gguf(path, Path(d))
    else:
        gguf._convert(path, Path(d), "bfloat16")
    print(time.perf_counter() - t)
"""


def once(path: Path, which: str) -> float:
    """Seconds of one conversion of ``path`` in a fresh interpreter (``which``: baseline or candidate)."""
    out = subprocess.run([sys.executable, "-c", RUN, str(path), which], capture_output=True, text=True, check=True,
                         cwd=ROOT)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--gguf", type=Path, default=None)
    a = ap.parse_args()
    if a.gguf is None:
        from tests import real_models

        a.gguf = real_models.gguf_path(real_models.GEMMA3_270M)
    times: dict[str, list[float]] = {"baseline": [], "candidate": []}
    for i in range(a.repeat):
        for which, runs in times.items():
            runs.append(once(a.gguf, which))
            print(f"round {i + 1} {which}: {runs[-1]:.1f} s", flush=True)
    base = statistics.median(times["baseline"])
    cand = statistics.median(times["candidate"])
    print(f"median baseline (six header parses): {base:.1f} s")
    print(f"median candidate (one reader per file): {cand:.1f} s, ratio {cand / base:.2f}")


if __name__ == "__main__":
    main()
