"""Hash throughput: modelyard's ``hash_snapshot`` against parallel ``sha256sum`` and huggingface_hub's checksum verification.

    .venv/bin/python benchmarks/hash_throughput.py [--size 2GiB] [--shards 8] [--dir DIR] [--repeat 3]

Builds (or reuses, under ``--dir``) a folder shaped like a checkpoint: ``--shards`` files
``model-0000k-of-0000n.safetensors`` of random bytes (incompressible, like bf16 weights) that add up to
``--size`` (default 2 GiB; ``512MiB`` for a quick run), plus a small ``config.json``. The expected
digests (LFS sha256 for the shards, git blob id for config.json) are recorded while writing, in
``DIR/hashbench.json``; a folder with the same size and shard count is reused as is.

The page cache is warmed (every file read once, residency checked with ``fincore``), then, on the same
warm files, in interleaved rounds (``--repeat``, best round kept), it times:

- **modelyard**: ``hash_snapshot`` (thread pool, 4 MiB ``readinto``, sha256 for the shards and the git
  blob sha1 for config.json, each checked against the expected digest), no digest cache;
- **sha256sum**: GNU coreutils ``sha256sum``, one process per file, ``xargs -P $(nproc)`` in parallel;
- **hf_hub**: huggingface_hub's own verification, the local half of ``HfApi.verify_repo_checksums`` /
  ``hf cache verify``: ``huggingface_hub.utils._verification.verify_maps`` over ``collect_local_files``,
  with ``RepoFile`` entries carrying the LFS sha256 / blob id (what ``list_repo_tree`` returns, built here
  so that no network is involved). It hashes one file after the other with 1 MiB reads (``sha_fileobj``).

and, last, modelyard again with a warm :class:`~modelyard.model.digest.DigestCache` (a second
ingest of the same unchanged files), which reads no byte.

Printed: MB/s (decimal MB of file data per wall second), CPU seconds (this process's threads, or the
child processes) and MB per CPU second (what a busy, shared machine cannot distort much), and the ratios modelyard / sha256sum (target >= 0.9) and modelyard / hf_hub (target >=
1.5). The folder is removed at the end unless ``--dir`` was given.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from modelyard.model import digest as hashing
from modelyard.model.digest import DigestCache, git_blob_id, hash_snapshot
from modelyard.model.snapshot import FileEntry, Snapshot

CONFIG = json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
                     "num_hidden_layers": 32, "torch_dtype": "bfloat16"}, indent=2).encode() + b"\n"


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(i?)B?\s*", text, re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 2GiB, 512MiB, 1G)")
    n, unit, binary = float(m.group(1)), m.group(2).upper(), m.group(3)
    base = 1024 if binary or unit == "" else 1000
    return int(n * base ** " KMGT".index(unit or " "))


def build(folder: Path, size: int, shards: int) -> dict:
    """The checkpoint folder ``folder/model`` plus ``folder/hashbench.json`` (expected digests)."""
    meta_path = folder / "hashbench.json"
    if meta_path.is_file():
        meta = json.loads(meta_path.read_text())
        if meta["size"] == size and meta["shards"] == shards and all(
                (folder / "model" / f["path"]).is_file() and (folder / "model" / f["path"]).stat().st_size == f["size"]
                for f in meta["files"]):
            meta["reused"] = True
            return meta
    shutil.rmtree(folder / "model", ignore_errors=True)
    model = folder / "model"
    model.mkdir(parents=True)
    files = []
    t0 = time.perf_counter()
    per = size // shards
    for k in range(shards):
        name = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        n = per if k < shards - 1 else size - per * (shards - 1)
        h = hashlib.sha256()
        with open(model / name, "wb") as fh:
            left = n
            while left:
                chunk = os.urandom(min(4 << 20, left))
                fh.write(chunk)
                h.update(chunk)
                left -= len(chunk)
        files.append({"path": name, "size": n, "sha256": h.hexdigest()})
    (model / "config.json").write_bytes(CONFIG)
    files.append({"path": "config.json", "size": len(CONFIG), "git": git_blob_id(CONFIG)})
    meta = {"size": size, "shards": shards, "files": files, "build_s": time.perf_counter() - t0}
    meta_path.write_text(json.dumps(meta, indent=2))
    meta["reused"] = False
    return meta


def resident(model: Path) -> tuple[int, int]:
    """(bytes of the folder in the page cache, total bytes), via util-linux ``fincore``; (-1, total) without it."""
    paths = sorted(str(p) for p in model.iterdir())
    total = sum(os.path.getsize(p) for p in paths)
    if shutil.which("fincore") is None:
        return -1, total
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--raw", "-o", "RES", *paths],
                         capture_output=True, text=True, check=True).stdout
    return sum(int(x) for x in out.split()), total


def machine() -> str:
    cpu = "unknown CPU"
    with open("/proc/cpuinfo") as fh:
        for line in fh:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    flags = open("/proc/cpuinfo").read()
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    import ssl

    return (f"{cpu} ({'SHA-NI' if ' sha_ni' in flags else 'no SHA-NI'}), nproc {len(os.sched_getaffinity(0))}, "
            f"RAM {mem / 2**30:.1f} GiB, Python {sys.version.split()[0]} ({ssl.OPENSSL_VERSION}), "
            f"{subprocess.run(['sha256sum', '--version'], capture_output=True, text=True).stdout.splitlines()[0]}")


def timed(fn: Callable[[], object]) -> tuple[float, float, object]:
    """(wall s, CPU s of this process + waited-for children, result)."""
    r0s, r0c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    res = fn()
    wall = time.perf_counter() - t
    r1s, r1c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = sum(getattr(b, f) - getattr(a, f) for a, b in ((r0s, r1s), (r0c, r1c)) for f in ("ru_utime", "ru_stime"))
    return wall, cpu, res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=parse_size, default=2 * 2**30, help="total bytes (2GiB, 512MiB, ...; default 2GiB)")
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--dir", type=Path, help="build (or reuse) the checkpoint here and keep it")
    ap.add_argument("--repeat", type=int, default=3, help="interleaved timed rounds; the best is kept (default 3)")
    args = ap.parse_args()
    if shutil.which("sha256sum") is None or shutil.which("xargs") is None:
        print("needs GNU coreutils sha256sum and findutils xargs", file=sys.stderr)
        return 2
    import huggingface_hub
    from huggingface_hub.hf_api import RepoFile
    from huggingface_hub.utils._verification import collect_local_files, verify_maps

    folder = args.dir.resolve() if args.dir else Path(tempfile.mkdtemp(prefix="modelyard-hash-bench-"))
    folder.mkdir(parents=True, exist_ok=True)
    try:
        meta = build(folder, args.size, args.shards)
        model = folder / "model"
        total = sum(f["size"] for f in meta["files"])
        nproc = int(subprocess.run(["nproc"], capture_output=True, text=True, check=True).stdout)
        print(f"machine: {machine()}")
        print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        print(f"checkpoint: {model} ({total / 1e6:.0f} MB in {args.shards} shards of random bytes + config.json; "
              + ("reused" if meta["reused"] else f"built in {meta['build_s']:.1f} s") + ")")
        print(f"modelyard {hashing.__name__} (workers {min(32, 2 * hashing.usable_cpus(), len(meta['files']))}, {hashing.CHUNK >> 20} MiB reads), "
              f"huggingface_hub {huggingface_hub.__version__}")

        entries = tuple(FileEntry(f["path"], f["size"], expected_sha256=f.get("sha256"), expected_git_oid=f.get("git"),
                                  expected_size=f["size"]) for f in meta["files"])
        snap = Snapshot(root=model, source=f"file://{model}", kind="file", files=entries)
        remote = {f["path"]: RepoFile(path=f["path"], size=f["size"], oid=f.get("git") or "0" * 40,
                                      lfs={"size": f["size"], "oid": f["sha256"], "pointerSize": 134} if "sha256" in f else None)
                  for f in meta["files"]}
        want = {f["path"]: f["sha256"] for f in meta["files"] if "sha256" in f}

        def ours() -> object:
            out = hash_snapshot(snap)  # raises HashMismatchError on any difference
            return {e.path: e.sha256 for e in out.files if e.path in want} == want

        def coreutils() -> object:
            paths = sorted(str(model / f["path"]) for f in meta["files"])
            out = subprocess.run(["xargs", "-0", "-P", str(nproc), "-n", "1", "sha256sum"], input="\0".join(paths),
                                 capture_output=True, text=True, check=True).stdout
            got = {Path(line.split(None, 1)[1].lstrip("*")).name: line.split()[0] for line in out.splitlines()}
            return {k: got[k] for k in want} == want

        def hf_hub() -> object:
            res = verify_maps(remote_by_path=remote, local_by_path=collect_local_files(model), revision="0" * 40,
                              verified_path=model)
            return not res.mismatches and not res.missing_paths and not res.extra_paths and res.checked_count == len(remote)

        methods: dict[str, Callable[[], object]] = {
            "modelyard hash_snapshot": ours,
            f"sha256sum, xargs -P {nproc}": coreutils,
            "huggingface_hub verify_maps": hf_hub,
        }

        t = time.perf_counter()
        subprocess.run(["cat", *sorted(str(p) for p in model.iterdir())], stdout=subprocess.DEVNULL, check=True)
        res, tot = resident(model)
        print(f"page cache warmed in {time.perf_counter() - t:.1f} s: "
              + (f"{res / tot:.0%} of the files resident (fincore)" if res >= 0 else "fincore missing, residency unknown"))

        runs: dict[str, list[tuple[float, float]]] = {k: [] for k in methods}
        for _ in range(args.repeat):
            for name, fn in methods.items():
                wall, cpu, ok = timed(fn)
                if ok is not True:
                    print(f"{name}: WRONG DIGESTS", file=sys.stderr)
                    return 1
                runs[name].append((wall, cpu))

        cache = DigestCache(folder / "digests")
        newest = max(max(p.stat().st_mtime, p.stat().st_ctime) for p in model.iterdir())
        time.sleep(max(0.0, newest + hashing.RACY_S + 0.1 - time.time()))  # freshly written files are not cached
        hash_snapshot(snap, cache=cache)  # the first ingest fills the cache
        cached_name = "modelyard, digest cache warm"
        counted = {"bytes": 0, "hits": 0}

        def ours_cached() -> object:
            out = []
            for e in entries:  # what hash_snapshot does per file, counting what file_digest reports
                d = hashing.file_digest(model / e.path, git=e.expected_git_oid is not None, cache=cache)
                counted["bytes"] += d.bytes_read
                counted["hits"] += d.cached
                out.append(d)
            return all(d.sha256 == want[e.path] for e, d in zip(entries, out) if e.path in want)

        runs[cached_name] = []
        for _ in range(args.repeat):
            wall, cpu, ok = timed(lambda: hash_snapshot(snap, cache=cache))
            runs[cached_name].append((wall, cpu))
        if ours_cached() is not True:
            print(f"{cached_name}: WRONG DIGESTS", file=sys.stderr)
            return 1
        res_end, _ = resident(model)

        best = {k: min(v) for k, v in runs.items()}
        print()
        print(f"{'method':34} {'best s':>8} {'MB/s':>9} {'CPU s':>7} {'MB/CPU-s':>9} {'rounds (s)':>18}")
        for name, (wall, cpu) in best.items():
            rounds = " ".join(f"{w:.2f}" for w, _ in runs[name])
            eff = f"{total / 1e6 / cpu:9.0f}" if cpu > 0.01 else f"{'-':>9}"
            print(f"{name:34} {wall:8.3f} {total / 1e6 / wall:9.0f} {cpu:7.2f} {eff} {rounds:>18}")
        ours_s, core_s, hf_s = (best[k][0] for k in methods)
        r1, r2 = core_s / ours_s, hf_s / ours_s
        print()
        print(f"ratio modelyard / sha256sum (throughput): {r1:.2f}   target >= 0.9: {'PASS' if r1 >= 0.9 else 'MISS'}")
        print(f"ratio modelyard / hf_hub    (throughput): {r2:.2f}   target >= 1.5: {'PASS' if r2 >= 1.5 else 'MISS'}")
        c_ours, c_core, c_hf = (best[k][1] for k in methods)
        print(f"CPU cost per byte (contention-independent): sha256sum / modelyard {c_core / c_ours:.2f}, "
              f"hf_hub / modelyard {c_hf / c_ours:.2f}; wall ratios also need free cores for modelyard's thread pool")
        med = {k: statistics.median(w for w, _ in v) for k, v in runs.items()}
        names = list(methods)
        print(f"(the same ratios from the median rounds: {med[names[1]] / med[names[0]]:.2f} and "
              f"{med[names[2]] / med[names[0]]:.2f})")
        print(f"digest cache warm: {counted['hits']}/{len(entries)} files from the cache, {counted['bytes']} bytes read "
              f"(cache in {cache.folder})")
        print("page cache at the end: " + (f"{res_end / tot:.0%} resident" if res_end >= 0 else "unknown")
              + f"; load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        return 0
    finally:
        if not args.dir:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
