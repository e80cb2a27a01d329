"""Per-worker figures for the scale-out plan, measured on this machine, written to a results JSON that
``benchmarks/scale_sim.py`` reads (``docs/scale-out.md`` explains the plan).

Run: ``.venv/bin/python benchmarks/scale_measure.py [--hash-size 1GiB] [--upload-size 512MiB]
[--smoke-artifact DIR] [--out benchmarks/results/scale-inputs.json]`` (about 2 min, plus the smoke).

What it measures, each against a named baseline in the same run:

- **hash**: ``hash_snapshot`` (what ingest runs) over a warm checkpoint-shaped folder of random bytes
  (``hash_throughput.build``), in MB per CPU-second (the per-core rate a worker scales with its cores)
  and in MB/s of wall time; baseline: one ``hashlib.sha256`` over the same bytes in one thread.
- **structure check**: ``verify_folder`` on a sparse, 29 GB Llama-shaped checkpoint in 6 shards
  (``verify_structure.build``; header-only, so bytes do not matter), first and second call in a fresh
  process (``verify_structure.measure``); a worker pays the second-call figure after its first run.
- **upload and download**: the object-store store (``S3Store.publish`` then ``S3Store.local`` from a
  fresh cache) against a real ``moto_server`` on 127.0.0.1, for an artifact of ``--upload-size`` random
  bytes in 128 MiB files (so multipart, as a real checkpoint); baselines: boto3's ``upload_file`` of the
  same files (its TransferManager: 8 MiB parts, 10 threads, no sha256), and boto3 multipart the way
  modelyard sends (64 MiB parts one after another) without modelyard's checksums. Loopback moto measures the client's path (hashing, checksums,
  HTTP), the ceiling of one worker; a real bucket adds the network.
- **publish of identical content**: the same ``publish`` again (every blob already there): the cost of
  a loser of the conditional put, or of a retried run.
- **smoke** (with ``--smoke-artifact``, an artifact folder such as the demo's): modelyard's ``load``
  smoke in the runtime venv's vLLM, wall seconds and the load seconds vLLM reports.
- **GPU weight load** (with ``--gpu-load FILE``): what ``benchmarks/gpu_load.py`` measured on a GPU host
  (a 29 GB checkpoint from disk into GPU memory), copied in as ``gpu_load``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import resource
import shutil
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import hash_throughput  # noqa: E402 - a sibling script, importable from benchmarks/
import verify_structure  # noqa: E402

MiB = 1 << 20
SHAPE_30GB = {"hidden_size": 5120, "intermediate_size": 13824, "num_hidden_layers": 48, "num_attention_heads": 40,
              "num_key_value_heads": 8}  # Llama-shaped, 14.5 B parameters: 29 GB in bf16


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def measure_hash(root: Path, size: int, shards: int) -> dict:
    from modelyard.model.digest import hash_snapshot
    from modelyard.model.snapshot import FileEntry, Snapshot

    meta = hash_throughput.build(root, size, shards)
    model = root / "model"
    for p in model.iterdir():  # warm the page cache: the figure is the CPU's, not the disk's
        with open(p, "rb") as fh:
            while fh.read(8 * MiB):
                pass
    entries = tuple(FileEntry(path=f["path"], size=f["size"]) for f in meta["files"])
    snap = Snapshot(root=model, source=str(model), kind="file", files=entries)
    best = None
    for _ in range(3):
        c0, t0 = cpu_s(), time.perf_counter()
        hash_snapshot(snap)
        wall, cpu = time.perf_counter() - t0, cpu_s() - c0
        if best is None or wall < best[0]:
            best = (wall, cpu)
    c0, t0 = cpu_s(), time.perf_counter()
    h = hashlib.sha256()
    for f in meta["files"]:
        with open(model / f["path"], "rb") as fh:
            while chunk := fh.read(4 * MiB):
                h.update(chunk)
    base = (time.perf_counter() - t0, cpu_s() - c0)
    mb = size / 1e6
    return {"bytes": size, "files": shards, "wall_s": best[0], "cpu_s": best[1], "mb_per_s": mb / best[0],
            "mb_per_cpu_s": mb / best[1], "baseline_one_thread_mb_per_s": mb / base[0],
            "ratio_vs_one_thread": base[0] / best[0], "cores": len(os.sched_getaffinity(0))}


def measure_structure(root: Path) -> dict:
    info = verify_structure.build(root, "Llama-15B", 6, SHAPE_30GB)
    m = verify_structure.measure(info["path"])
    return {"model_bytes": info["model_bytes"], "shards": info["shards"], "tensors": info["tensors"],
            "first_call_s": m["cold"]["wall_s"], "warm_call_s": m["warm"]["wall_s"],
            "bytes_read_warm": m["warm"]["rchar"]}


def _artifact(root: Path, size: int) -> tuple[Path, str]:
    """An artifact folder (model/ of random files + manifest.json) of ``size`` bytes; (folder, content digest)."""
    from modelyard.artifact.manifest import Manifest
    from modelyard.model.digest import tree_digest
    from modelyard.model.snapshot import FileEntry

    art = root / "artifact"
    (art / "model").mkdir(parents=True)
    entries, left, k = [], size, 0
    while left:
        n = min(128 * MiB, left)
        data = os.urandom(n)
        name = f"model-{k:05d}.safetensors"
        (art / "model" / name).write_bytes(data)
        entries.append(FileEntry(path=name, size=n, sha256=hashlib.sha256(data).hexdigest()))
        left, k = left - n, k + 1
    digest = "sha256:" + tree_digest(tuple(entries))
    Manifest.from_dict({"schema_version": "1", "name": "bench", "revision": "r1", "content_digest": digest,
                        "files": [{"path": f"model/{e.path}", "size": e.size, "sha256": e.sha256} for e in entries]}
                       ).save(art)
    (art / "report.json").write_text("{}\n")
    return art, digest


def measure_transfer(root: Path, size: int) -> dict:
    import boto3

    from modelyard.settings import Settings
    from modelyard.transport.objectstore import S3Store
    from tests.e2e.publish_servers import AWS_ENV, moto_s3

    os.environ.update(AWS_ENV)
    art, digest = _artifact(root, size)
    with moto_s3(root / "moto") as url:
        client = boto3.client("s3", endpoint_url=url)
        client.create_bucket(Bucket="bench")
        settings = Settings(s3_endpoint_url=url)
        files = sorted((art / "model").iterdir())
        t0 = time.perf_counter()
        for f in files:  # boto3's own TransferManager: 8 MiB parts, 10 threads
            client.upload_file(str(f), "bench", f"baseline/{f.name}")
        base_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        for f in files:  # boto3 multipart as modelyard sends it: 64 MiB parts, one after another, no checksums
            mpu = client.create_multipart_upload(Bucket="bench", Key=f"plain/{f.name}")
            parts = []
            with open(f, "rb") as fh:
                while chunk := fh.read(64 * MiB):
                    n = len(parts) + 1
                    out = client.upload_part(Bucket="bench", Key=f"plain/{f.name}", UploadId=mpu["UploadId"],
                                             PartNumber=n, Body=chunk)
                    parts.append({"PartNumber": n, "ETag": out["ETag"]})
            client.complete_multipart_upload(Bucket="bench", Key=f"plain/{f.name}", UploadId=mpu["UploadId"],
                                             MultipartUpload={"Parts": parts})
        plain_s = time.perf_counter() - t0
        store = S3Store("s3://bench/store", root / "cache-a", settings)

        def publish() -> float:
            staged = store.new_staging()
            shutil.copytree(art, staged, dirs_exist_ok=True, copy_function=os.link)
            t = time.perf_counter()
            store.publish(staged, "bench", "r1", digest)
            return time.perf_counter() - t

        up_s = publish()
        shutil.rmtree(root / "cache-a" / "bench")
        again_s = publish()  # every blob is there: HEADs, the index, the manifest's 412, reuse
        fresh = S3Store("s3://bench/store", root / "cache-b", settings)
        t0 = time.perf_counter()
        fresh.local(fresh.get("bench", "r1"))
        down_s = time.perf_counter() - t0
    mb = size / 1e6
    return {"bytes": size, "files": len(list((art / "model").iterdir())), "upload_s": up_s, "upload_mb_per_s": mb / up_s,
            "baseline_boto3_upload_file_mb_per_s": mb / base_s, "baseline_boto3_sequential_parts_mb_per_s": mb / plain_s, "republish_identical_s": again_s,
            "download_s": down_s, "download_mb_per_s": mb / down_s, "endpoint": "moto_server on 127.0.0.1"}


def measure_smoke(artifact: Path) -> dict:
    from modelyard.settings import Settings
    from modelyard.stages.smoke import smoke_load

    t0 = time.perf_counter()
    from modelyard.model.modes import default_prompt

    res = smoke_load(artifact / "model", Settings(), question=default_prompt("chat"))
    wall = time.perf_counter() - t0
    model_bytes = sum(p.stat().st_size for p in (artifact / "model").iterdir() if p.is_file())
    return {"artifact": artifact.name, "model_bytes": model_bytes, "wall_s": wall, "load_s": res.load_seconds,
            "passed": res.passed, "error": res.error, "answer": res.text, "finish_reason": res.finish_reason,
            "vllm": res.vllm_version, "device": "cpu"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hash-size", type=hash_throughput.parse_size, default=hash_throughput.parse_size("1GiB"))
    ap.add_argument("--upload-size", type=hash_throughput.parse_size, default=hash_throughput.parse_size("512MiB"))
    ap.add_argument("--smoke-artifact", type=Path, help="an artifact folder to smoke (e.g. the demo's); skipped without")
    ap.add_argument("--gpu-load", type=Path, help="the JSON benchmarks/gpu_load.py printed on a GPU host (kept as gpu_load)")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "scale-inputs.json")
    args = ap.parse_args()
    load0 = os.getloadavg()[0]
    out: dict = {"measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                 "machine": f"{platform.processor() or platform.machine()}, {len(os.sched_getaffinity(0))} cores, "
                            f"Python {platform.python_version()}", "load_avg_start": load0}
    with tempfile.TemporaryDirectory(prefix="scale-measure-") as tmp:
        t = Path(tmp)
        out["hash"] = measure_hash(t / "hash", args.hash_size, 8)
        print(f"hash: {out['hash']['mb_per_cpu_s']:.0f} MB per CPU-s, {out['hash']['mb_per_s']:.0f} MB/s on "
              f"{out['hash']['cores']} cores ({out['hash']['ratio_vs_one_thread']:.2f} x one sha256 thread)", flush=True)
        shutil.rmtree(t / "hash")
        out["structure"] = measure_structure(t / "structure")
        print(f"structure check of a {out['structure']['model_bytes'] / 1e9:.1f} GB checkpoint: first call "
              f"{out['structure']['first_call_s']:.2f} s, then {out['structure']['warm_call_s']:.2f} s", flush=True)
        shutil.rmtree(t / "structure")
        out["transfer"] = measure_transfer(t / "transfer", args.upload_size)
        tr = out["transfer"]
        print(f"upload {tr['upload_mb_per_s']:.0f} MB/s (boto3 upload_file {tr['baseline_boto3_upload_file_mb_per_s']:.0f} MB/s, "
              f"ratio {tr['upload_mb_per_s'] / tr['baseline_boto3_upload_file_mb_per_s']:.2f}; boto3 64 MiB parts one by one "
              f"{tr['baseline_boto3_sequential_parts_mb_per_s']:.0f} MB/s, ratio "
              f"{tr['upload_mb_per_s'] / tr['baseline_boto3_sequential_parts_mb_per_s']:.2f}); identical again "
              f"{tr['republish_identical_s']:.2f} s; "
              f"download {tr['download_mb_per_s']:.0f} MB/s", flush=True)
    if args.smoke_artifact:
        out["smoke"] = measure_smoke(args.smoke_artifact.resolve())
        print(f"smoke ({out['smoke']['device']}): {out['smoke']['wall_s']:.1f} s, vLLM load {out['smoke']['load_s']} s", flush=True)
    if args.gpu_load:
        out["gpu_load"] = json.loads(args.gpu_load.read_text())
    out["load_avg_end"] = os.getloadavg()[0]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    previous = json.loads(args.out.read_text()) if args.out.is_file() else {}
    for k in ("smoke", "gpu_load"):  # figures measured elsewhere (another run, another machine) are kept
        if k not in out and k in previous:
            out[k] = previous[k]
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
