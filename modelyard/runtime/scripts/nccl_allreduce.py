"""Runs INSIDE the serving runtime's interpreter (stdlib + torch), as a script: one all-reduce check
across this host's GPUs through ``torch.distributed``, one process per rank.

    python nccl_allreduce.py --world-size N --port P --bytes B [B ...] --iters K --warmup W --result r.json
                           [--backend nccl|gloo]

Each rank fills a float32 buffer with ``rank + 1`` and all-reduces it once (sum): every element must
then equal ``N (N + 1) / 2`` exactly (small integers are exact in float32). Then, per size in
``--bytes``, ``--warmup`` untimed and ``--iters`` timed all-reduces of a zeroed buffer, the GPU
synchronized before and after; rank 0 writes the figures as JSON to ``--result``:

- ``seconds_per_op``: wall seconds per all-reduce on rank 0;
- ``algbw_gbps``: bytes / seconds_per_op / 1e9;
- ``busbw_gbps``: ``algbw_gbps x 2 (N - 1) / N``, the bus bandwidth of nccl-tests
  (NVIDIA/nccl-tests doc/PERFORMANCE.md, "AllReduce"), comparable across rank counts.

``--backend gloo`` runs the same on CPU tensors (for hosts without GPUs). NVLink multicast (NVLS) is
whatever ``NCCL_NVLS_ENABLE`` says; the parent (``host_facts.nccl_check``) sets it to 0 unless the
caller set it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path


def bus_bandwidth(nbytes: int, seconds: float, world_size: int) -> tuple[float, float]:
    """``(algbw, busbw)`` in GB/s (10**9 bytes) of an all-reduce of ``nbytes`` that took ``seconds``
    across ``world_size`` ranks (nccl-tests' definitions)."""
    algbw = nbytes / seconds / 1e9
    return algbw, algbw * 2 * (world_size - 1) / world_size


def _worker(rank: int, a: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(a.port)
    n = a.world_size
    gpu = a.backend == "nccl"
    if gpu:
        torch.cuda.set_device(rank)
        dev = torch.device("cuda", rank)
        dist.init_process_group("nccl", rank=rank, world_size=n, device_id=dev)
    else:
        dev = torch.device("cpu")
        dist.init_process_group("gloo", rank=rank, world_size=n)

    def sync() -> None:
        if gpu:
            torch.cuda.synchronize(dev)

    try:
        x = torch.full((max(a.bytes) // 4,), float(rank + 1), dtype=torch.float32, device=dev)
        dist.all_reduce(x)
        sync()
        expected = n * (n + 1) / 2
        lo, hi = x.min().item(), x.max().item()
        rows = []
        for nbytes in a.bytes:
            buf = x[: nbytes // 4]
            buf.zero_()
            for _ in range(a.warmup):
                dist.all_reduce(buf)
            sync()
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(a.iters):
                dist.all_reduce(buf)
            sync()
            sec = (time.perf_counter() - t0) / a.iters
            algbw, busbw = bus_bandwidth(buf.numel() * 4, sec, n)
            rows.append({"bytes": buf.numel() * 4, "iters": a.iters, "seconds_per_op": sec,
                         "algbw_gbps": algbw, "busbw_gbps": busbw})
        if rank == 0:
            res = {"ok": lo == hi == expected, "backend": a.backend, "world_size": n, "expected": expected,
                   "got_min": lo, "got_max": hi, "sizes": rows, "torch": torch.__version__,
                   "nccl": ".".join(map(str, torch.cuda.nccl.version())) if gpu else None,
                   "devices": [torch.cuda.get_device_name(i) for i in range(n)] if gpu else [],
                   "nvls_enable": os.environ.get("NCCL_NVLS_ENABLE")}
            Path(a.result).write_text(json.dumps(res))
    finally:
        dist.destroy_process_group()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--world-size", type=int, required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--bytes", type=int, nargs="+", default=[256 * 2**20])
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    ap.add_argument("--result", type=Path, required=True)
    a = ap.parse_args()
    try:
        import torch.multiprocessing as mp

        mp.spawn(_worker, args=(a,), nprocs=a.world_size, join=True)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent process as data
        last = [ln for ln in str(exc).splitlines() if ln.strip()]  # a rank's error ends its traceback
        a.result.write_text(json.dumps({"ok": False, "error": last[-1][:500] if last else type(exc).__name__,
                                        "traceback": traceback.format_exc()[-3000:]}))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
