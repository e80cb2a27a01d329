"""GPU doctor: ``modelyard doctor`` on a real multi-GPU host, checked against nvidia-smi and a direct all-reduce.

What runs, in one process tree, in this order:

1. ``modelyard doctor --json`` and ``modelyard doctor`` (text), with ``MODELYARD_VLLM_PYTHON`` = this interpreter
   when unset (the runtime whose torch and NCCL are probed and all-reduced; vLLM itself may be absent), timed.
2. Baseline for the facts: ``nvidia-smi --query-gpu=index,name,memory.total,compute_cap,driver_version`` and its
   banner; each GPU's name, memory (MiB x 2**20 against NVML's bytes), compute capability, the driver and the
   driver's CUDA version must agree with what doctor reported through NVML.
3. The all-reduce runner doctor uses (``modelyard/runtime/scripts/nccl_allreduce.py``) over ``--sizes`` bytes, and the
   baseline for its bandwidth: a direct ``torch.distributed.all_reduce`` loop timed with CUDA events (a separate
   script, nothing of modelyard), at the doctor check's size (256 MiB). Ratio: doctor busbw / direct busbw.
4. ``modelyard doctor ARTIFACT --json`` for each ``--artifact`` folder (the exit code and the judged needs).

NVLink multicast stays off: ``NCCL_NVLS_ENABLE=0`` (also ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``,
``NVSHMEM_DISABLE_NVLS=1``) is set here unless the environment already sets it. Writes ``gpu-doctor.json`` and the
doctor text under ``--out``; prints the comparison and the ratio.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MIB = 2**20

DIRECT = r"""
import json, os, sys, torch, torch.distributed as dist, torch.multiprocessing as mp
def work(rank, n, port, nbytes, iters, warmup, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=n, device_id=torch.device("cuda", rank))
    x = torch.zeros(nbytes // 4, dtype=torch.float32, device="cuda")
    for _ in range(warmup):
        dist.all_reduce(x)
    torch.cuda.synchronize(); dist.barrier()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(iters):
        dist.all_reduce(x)
    b.record(); torch.cuda.synchronize()
    sec = a.elapsed_time(b) / 1e3 / iters
    if rank == 0:
        algbw = nbytes / sec / 1e9
        open(out, "w").write(json.dumps({"bytes": nbytes, "seconds_per_op": sec, "algbw_gbps": algbw,
                                         "busbw_gbps": algbw * 2 * (n - 1) / n}))
    dist.destroy_process_group()
if __name__ == "__main__":
    n, port, nbytes, iters, warmup, out = (int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]),
                                           int(sys.argv[5]), sys.argv[6])
    mp.spawn(work, args=(n, port, nbytes, iters, warmup, out), nprocs=n)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def modelyard(args: list[str], env: dict, timeout: float = 300) -> tuple[int, str, str, float]:
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "modelyard", *args], capture_output=True, text=True, env=env,
                       timeout=timeout)
    return r.returncode, r.stdout, r.stderr, time.perf_counter() - t0


def smi_facts() -> dict:
    if not shutil.which("nvidia-smi"):
        return {"gpus": [], "cuda_version": None, "banner": ""}
    q = subprocess.run(["nvidia-smi", "--query-gpu=index,name,memory.total,compute_cap,driver_version",
                        "--format=csv,noheader,nounits"], capture_output=True, text=True).stdout
    banner = subprocess.run(["nvidia-smi"], capture_output=True, text=True).stdout
    gpus = [dict(zip(("index", "name", "memory_mib", "compute_capability", "driver"),
                     (x.strip() for x in line.split(",")))) for line in q.strip().splitlines()]
    m = re.search(r"CUDA Version:\s*([\d.]+)", banner)
    return {"gpus": gpus, "cuda_version": m.group(1) if m else None, "banner": banner}


def compare(host: dict, smi: dict) -> dict:
    """Field-by-field agreement of doctor's NVML facts with nvidia-smi's."""
    rows = []
    for g, s in zip(host["gpus"], smi["gpus"]):
        rows.append({"index": g["index"], "name": g["name"] == s["name"],
                     "memory": g["memory_bytes"] == int(s["memory_mib"]) * MIB,
                     "memory_bytes_nvml": g["memory_bytes"], "memory_mib_smi": int(s["memory_mib"]),
                     "compute_capability": g["compute_capability"] == s["compute_capability"],
                     "driver": host["driver_version"] == s["driver"]})
    return {"gpus": rows, "count": len(host["gpus"]) == len(smi["gpus"]),
            "cuda_version": host["cuda_version"] == smi["cuda_version"],
            "all_agree": len(host["gpus"]) == len(smi["gpus"]) and host["cuda_version"] == smi["cuda_version"]
            and all(r["name"] and r["memory"] and r["compute_capability"] and r["driver"] for r in rows)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--sizes", type=int, nargs="+", default=[MIB, 16 * MIB, 256 * MIB, 1024 * MIB, 4096 * MIB])
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--artifact", type=Path, action="append", default=[], help="doctor ARTIFACT --no-nccl")
    ap.add_argument("--artifact-nccl", type=Path, action="append", default=[],
                    help="doctor ARTIFACT with the NCCL check (tensor-parallel artifacts)")
    ap.add_argument("--skip-host", action="store_true", help="only the artifact runs (steps 1-3 done before)")
    ap.add_argument("--name", default="gpu-doctor.json", help="file name of the JSON under --out")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    for k, v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1"),
                 ("MODELYARD_VLLM_PYTHON", sys.executable)):
        env.setdefault(k, v)
    os.environ.update({k: env[k] for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST",
                                           "NVSHMEM_DISABLE_NVLS")})
    res: dict = {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version(),
                 "versions": {d: _version(d) for d in ("torch", "nvidia-ml-py", "nvidia-nccl-cu13", "typer", "rich")},
                 "env": {k: env[k] for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST",
                                             "NVSHMEM_DISABLE_NVLS", "MODELYARD_VLLM_PYTHON")}}
    if not a.skip_host:
        host_steps(a, env, res)
    res["artifacts"] = []
    for art, nccl in [(p, False) for p in a.artifact] + [(p, True) for p in a.artifact_nccl]:
        rc, out, err, sec = modelyard(["doctor", str(art), "--json"] + ([] if nccl else ["--no-nccl"]), env)
        row = {"path": str(art), "nccl": nccl, "exit": rc, "seconds": round(sec, 2)}
        try:
            row["needs"] = json.loads(out)["result"]["needs"]  # the --json envelope's result
        except (ValueError, KeyError, TypeError):
            row["stdout"], row["stderr"] = out[-2000:], err[-2000:]
        res["artifacts"].append(row)
        print(f"doctor {art}: exit {rc}; " + "; ".join(f"{c['need']}: {c['have']} -> {c['ok']}"
                                                       for c in row.get("needs", [])), flush=True)
    (a.out / a.name).write_text(json.dumps(res, indent=1))


def host_steps(a: argparse.Namespace, env: dict, res: dict) -> None:
    """Steps 1-3 of the module docstring, into ``res``."""
    rc, out, err, sec = modelyard(["doctor", "--json"], env)
    res["doctor_json"] = {"exit": rc, "seconds": round(sec, 2), "stderr": err[-2000:]}
    try:
        res["doctor_json"]["report"] = json.loads(out)["result"]  # the --json envelope's result
    except (ValueError, KeyError, TypeError):
        res["doctor_json"]["stdout"] = out[-3000:]
    rc, out, err, sec = modelyard(["doctor"], env)
    (a.out / "doctor.txt").write_text(out + ("\n--- stderr ---\n" + err if err else ""))
    res["doctor_text"] = {"exit": rc, "seconds": round(sec, 2)}
    print(out, err, sep="\n", flush=True)

    smi = smi_facts()
    res["nvidia_smi"] = {k: v for k, v in smi.items() if k != "banner"}
    host = res["doctor_json"].get("report", {}).get("host")
    if host:
        res["agreement"] = compare(host, smi)
        print("doctor (NVML) vs nvidia-smi:", json.dumps(res["agreement"]), flush=True)

    n = len(smi["gpus"])
    if n >= 2:
        sys.path.insert(0, str(ROOT))
        from modelyard.stages.serve import doctor as d

        with tempfile.TemporaryDirectory() as tmp:
            r = Path(tmp) / "r.json"
            subprocess.run([sys.executable, str(d.NCCL_RUNNER), "--world-size", str(n), "--port", str(free_port()),
                            "--bytes", *map(str, a.sizes), "--iters", str(a.iters), "--result", str(r)],
                           env=env, timeout=300)
            res["sweep"] = json.loads(r.read_text()) if r.is_file() else {"error": "the runner wrote no result"}
            direct, script = Path(tmp) / "direct.json", Path(tmp) / "direct_allreduce.py"
            script.write_text(DIRECT)  # a file, not -c: spawned ranks import their function from it
            p = subprocess.run([sys.executable, str(script), str(n), str(free_port()), str(256 * MIB), str(a.iters),
                                "5", str(direct)], env=env, timeout=300, capture_output=True, text=True)
            res["direct_256mib"] = (json.loads(direct.read_text()) if direct.is_file()
                                    else {"error": p.stderr[-2000:]})
        print(f"{'bytes':>12}{'ms/op':>10}{'algbw GB/s':>12}{'busbw GB/s':>12}")
        for s in res["sweep"].get("sizes", []):
            print(f"{s['bytes']:>12}{s['seconds_per_op'] * 1e3:>10.3f}{s['algbw_gbps']:>12.1f}{s['busbw_gbps']:>12.1f}")
        check = (host or {}).get("nccl") or {}
        if check.get("busbw_gbps") and res["direct_256mib"].get("busbw_gbps"):
            ratio = check["busbw_gbps"] / res["direct_256mib"]["busbw_gbps"]
            res["ratio_doctor_busbw_over_direct"] = round(ratio, 4)
            print(f"doctor's check: {check['busbw_gbps']:.1f} GB/s bus bandwidth at 256 MiB; baseline direct "
                  f"torch.distributed all_reduce (CUDA events): {res['direct_256mib']['busbw_gbps']:.1f} GB/s; "
                  f"ratio {ratio:.3f}", flush=True)



def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


if __name__ == "__main__":
    main()
