"""Refusing a bad hub source: ``modelyard ingest`` against ``modelyard verify`` of the same source.

    .venv/bin/python benchmarks/preflight.py [--rounds 5]

Baseline: ``modelyard verify hf://...`` (no Prefect), the command that asks the hub and refuses in seconds.
Target: ``ingest`` refuses each bad source within 1.5x verify's time (its preflight runs before Prefect is
imported; ``modelyard/cli/ingest.py`` ``_precheck``).

A local hub (olah over git+LFS repos, behind the tests' ``HubProxy``, which answers a gated repo as the Hub
does) serves a tiny Llama. Three bad sources, each refused by both commands with the same error type and exit
code (checked on every run, else the script fails):

- **gated**: ``hf://org/tiny@main`` answered 401 GatedRepo, no token;
- **missing revision**: ``hf://org/tiny@no-such-branch``;
- **refused license**: ``hf://org/carded@main`` (card license cc-by-nc-4.0) with ``--refuse-license CC-BY-NC-4.0``.

The rounds are interleaved (verify, ingest, verify, ingest, ...) so that a change in the machine's load hits
both; each command runs in a fresh interpreter with its own MODELYARD_HOME. Printed per case: the median
seconds of each (and the spread), the ratio of the medians, and the load average when the run started and
ended. Results go to ``benchmarks/results/preflight.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.e2e.hub_proxy import HubProxy  # noqa: E402 - the repository root is put on sys.path first
from tests.e2e.olah_hub import OlahServer, git_lfs_available, make_lfs_repo  # noqa: E402
from tests.fixtures import make_tiny_llama  # noqa: E402

PY = ROOT / ".venv" / "bin" / "python"
TARGET = 1.5
CASES = {
    "gated": ("hf://org/tiny@main", ()),
    "missing revision": ("hf://org/tiny@no-such-branch", ()),
    "refused license": ("hf://org/carded@main", ("--refuse-license", "CC-BY-NC-4.0")),
}


def run(command: str, source: str, extra: tuple[str, ...], env: dict[str, str]) -> tuple[float, int, str]:
    """(seconds, exit code, error type) of one ``modelyard <command> SOURCE --json`` in a fresh interpreter."""
    with tempfile.TemporaryDirectory(prefix="preflight-home-") as home:
        args = [str(PY), "-m", "modelyard", command, source, *extra, "--json"]
        if command == "ingest":
            args.append("--no-smoke")
        t0 = time.perf_counter()
        p = subprocess.run(args, env={**env, "MODELYARD_HOME": home}, capture_output=True, text=True, timeout=600)
        seconds = time.perf_counter() - t0
    try:
        error = (json.loads(p.stdout).get("error") or {}).get("type", "")
    except ValueError:
        error = f"(no JSON: {p.stderr.strip()[-300:]})"
    return seconds, p.returncode, error


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    if not git_lfs_available():
        print("git-lfs is missing (apt-get install git-lfs): the local hub cannot be built", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="preflight-hub-") as tmp:
        mirrors = Path(tmp) / "mirrors"
        model = make_tiny_llama(Path(tmp) / "src" / "tiny")
        files = {p.name: p.read_bytes() for p in model.iterdir()}
        make_lfs_repo(mirrors, "org", "tiny", [{**files, "README.md": b"# tiny\n"}])
        make_lfs_repo(mirrors, "org", "carded", [{**files, "README.md": b"---\nlicense: cc-by-nc-4.0\n---\n# carded\n"}])
        load_before = os.getloadavg()
        with OlahServer(mirrors) as server, HubProxy(server.endpoint) as proxy:
            proxy.gated = {"org/tiny"}
            env = {**os.environ, "HF_ENDPOINT": proxy.endpoint, "HF_TOKEN": "", "MODELYARD_HF_TOKEN": ""}
            env.pop("PREFECT_API_URL", None)
            times: dict[str, dict[str, list[float]]] = {c: {"verify": [], "ingest": []} for c in CASES}
            refused: dict[str, tuple[int, str]] = {}
            for case, (source, extra) in CASES.items():
                proxy.gated = {"org/tiny"} if case == "gated" else set()
                for _ in range(a.rounds):
                    seen = {}
                    for command in ("verify", "ingest"):
                        seconds, code, error = run(command, source, extra, env)
                        times[case][command].append(seconds)
                        seen[command] = (code, error)
                    if seen["verify"] != seen["ingest"] or seen["verify"][0] == 0:
                        print(f"{case}: verify and ingest disagree or accept it: {seen}", file=sys.stderr)
                        return 1
                    refused[case] = seen["verify"]
        load_after = os.getloadavg()
    rows = []
    print(f"load average (1, 5, 15 min): {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f} at the start, "
          f"{load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f} at the end; {a.rounds} interleaved rounds")
    print(f"{'case':18} {'verify s (median, min-max)':>28} {'ingest s (median, min-max)':>28} {'ingest/verify':>14}  "
          "both refused with")
    worst = 0.0
    for case, t in times.items():
        v, i = statistics.median(t["verify"]), statistics.median(t["ingest"])
        ratio = i / v
        worst = max(worst, ratio)
        code, error = refused[case]
        rows.append({"case": case, "verify_s": t["verify"], "ingest_s": t["ingest"], "ratio": round(ratio, 3),
                     "exit_code": code, "error": error})
        print(f"{case:18} {v:10.2f} ({min(t['verify']):.2f}-{max(t['verify']):.2f}){'':7} "
              f"{i:10.2f} ({min(t['ingest']):.2f}-{max(t['ingest']):.2f}){'':7} {ratio:13.2f}x  {error} (exit {code})")
    print(f"worst ratio {worst:.2f}x against the target <= {TARGET}x: {'met' if worst <= TARGET else 'NOT met'}")
    out = ROOT / "benchmarks" / "results" / "preflight.json"
    out.write_text(json.dumps({"rounds": a.rounds, "load_before": load_before, "load_after": load_after,
                               "cases": rows, "worst_ratio": round(worst, 3), "target": TARGET}, indent=2) + "\n")
    return 0 if worst <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
