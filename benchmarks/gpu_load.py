"""How fast a GPU host moves a 29 GB safetensors checkpoint from disk into GPU memory: the part of a
vLLM smoke that grows with the model's size (``docs/scale-out.md``). Runs where the GPU is (needs
torch with CUDA and safetensors only; no vLLM, no modelyard).

Run: ``python3 benchmarks/gpu_load.py [--gb 29] [--shards 6] [--dir /tmp/ckpt] > gpu-load.json`` (about
3 min on one H200). It writes ``--shards`` bf16 safetensors shards of random values (5 tensors each),
then loads every shard with ``safetensors.torch.load_file(device="cuda:0")`` twice: first after
``posix_fadvise(DONTNEED)`` on each file (the page cache dropped where the kernel honours it), then
again with the files cached. Baseline: the same bytes as one ``torch.empty`` host tensor copied to the
GPU (``.to("cuda")`` from pageable memory), the copy alone.

Prints one JSON object; ``benchmarks/scale_measure.py --gpu-load FILE`` adds it to the scale inputs
under ``gpu_load``.
"""

from __future__ import annotations

import argparse
import json
import os
import time


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gb", type=float, default=29.0)
    ap.add_argument("--shards", type=int, default=6)
    ap.add_argument("--dir", default="/tmp/gpu-load-ckpt")
    args = ap.parse_args()
    import torch
    from safetensors.torch import load_file, save_file

    os.makedirs(args.dir, exist_ok=True)
    per_tensor = int(args.gb * 1e9 / 2 / args.shards / 5)  # bf16 elements
    paths = []
    t0 = time.perf_counter()
    for i in range(args.shards):
        tensors = {f"w{j}": torch.randn(per_tensor, device="cuda", dtype=torch.bfloat16).cpu() for j in range(5)}
        path = os.path.join(args.dir, f"model-{i:05d}.safetensors")
        save_file(tensors, path)
        paths.append(path)
        del tensors
    write_s = time.perf_counter() - t0
    total = sum(os.path.getsize(p) for p in paths)

    def load() -> float:
        torch.cuda.synchronize()
        t = time.perf_counter()
        for p in paths:
            sd = load_file(p, device="cuda:0")
            torch.cuda.synchronize()
            del sd
        return time.perf_counter() - t

    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    dropped_s = load()
    cached_s = load()
    host = torch.empty(total // 2, dtype=torch.bfloat16)
    torch.cuda.synchronize()
    t = time.perf_counter()
    host.to("cuda")
    torch.cuda.synchronize()
    copy_s = time.perf_counter() - t
    print(json.dumps({"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "bytes": total,
                      "shards": args.shards, "write_s": write_s, "load_after_fadvise_s": dropped_s,
                      "load_after_fadvise_gb_per_s": total / 1e9 / dropped_s, "load_cached_s": cached_s,
                      "load_cached_gb_per_s": total / 1e9 / cached_s, "baseline_host_copy_gb_per_s": total / 1e9 / copy_s,
                      "cpus": os.cpu_count()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
