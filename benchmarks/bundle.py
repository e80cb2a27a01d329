"""Bundle throughput: ``modelyard bundle`` (the library function) against ``tar -I 'zstd -T0' -cf``.

Builds (or takes, ``--artifact DIR``) an artifact folder shaped like a checkpoint: ``model/`` with
safetensors shards of random bytes (incompressible, like bf16 weights) plus one shard of repetitive
data (compressible), JSON/tokenizer files, a manifest with per-file sha256, report.json/md. Then,
in one run, times both on the same folder (page cache warm for both: each is run once untimed
first) and prints MB/s of input for each, the ratio ours / baseline, and the output sizes; then the
same for extraction (``unbundle``, which checks every sha256, against ``tar -I zstd -xf``).

    .venv/bin/python benchmarks/bundle.py [--size-mb 1024] [--artifact DIR] [--keep]

Needs the ``zstd`` CLI (Debian package ``zstd``) and GNU tar. Both use zstd level 3 with one
worker per CPU. The baseline does less work: it does not hash, does not check the manifest and is
not deterministic (mtimes, owners).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from modelyard.model.digest import tree_digest
from modelyard.model.snapshot import FileEntry
from modelyard.settings import Settings
from modelyard.transport.refs import bundle_artifact


def make_artifact(root: Path, size_mb: int) -> Path:
    model = root / "model"
    model.mkdir(parents=True)
    shard = 256 * 1024 * 1024
    total = size_mb * 1024 * 1024
    n_random = max(1, (total * 7 // 8) // shard)
    files = []
    for i in range(n_random + 1):
        p = model / f"model-{i + 1:05d}-of-{n_random + 1:05d}.safetensors"
        size = min(shard, total * 7 // 8 - i * shard) if i < n_random else total // 8
        h = hashlib.sha256()
        with open(p, "wb") as fh:
            left = size
            pattern = (b"\x00\x3c\x80\x3f" * 4096 + os.urandom(1024)) if i == n_random else None
            while left:
                chunk = os.urandom(min(4 << 20, left)) if pattern is None else (pattern * 256)[: min(4 << 20, left)]
                fh.write(chunk)
                h.update(chunk)
                left -= len(chunk)
        files.append(FileEntry(p.name, size, h.hexdigest()))
    for name, text in (("config.json", json.dumps({"model_type": "llama", "hidden_size": 4096}, indent=2)),
                       ("tokenizer.json", json.dumps({"model": {"vocab": {f"t{i}": i for i in range(50000)}}})),
                       ("generation_config.json", '{"eos_token_id": 2}')):
        (model / name).write_text(text)
        data = (model / name).read_bytes()
        files.append(FileEntry(name, len(data), hashlib.sha256(data).hexdigest()))
    files.sort(key=lambda f: f.path)
    (root / "report.json").write_text('{"findings": []}\n')
    (root / "report.md").write_text("# report\n")
    manifest = {"schema_version": "1", "name": "bench", "revision": "r", "content_digest": "sha256:" + tree_digest(tuple(files)),
                "source": {"uri": "file:///bench", "kind": "file"},
                "files": [{"path": f"model/{f.path}", "size": f.size, "sha256": f.sha256, "origin": "computed"} for f in files]}
    (root / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return root


def du(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--artifact", type=Path)
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    if shutil.which("zstd") is None:
        sys.exit("the zstd CLI is missing: apt-get install zstd")
    work = Path(tempfile.mkdtemp(prefix="bundle-bench-", dir=os.environ.get("TMPDIR")))
    try:
        art = args.artifact or make_artifact(work / "artifact", args.size_mb)
        size = du(art)
        ours_out, base_out = work / "ours.tar.zst", work / "base.tar.zst"

        settings = Settings()

        def ours() -> None:
            bundle_artifact(art, ours_out, settings=settings, force=True)

        def base() -> None:
            subprocess.run(["tar", "-I", "zstd -3 -T0", "-cf", str(base_out), "-C", str(art), "."], check=True)

        results = {}
        for name, fn in (("modelyard bundle", ours), ("tar -I 'zstd -T0' -cf", base)):
            fn()  # warm the page cache
            t = time.perf_counter()
            fn()
            results[name] = time.perf_counter() - t
        mb = size / 1e6
        print(f"input: {art} ({mb:.0f} MB, {os.cpu_count()} CPUs, zstd level 3)")
        for name, sec in results.items():
            out = ours_out if name.startswith("modelyard") else base_out
            print(f"{name:24s} {sec:7.2f} s  {mb / sec:8.1f} MB/s  output {out.stat().st_size / 1e6:.0f} MB")
        a, b = results.values()
        print(f"ratio (modelyard / tar+zstd throughput): {b / a:.2f}")

        from modelyard.transport.unbundle import remove_tree, unbundle

        def ours_x() -> None:
            unbundle(ours_out, work / "x-ours")

        def base_x() -> None:
            (work / "x-base").mkdir()
            subprocess.run(["tar", "-I", "zstd -T0", "-xf", str(base_out), "-C", str(work / "x-base")], check=True)

        back = {}
        for name, fn, dst in (("modelyard unbundle", ours_x, "x-ours"), ("tar -I zstd -xf", base_x, "x-base")):
            fn()
            remove_tree(work / dst)
            t = time.perf_counter()
            fn()
            back[name] = time.perf_counter() - t
            remove_tree(work / dst)
        for name, sec in back.items():
            print(f"{name:24s} {sec:7.2f} s  {mb / sec:8.1f} MB/s")
        c, d = back.values()
        print(f"ratio (modelyard unbundle, verifying every sha256 / tar -x): {d / c:.2f}")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept {work}")


if __name__ == "__main__":
    main()
