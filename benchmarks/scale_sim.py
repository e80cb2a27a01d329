"""What N workers sustain: a small simulation of many ingest workers sharing a hub, a GPU pool and one
object store, driven by the per-worker figures that ``benchmarks/scale_measure.py`` measured
(``benchmarks/results/scale-inputs.json``). ``docs/scale-out.md`` is the plan it backs.

Run: ``.venv/bin/python benchmarks/scale_sim.py [--inputs FILE] [--per-day 1000] [--mean-gb 30] [--json OUT]``
(a few seconds; pure Python, no dependency).

**Measured inputs** (read from the JSON, never typed in): hashing in MB per CPU-second, the structure
check's warm time, one worker's upload MB/s into the object store, the identical-republish time, the
fixed part of a vLLM smoke (the demo model's smoke on the development CPU) and a GPU host's weight-load
GB/s (29 GB from disk into an H200, page cache dropped).

**Scenario** (flags, printed with every result; these are what the plan varies, not per-worker facts):
arrivals per day and checkpoint sizes (log-normal around ``--mean-gb``), cores a worker gives hashing,
its NIC, the hub's total egress to us, the bucket's ingest bandwidth and PUT rate, GPU slots per worker,
runs per worker (the Prefect worker's ``--limit``).

**Model.** Each checkpoint is one run through the stages ingest runs on one worker: fetch (bytes from the
hub: the worker NIC's share and the hub egress's share, whichever is smaller), hash (the worker's cores
shared by its hashing runs), structure check (fixed), smoke (holds one slot of the GPU pool: fixed part +
size / GPU load rate), upload (the measured per-worker rate, the NIC's share and the bucket's share of
bandwidth and PUT rate, one PUT per 64 MiB part). Time advances in ``--dt`` steps; bandwidths are shared
equally among the runs using them (a fluid model). Arrivals are Poisson. The first day warms up; the
next ``--days - 1`` are measured. A rate is sustained when the runs completed match the arrivals (98 %)
and the backlog does not grow.
"""

from __future__ import annotations

import argparse
import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DAY = 86400.0
PART = 64 * 2**20  # bytes per PUT (modelyard's multipart part size)
STAGES = ("queued", "fetch", "hash", "verify", "gpu_wait", "smoke", "upload", "done")


@dataclass(frozen=True)
class Inputs:
    """Per-worker figures (measured) and the scenario (flags). Rates in bytes/s, times in seconds."""

    hash_per_core: float
    verify_s: float
    upload_client: float
    smoke_fixed_s: float
    gpu_load: float
    republish_s: float
    cores: int
    nic: float
    hub: float
    store_in: float
    put_rate: float
    gpu_per_worker: int
    runs_per_worker: int

    @classmethod
    def load(cls, path: Path, a: argparse.Namespace) -> Inputs:
        m = json.loads(path.read_text())
        missing = [k for k in ("hash", "structure", "transfer", "smoke", "gpu_load") if k not in m]
        if missing:
            raise SystemExit(f"{path} lacks {', '.join(missing)}: run benchmarks/scale_measure.py (with --smoke-artifact "
                             "and --gpu-load) first")
        gbit = 1e9 / 8
        return cls(hash_per_core=m["hash"]["mb_per_cpu_s"] * 1e6, verify_s=m["structure"]["warm_call_s"],
                   upload_client=m["transfer"][{"modelyard": "upload_mb_per_s",
                                                "boto3": "baseline_boto3_upload_file_mb_per_s"}[a.upload_as]] * 1e6,
                   smoke_fixed_s=m["smoke"]["wall_s"],
                   gpu_load=m["gpu_load"]["load_after_fadvise_gb_per_s"] * 1e9,
                   republish_s=m["transfer"]["republish_identical_s"], cores=a.worker_cores, nic=a.worker_nic_gbps * gbit,
                   hub=a.hub_egress_gbps * gbit, store_in=a.store_ingress_gbps * gbit, put_rate=a.put_rate,
                   gpu_per_worker=a.gpu_slots_per_worker, runs_per_worker=a.runs_per_worker)

    def alone(self, size: float) -> dict[str, float]:
        """Seconds per stage for one checkpoint of ``size`` bytes on an otherwise idle system."""
        return {"fetch": size / min(self.nic, self.hub), "hash": size / (self.hash_per_core * self.cores),
                "verify": self.verify_s, "smoke": self.smoke_fixed_s + size / self.gpu_load,
                "upload": size / min(self.upload_client, self.nic, self.store_in, self.put_rate * PART)}


@dataclass
class Job:
    size: float
    arrived: float
    stage: str = "queued"
    left: float = 0.0  # bytes (fetch, hash, upload) or seconds (verify, smoke) still to go
    worker: int = -1
    done_at: float = -1.0


@dataclass
class Result:
    workers: int
    arrived: int
    completed: int
    backlog_start: int
    backlog_end: int
    latency_p50_h: float
    latency_p95_h: float
    util: dict[str, float] = field(default_factory=dict)

    @property
    def sustained(self) -> bool:
        return self.completed >= 0.98 * self.arrived and self.backlog_end <= max(self.backlog_start, 0.02 * self.arrived) + 5

    @property
    def bottleneck(self) -> str:
        return max(self.util, key=self.util.get)


def simulate(inp: Inputs, workers: int, per_day: float, mean_gb: float, sigma: float, days: int, dt: float,
             seed: int) -> Result:
    rng = random.Random(seed)
    mu = math.log(mean_gb * 1e9) - sigma**2 / 2  # a log-normal whose mean is mean_gb
    slots_total = workers * inp.runs_per_worker
    gpu_total = workers * inp.gpu_per_worker
    queue: list[Job] = []
    active: list[Job] = []
    gpu_queue: list[Job] = []
    finished: list[Job] = []
    busy = {"workers": 0.0, "hub egress": 0.0, "GPU slots": 0.0, "store ingress": 0.0, "PUT rate": 0.0}
    t, next_arrival = 0.0, rng.expovariate(per_day / DAY)
    warm = DAY
    backlog_start = 0
    arrived = 0
    while t < days * DAY:
        while next_arrival <= t:
            queue.append(Job(size=rng.lognormvariate(mu, sigma), arrived=next_arrival))
            if next_arrival >= warm:
                arrived += 1
            next_arrival += rng.expovariate(per_day / DAY)
        if backlog_start == 0 and t >= warm:
            backlog_start = len(queue) + len(active)
        per_worker = [0] * workers
        for j in active:
            per_worker[j.worker] += 1
        while queue and len(active) < slots_total:  # a free run slot takes the oldest submission
            w = min(range(workers), key=lambda k: per_worker[k])
            j = queue.pop(0)
            j.stage, j.left, j.worker = "fetch", j.size, w
            per_worker[w] += 1
            active.append(j)
        # bandwidth and CPU shares for this step
        fetching = [j for j in active if j.stage == "fetch"]
        uploading = [j for j in active if j.stage == "upload"]
        hashing = [j for j in active if j.stage == "hash"]
        count = {s: [0] * workers for s in ("fetch", "hash", "upload")}
        for j in fetching + hashing + uploading:
            count[j.stage][j.worker] += 1
        hub_share = inp.hub / len(fetching) if fetching else 0.0
        store_share = min(inp.store_in, inp.put_rate * PART) / len(uploading) if uploading else 0.0
        used = {"hub egress": 0.0, "store ingress": 0.0, "PUT rate": 0.0}
        in_smoke = sum(1 for j in active if j.stage == "smoke")
        while gpu_queue and in_smoke < gpu_total:
            g = gpu_queue.pop(0)
            g.stage, g.left = "smoke", inp.smoke_fixed_s + g.size / inp.gpu_load
            in_smoke += 1
        for j in list(active):
            if j.stage == "fetch":
                rate = min(inp.nic / count["fetch"][j.worker], hub_share)
                used["hub egress"] += rate
                j.left -= rate * dt
                if j.left <= 0:
                    j.stage, j.left = "hash", j.size
            elif j.stage == "hash":
                j.left -= inp.hash_per_core * inp.cores / count["hash"][j.worker] * dt
                if j.left <= 0:
                    j.stage, j.left = "verify", inp.verify_s
            elif j.stage == "verify":
                j.left -= dt
                if j.left <= 0:
                    j.stage = "gpu_wait"
                    gpu_queue.append(j)
            elif j.stage == "smoke":
                j.left -= dt
                if j.left <= 0:
                    j.stage, j.left = "upload", j.size
            elif j.stage == "upload":
                rate = min(inp.upload_client, inp.nic / count["upload"][j.worker], store_share)
                used["store ingress"] += rate
                used["PUT rate"] += rate / PART
                j.left -= rate * dt
                if j.left <= 0:
                    j.stage, j.done_at = "done", t + dt
                    active.remove(j)
                    finished.append(j)
        if t >= warm:
            busy["workers"] += len(active) / slots_total * dt
            busy["GPU slots"] += in_smoke / gpu_total * dt
            busy["hub egress"] += used["hub egress"] / inp.hub * dt
            busy["store ingress"] += used["store ingress"] / inp.store_in * dt
            busy["PUT rate"] += used["PUT rate"] / inp.put_rate * dt
        t += dt
    window = (days - 1) * DAY
    done = [j for j in finished if j.done_at >= warm]
    lat = sorted((j.done_at - j.arrived) / 3600 for j in done) or [float("nan")]
    return Result(workers, arrived, len(done), backlog_start, len(queue) + len(active), lat[len(lat) // 2],
                  lat[min(len(lat) - 1, int(0.95 * len(lat)))], {k: v / window for k, v in busy.items()})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inputs", type=Path, default=REPO / "benchmarks" / "results" / "scale-inputs.json")
    ap.add_argument("--per-day", type=float, default=1000)
    ap.add_argument("--mean-gb", type=float, default=30)
    ap.add_argument("--size-sigma", type=float, default=0.6, help="spread of the log-normal checkpoint sizes")
    ap.add_argument("--worker-cores", type=int, default=16)
    ap.add_argument("--worker-nic-gbps", type=float, default=25)
    ap.add_argument("--hub-egress-gbps", type=float, default=10, help="the hub's total egress to all workers")
    ap.add_argument("--store-ingress-gbps", type=float, default=100)
    ap.add_argument("--put-rate", type=float, default=3500, help="PUT/s per prefix (S3's documented figure)")
    ap.add_argument("--gpu-slots-per-worker", type=int, default=1)
    ap.add_argument("--runs-per-worker", type=int, default=2)
    ap.add_argument("--upload-as", choices=("modelyard", "boto3"), default="modelyard",
                    help="the measured upload rate to use: modelyard's (one stream) or boto3 upload_file's (10 threads)")
    ap.add_argument("--workers", default="1,2,4,6,8,12,16,24,32,48,64")
    ap.add_argument("--loads", default="1000,2000,4000,8000,16000",
                    help="checkpoints/day for the second table: the fewest workers for each, and what saturates")
    ap.add_argument("--days", type=int, default=3)
    ap.add_argument("--dt", type=float, default=5.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path, help="also write the results here")
    a = ap.parse_args()
    inp = Inputs.load(a.inputs, a)
    size = a.mean_gb * 1e9
    stages = inp.alone(size)
    print(f"scenario: {a.per_day:.0f} checkpoints/day, mean {a.mean_gb:.0f} GB (log-normal sigma {a.size_sigma}), "
          f"{a.worker_cores} cores and {a.worker_nic_gbps:g} Gbit/s per worker, {a.runs_per_worker} runs and "
          f"{a.gpu_slots_per_worker} GPU slot(s) per worker, hub egress {a.hub_egress_gbps:g} Gbit/s, bucket "
          f"{a.store_ingress_gbps:g} Gbit/s and {a.put_rate:.0f} PUT/s; upload at {a.upload_as}'s measured rate")
    print(f"one {a.mean_gb:.0f} GB checkpoint alone on one worker (measured rates): "
          + ", ".join(f"{k} {v:.0f} s" for k, v in stages.items()) + f"; total {sum(stages.values()):.0f} s")
    need = a.per_day * size / DAY
    print(f"the day's bytes: {a.per_day * size / 1e12:.0f} TB in and out, {need / 1e6:.0f} MB/s on average "
          f"({need * 8 / 1e9:.2f} Gbit/s), {a.per_day * size / PART / DAY:.1f} PUT/s")
    rows = []
    print(f"\n{'workers':>7} {'done/day':>9} {'backlog':>8} {'p50 h':>6} {'p95 h':>6}  "
          + " ".join(f"{k:>13}" for k in ("workers", "hub egress", "GPU slots", "store ingress", "PUT rate"))
          + "  sustained  bottleneck")
    first = None
    for n in (int(x) for x in a.workers.split(",")):
        r = simulate(inp, n, a.per_day, a.mean_gb, a.size_sigma, a.days, a.dt, a.seed)
        per_day = r.completed / (a.days - 1)
        print(f"{n:>7} {per_day:>9.0f} {r.backlog_end:>8} {r.latency_p50_h:>6.2f} {r.latency_p95_h:>6.2f}  "
              + " ".join(f"{r.util[k]:>12.0%} " for k in ("workers", "hub egress", "GPU slots", "store ingress", "PUT rate"))
              + f"  {'yes' if r.sustained else 'no':>9}  {r.bottleneck}")
        rows.append({"workers": n, "completed_per_day": per_day, "backlog_end": r.backlog_end,
                     "latency_p50_h": r.latency_p50_h, "latency_p95_h": r.latency_p95_h, "utilization": r.util,
                     "sustained": r.sustained, "bottleneck": r.bottleneck})
        if r.sustained and first is None:
            first = n
    print(f"\nfewest workers that sustain {a.per_day:.0f}/day: {first if first else 'none of those tried'}")
    print(f"\n{'per day':>8} {'TB/day':>7} {'fewest workers':>15} {'p95 h':>6}  busiest shared resource at that N "
          "(or, when no N sustains, what saturates)")
    loads = []
    for load in (float(x) for x in a.loads.split(",")):
        found, last = None, None
        for n in (int(x) for x in a.workers.split(",")):
            last = simulate(inp, n, load, a.mean_gb, a.size_sigma, a.days, a.dt, a.seed)
            if last.sustained:
                found = last
                break
        r = found or last
        shared = {k: v for k, v in r.util.items() if k != "workers"}
        top = max(shared, key=shared.get)
        print(f"{load:>8.0f} {load * size / 1e12:>7.0f} {str(found.workers) if found else 'none':>15} "
              f"{r.latency_p95_h:>6.2f}  {top} {shared[top]:.0%}")
        loads.append({"per_day": load, "fewest": found.workers if found else None, "latency_p95_h": r.latency_p95_h,
                      "busiest_shared": top, "busiest_shared_util": shared[top], "utilization": r.util})
    if a.json:
        a.json.write_text(json.dumps({"scenario": {k: v for k, v in vars(a).items() if k not in ("inputs", "json")},
                                      "inputs": inp.__dict__, "alone_s": stages, "rows": rows, "fewest": first,
                                      "loads": loads}, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
