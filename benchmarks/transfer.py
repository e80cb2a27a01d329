"""Publish and pull of a big artifact to an object store and to an OCI registry, against the transfer the
ecosystem's own tools make of the same files, in one run.

Run: ``.venv/bin/python benchmarks/transfer.py [--size 1GiB] [--rounds 5] [--only s3|oci]`` (about 10 min for
1 GiB and 5 rounds on 2 cores; the numbers are in benchmarks/README.md). Rounds are interleaved: each round times
both sides, the baseline first in odd rounds and second in even ones, and its ratio is taken within the round, so
a load that comes and goes moves both sides of a ratio alike; the disk is synced (untimed) before each call, so
that neither side pays for writing back what the other wrote. The figure reported is the median of the rounds'
ratios, with their range, and the machine's load average before and after.

- **S3**: ``S3Store.publish`` (every byte hashed on the way, a ``ChecksumSHA256`` per part, parts of 16 MiB,
  10 in flight), then ``S3Store.local`` from a fresh cache (ranged GETs of 16 MiB, 10 in flight, hashed whole),
  against a real ``moto_server`` on 127.0.0.1. Baseline: boto3's ``upload_file`` / ``download_file`` (the
  TransferManager ``aws s3 cp`` uses) with ``TransferConfig(max_concurrency=10, multipart_chunksize=16 MiB,
  multipart_threshold=16 MiB)``, the same concurrency and part size, and no checksums.
- **OCI**: ``publish_oci`` then ``pull_oci`` (layers hashed on the way and checked against the manifest)
  against the Debian ``docker-registry`` on 127.0.0.1. Baseline: oras-py's own ``OrasClient.push`` and
  ``pull`` of the same files (the library modelyard speaks OCI through; the ``oras`` CLI is not packaged here).

The artifact: random bytes in 512 MiB files (a checkpoint's shards) plus a manifest.

Memory: each timed call's peak resident memory above what the process held when it began (``/proc/self/statm``
sampled every 5 ms in a thread), per side, the larger of its two runs.
"""

# ruff: noqa: B023 - each lambda is timed (called) in the iteration that makes it
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

MiB = 1 << 20


def _size(text: str) -> int:
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    for u, m in units.items():
        if text.endswith(u):
            return int(float(text[: -len(u)]) * m)
    return int(text)


def artifact(root: Path, size: int, file_bytes: int = 512 * MiB) -> tuple[Path, str]:
    """An artifact folder (model/ of random files + manifest.json + report.json) of ``size`` bytes."""
    import hashlib

    from modelyard.artifact.manifest import Manifest
    from modelyard.checks import Report
    from modelyard.model.digest import tree_digest
    from modelyard.model.snapshot import FileEntry

    art = root / "artifact"
    (art / "model").mkdir(parents=True)
    entries, left, k = [], size, 0
    while left:
        n = min(file_bytes, left)
        name = f"model-{k:05d}-of-99999.safetensors"
        h = hashlib.sha256()
        with open(art / "model" / name, "wb") as fh:
            for off in range(0, n, 64 * MiB):
                block = os.urandom(min(64 * MiB, n - off))
                h.update(block)
                fh.write(block)
        entries.append(FileEntry(path=name, size=n, sha256=h.hexdigest()))
        left, k = left - n, k + 1
    digest = "sha256:" + tree_digest(tuple(entries))
    Manifest.from_dict({"schema_version": "1", "name": "bench", "revision": "r1", "content_digest": digest,
                        "files": [{"path": f"model/{e.path}", "size": e.size, "sha256": e.sha256} for e in entries]}
                       ).save(art)
    (art / "report.json").write_text(json.dumps(Report(findings=()).to_dict()) + "\n")
    return art, digest


#: side -> the largest peak RSS above its start (bytes) of its timed calls
PEAKS: dict[str, int] = {}
PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * PAGE


def timed(fn, side: str = "") -> float:  # noqa: ANN001
    """Seconds ``fn()`` took; its peak RSS above the start goes to :data:`PEAKS` under ``side``."""
    start, peak, done = _rss(), [0], threading.Event()

    def sample() -> None:
        while not done.wait(0.005):
            peak[0] = max(peak[0], _rss() - start)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t = time.perf_counter()
    try:
        fn()
    finally:
        seconds = time.perf_counter() - t
        done.set()
        sampler.join()
    PEAKS[side] = max(PEAKS.get(side, 0), peak[0])
    return seconds


def _median(xs: list[float]) -> float:
    import statistics

    return statistics.median(xs)


def _interleaved(rounds: int, pairs: list[tuple[str, str, object, object]], after=None) -> dict:  # noqa: ANN001
    """Time each ``(label, base_label, ours, base)`` pair of callables ``rounds`` times, the baseline first in odd
    rounds; ``ours(k)`` and ``base(k)`` act on round ``k``'s names, and ``after(k)`` (untimed) ends round ``k``.
    Returns, per label, the median speed ratio (baseline seconds / ours) with its range, and both sides' median
    seconds."""
    out: dict = {}
    for label, base_label, ours, base in pairs:
        ratios, mine, theirs = [], [], []
        for k in range(rounds):
            order = [("base", base), ("ours", ours)] if k % 2 == 0 else [("ours", ours), ("base", base)]
            got = {}
            for who, fn in order:
                os.sync()  # untimed: the previous call's dirty pages are on disk, not flushed during this one
                got[who] = timed(lambda: fn(k), base_label if who == "base" else label)  # type: ignore[operator]
            if after is not None:
                after(k)
            ratios.append(got["base"] / got["ours"])
            mine.append(got["ours"])
            theirs.append(got["base"])
        out[label] = {"ratio": _median(ratios), "low": min(ratios), "high": max(ratios), "seconds": _median(mine),
                      "base_seconds": _median(theirs), "ratios": ratios}
    return out


def bench_s3(root: Path, art: Path, digest: str, size: int, rounds: int) -> dict:
    import boto3
    from boto3.s3.transfer import TransferConfig

    from modelyard.settings import Settings
    from modelyard.transport.objectstore import S3Store
    from tests.e2e.publish_servers import AWS_ENV, moto_s3

    os.environ.update(AWS_ENV)
    files = sorted((art / "model").iterdir())
    with moto_s3(root / "moto") as url:
        client = boto3.client("s3", endpoint_url=url)
        client.create_bucket(Bucket="bench")
        cfg = TransferConfig(max_concurrency=10, multipart_chunksize=16 * MiB, multipart_threshold=16 * MiB)
        settings = Settings(s3_endpoint_url=url)

        def publish(k: int) -> None:
            store = S3Store(f"s3://bench/store{k}", root / f"cache-a{k}", settings=settings)
            staged = store.new_staging()
            shutil.copytree(art, staged, dirs_exist_ok=True, copy_function=os.link)
            store.publish(staged, "bench", "r1", digest)

        def upload(k: int) -> None:
            for f in files:
                client.upload_file(str(f), "bench", f"baseline{k}/{f.name}", Config=cfg)

        def pull(k: int) -> None:
            fresh = S3Store(f"s3://bench/store{k}", root / f"cache-b{k}", settings=settings)
            try:
                fresh.local(fresh.get("bench", "r1"))
            finally:
                shutil.rmtree(root / f"cache-b{k}", ignore_errors=True)

        def download(k: int) -> None:
            down = root / f"boto3-down{k}"
            down.mkdir()
            try:
                for f in files:
                    client.download_file("bench", f"baseline{k}/{f.name}", str(down / f.name), Config=cfg)
            finally:
                shutil.rmtree(down)

        def forget(k: int) -> None:  # moto keeps every object: round k's are not read again
            for prefix in (f"store{k}/", f"baseline{k}/"):
                for page in client.get_paginator("list_objects_v2").paginate(Bucket="bench", Prefix=prefix):
                    for o in page.get("Contents", []):
                        client.delete_object(Bucket="bench", Key=o["Key"])

        out = _interleaved(rounds, [("modelyard S3 publish", "boto3 upload", publish, upload)])
        out |= _interleaved(rounds, [("modelyard S3 pull", "boto3 download", pull, download)], after=forget)
    return out


def bench_oci(root: Path, art: Path, size: int, rounds: int) -> dict:
    import oras.client

    from modelyard.settings import Settings
    from modelyard.transport.oci import publish_oci, pull_oci
    from tests.e2e.publish_servers import docker_registry

    settings = Settings()
    files = sorted((art / "model").iterdir())
    with docker_registry(root / "registry") as host:
        client = oras.client.OrasClient(hostname=host, insecure=True)

        def push(k: int) -> None:
            cwd = os.getcwd()
            os.chdir(art / "model")  # oras-py names layers by the paths given
            try:
                client.push(target=f"{host}/baseline{k}/bench:r1", files=[f.name for f in files],
                            disable_path_validation=True)
            finally:
                os.chdir(cwd)

        def publish(k: int) -> None:
            publish_oci(art, f"oci://{host}/models{k}/bench:r1", settings=settings)

        def oras_pull(k: int) -> None:
            client.pull(target=f"{host}/baseline{k}/bench:r1", outdir=str(root / f"oras-down{k}"))
            shutil.rmtree(root / f"oras-down{k}")

        def pull(k: int) -> None:
            pull_oci(f"oci://{host}/models{k}/bench:r1", root / f"pulled{k}", settings=settings)
            shutil.rmtree(root / f"pulled{k}")

        out = _interleaved(rounds, [("modelyard OCI publish", "oras-py push", publish, push)])
        out |= _interleaved(rounds, [("modelyard OCI pull", "oras-py pull", pull, oras_pull)])
    return out


def _load() -> str:
    with open("/proc/loadavg") as fh:
        return " ".join(fh.read().split()[:3])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="1GiB", help="artifact bytes (KiB/MiB/GiB suffixes)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds per comparison")
    ap.add_argument("--only", choices=("s3", "oci"), default=None)
    args = ap.parse_args()
    size = _size(args.size)
    with tempfile.TemporaryDirectory(prefix="modelyard-transfer-", dir=os.environ.get("TMPDIR", "/tmp")) as tmp:
        root = Path(tmp)
        art, digest = artifact(root, size)
        print(f"artifact: {size / 1e9:.2f} GB in {len(list((art / 'model').iterdir()))} files, {os.cpu_count()} CPUs, "
              f"{args.rounds} interleaved rounds; load average before: {_load()}")
        rows: dict = {}
        if args.only in (None, "s3"):
            rows |= bench_s3(root, art, digest, size, args.rounds)
        if args.only in (None, "oci"):
            rows |= bench_oci(root, art, size, args.rounds)
    mb = size / 1e6
    for label, r in rows.items():
        print(f"{label}: {r['ratio']:.2f}x the baseline's speed (median of {len(r['ratios'])} rounds; range "
              f"{r['low']:.2f}-{r['high']:.2f}: {', '.join(f'{x:.2f}' for x in r['ratios'])}); "
              f"{mb / r['seconds']:.0f} MB/s against {mb / r['base_seconds']:.0f} MB/s")
    print(f"load average after: {_load()}")
    print("peak RSS above the start of each call (the largest of its rounds): "
          + ", ".join(f"{side} {b / MiB:.0f} MiB" for side, b in PEAKS.items()))
    print(f"peak RSS of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
