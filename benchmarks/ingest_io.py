"""Bytes read per byte of model over a whole ``modelyard ingest`` (no quantization, no smoke), for a
``file://`` source and for an ``hf://`` source.

    .venv/bin/python benchmarks/ingest_io.py [--model DIR] [--only file|hf] [--keep]

Takes the demo model (SmolLM2-135M-Instruct as a safetensors folder: ``--model``, else the
``model/`` of an artifact under ``/tmp/demo-store``, else one made with ``modelyard demo``) and runs,
each as a child process with a fresh store (``--out``):

1. **baseline**: ``modelyard ingest file://<tiny>`` where ``<tiny>`` holds the same tokenizer,
   chat template and generation config, and a 1-layer, hidden-size-8 Llama (``model.safetensors``
   of about 0.8 MB). It does everything a real ingest does (imports, Prefect's ephemeral API,
   reading tokenizer.json, checks, report, publish) except read a big model;
2. **ingest**: ``modelyard ingest file://<demo model> --no-smoke --out <fresh store>``;
3. **again**: the same command into the same store: the digest cache answers, the artifact is
   reused, nothing is republished.

The figure of merit is ``(rchar - rchar_baseline) / (model bytes - tiny model bytes)``: bytes that
the ingest read *because of the model*, per byte of model (target <= 1.05).

Counters, from ``/proc/<pid>/io``:

- ``rchar``: bytes passed through read()-family syscalls (read, pread, readv, sendfile,
  copy_file_range...), page-cache hits included. It does not depend on the cache state, so it is the
  number to compare against the model size.
- ``read_bytes``: bytes the block layer actually fetched from disk for this process. On a warm page
  cache (the demo model was just written or read) it is ~0, so it says nothing about how many times
  the pipeline reads the weights; it is printed for completeness. Reads through mmap count here (on a
  miss), never in rchar.
- ``syscr``: the number of read syscalls.

How the tree is summed: Linux adds a reaped child's counters into its parent's (``wait_task_zombie``),
so the benchmark's own ``/proc/self/io`` delta around ``subprocess.run`` is the exact total of the
whole tree (every descendant that its parent reaped). That is the number used. Summing the last polled
values of every pid would count children twice. The script also polls ``/proc/<pid>/io`` of the child
and all its descendants every 50 ms, and prints the last value seen per process (by command), to show
who read what; a process that lives less than 50 ms is not listed there (it is still in the total).

For a ``file://`` source the hash stage copies each file into staging while it hashes it
(``hash_snapshot_counted(..., copy_to=...)``) and packaging moves those copies
(``stage_model(..., precopied=...)``), so the weights are read once; the per-stage table (the same
stage functions, in this process, called as the flow calls them) shows it.

For an ``hf://`` source (``hub_io``), the demo model and the tiny one are made git+LFS repos
(``bench/demo``, ``bench/tiny``) served by a real olah hub on 127.0.0.1 (``tests/e2e/olah_hub.py``),
and the same three runs ingest ``hf://bench/<name>@main``, each into a fresh store (so a fresh hub
cache under it). The figure is the same ``(rchar - rchar_baseline) / (model bytes - tiny bytes)``.
Bytes received from the socket are not in ``rchar`` (``recv`` is not a read-family syscall), so for
``hf://`` it counts what the ingest reads back from disk on top of receiving each byte once and
writing it once into the hub cache: the download is hashed as it is written, the hash stage reads
nothing back, packaging hard-links the cached blobs. The per-stage table calls the same stage
functions (fetch with its pre-download verify, hash, package) in this process.

Not measured: ``--smoke load``. The vLLM smoke reads the weights again (into its own process) by
design: that adds about 1.0 per byte of model on top of these numbers.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELYARD = ROOT / ".venv" / "bin" / "modelyard"
FIELDS = ("rchar", "read_bytes", "syscr")


def read_io(pid: int | str) -> dict[str, int] | None:
    try:
        with open(f"/proc/{pid}/io") as fh:
            return {k: int(v) for k, v in (line.split(":") for line in fh)}
    except (OSError, ValueError):
        return None


def children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                out += [int(c) for c in fh.read().split()]
    except OSError:
        pass
    return out


def cmdline(pid: int) -> str:
    try:
        parts = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        words = [p.decode(errors="replace") for p in parts if p]
        return " ".join(Path(w).name if i == 0 else w for i, w in enumerate(words[:4]))[:70]
    except OSError:
        return "?"


def run_measured(cmd: list[str], env: dict[str, str]) -> dict:
    """Run ``cmd``; return the tree's exact io delta, wall seconds and the polled per-process values."""
    polled: dict[int, dict] = {}
    before = read_io("self")
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            todo, seen = [proc.pid], set()
            while todo:
                p = todo.pop()
                if p in seen:
                    continue
                seen.add(p)
                io = read_io(p)
                if io is not None:
                    ent = polled.setdefault(p, {"cmd": cmdline(p)})
                    ent.update(io)
                todo += children(p)
            done.wait(0.05)

    th = threading.Thread(target=poll, daemon=True)
    th.start()
    output = proc.stdout.read()
    proc.wait()
    wall = time.perf_counter() - t0
    done.set()
    th.join()
    after = read_io("self")
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{output.decode(errors='replace')[-3000:]}")
    return {"delta": {k: after[k] - before[k] for k in FIELDS}, "wall": wall, "polled": polled, "root": proc.pid,
            "output": output.decode(errors="replace")}


def find_model(arg: str | None, tmp: Path) -> Path:
    if arg:
        return Path(arg).resolve()
    for m in sorted(glob.glob("/tmp/demo-store/*/*/model")):
        if (Path(m) / "model.safetensors").is_file():
            return Path(m)
    out = tmp / "demo"
    subprocess.run([str(MODELYARD), "demo", "--out", str(out)], check=True)
    return Path(sorted(glob.glob(f"{out}/**/model.safetensors", recursive=True))[0]).parent


def make_tiny(src: Path, dst: Path) -> None:
    """The demo model's non-weight files, with a 1-layer hidden-size-8 Llama of the same vocabulary."""
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.is_file() and f.name not in ("config.json",) and not f.name.endswith(".safetensors"):
            shutil.copyfile(f, dst / f.name)
    cfg = json.loads((src / "config.json").read_text())
    h, inter, vocab = 8, 16, cfg["vocab_size"]
    cfg.update(hidden_size=h, intermediate_size=inter, num_hidden_layers=1, num_attention_heads=1,
               num_key_value_heads=1, head_dim=h, tie_word_embeddings=True)
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    shapes = {"model.embed_tokens.weight": [vocab, h], "model.norm.weight": [h],
              "model.layers.0.input_layernorm.weight": [h], "model.layers.0.post_attention_layernorm.weight": [h],
              "model.layers.0.mlp.down_proj.weight": [h, inter], "model.layers.0.mlp.gate_proj.weight": [inter, h],
              "model.layers.0.mlp.up_proj.weight": [inter, h], "model.layers.0.self_attn.k_proj.weight": [h, h],
              "model.layers.0.self_attn.o_proj.weight": [h, h], "model.layers.0.self_attn.q_proj.weight": [h, h],
              "model.layers.0.self_attn.v_proj.weight": [h, h]}
    header: dict = {"__metadata__": {"format": "pt"}}
    off, blobs = 0, []
    for name, shape in sorted(shapes.items()):
        n = 1
        for d in shape:
            n *= d
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [off, off + 2 * n]}
        blobs.append(b"\x0a\x3c" * n)  # bf16 ~0.0084: finite, non-zero
        off += 2 * n
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    with open(dst / "model.safetensors", "wb") as fh:
        fh.write(struct.pack("<Q", len(hb)) + hb)
        for b in blobs:
            fh.write(b)


def attribute(model: Path, tmp: Path) -> list[tuple[str, int]]:
    """rchar of this process around the stage functions that the hash, verify and package tasks call."""
    sys.path.insert(0, str(ROOT))
    from modelyard.artifact.draft import stage_model
    from modelyard.checks import Target
    from modelyard.model import digest as hashing
    from modelyard.model.source import parse_source
    from modelyard.settings import Settings
    from modelyard.stages import fetch, verify

    settings = Settings(home=tmp / "attr-store")
    rows = []
    a = read_io("self")["rchar"]
    snap = fetch.fetch(parse_source(f"file://{model}"), settings)
    b = read_io("self")["rchar"]
    rows.append(("fetch (file://: list the folder)", b - a))
    # as the ingest flow does for a file:// source: copy each file into staging while hashing it
    precopy = tmp / "attr-precopy" / "model"
    snap, _ = hashing.hash_snapshot_counted(snap, cache=hashing.DigestCache.under(settings), copy_to=precopy,
                                            link_from=(settings.cache_dir(),))
    c = read_io("self")["rchar"]
    rows.append(("hash (hash_snapshot_counted, empty digest cache, copy_to: copies while hashing)", c - b))
    verify.verify_folder(snap.root, Target.create())  # the first call imports its libraries: not counted
    c = read_io("self")["rchar"]
    verify.verify_folder(snap.root, Target.create())
    d = read_io("self")["rchar"]
    rows.append(("verify (verify_folder, second call)", d - c))
    (tmp / "attr-staging").mkdir()
    stage_model(snap, tmp / "attr-staging", link_from=(settings.cache_dir(),), precopied=precopy)
    e = read_io("self")["rchar"]
    rows.append(("package (stage_model, precopied: moves the hash stage's copies)", e - d))
    return rows


def folder_bytes(p: Path) -> int:
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


def table(rows: list[tuple[str, dict]], extra: int) -> float:
    """Print the load average and the runs' table (the first row is the baseline); returns the first
    non-baseline ratio."""
    print(f"load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs\n")
    base = rows[0][1]
    print("| run | wall s | rchar MB | read_bytes MB | syscr | (rchar - baseline) / model bytes |")
    print("|---|---|---|---|---|---|")
    for label, r in rows:
        d = r["delta"]
        ratio = "" if r is base else f"{(d['rchar'] - base['delta']['rchar']) / extra:.3f}"
        print(f"| {label} | {r['wall']:.1f} | {d['rchar'] / 1e6:.1f} | {d['read_bytes'] / 1e6:.1f} | "
              f"{d['syscr']:,} | {ratio} |")
    return (rows[1][1]["delta"]["rchar"] - base["delta"]["rchar"]) / extra


def stage_table(title: str, rows: list[tuple[str, int]], m_bytes: int) -> None:
    print(f"\n{title}:\n")
    print("| stage | rchar MB | per byte of model |")
    print("|---|---|---|")
    for label, n in rows:
        print(f"| {label} | {n / 1e6:.1f} | {n / m_bytes:.3f} |")


def print_polled(run: dict) -> None:
    print("\npolled per process, first ingest (last value seen; a parent's includes its reaped children):")
    for pid, e in sorted(run["polled"].items()):
        print(f"  pid {pid}{' (root)' if pid == run['root'] else ''}: rchar {e.get('rchar', 0) / 1e6:.1f} MB, "
              f"read_bytes {e.get('read_bytes', 0) / 1e6:.1f} MB, syscr {e.get('syscr', 0):,}: {e['cmd']}")


def file_io(model: Path, tiny: Path, tmp: Path, env: dict[str, str]) -> None:
    """The ``file://`` figure (module doc)."""
    m_bytes, t_bytes = folder_bytes(model), folder_bytes(tiny)
    ing = lambda src, store: [str(MODELYARD), "ingest", f"file://{src}", "--no-smoke", "--store", str(store), "--json"]  # noqa: E731
    # warm-up, not counted: first-run effects (pyc compilation, Prefect DB migrations)
    run_measured(ing(tiny, tmp / "store-warmup"), env)
    base = run_measured(ing(tiny, tmp / "store-base"), env)
    first = run_measured(ing(model, tmp / "store"), env)
    again = run_measured(ing(model, tmp / "store"), env)

    print("## file://\n")
    print(f"model: {model}")
    print(f"model bytes: {m_bytes:,} ({m_bytes / 1e6:.1f} MB); baseline (tiny model) bytes: {t_bytes:,}")
    r1 = table([("baseline: ingest of the tiny model", base), ("ingest --no-smoke, fresh store", first),
                ("same ingest again, same store", again)], m_bytes - t_bytes)
    print(f"\nbytes read per byte of model, first ingest: {r1:.3f} (target <= 1.05: "
          f"{'met' if r1 <= 1.05 else 'MISSED'})")
    stage_table("where the first ingest's model reads come from (the same stage functions, in this process)",
                attribute(model, tmp), m_bytes)
    print_polled(first)


def hub_attribute(endpoint: str, tmp: Path) -> list[tuple[str, int]]:
    """rchar of this process around the stage functions the fetch, hash and package tasks call for
    ``hf://bench/demo@main`` (fresh hub cache), with the pre-download verify the flow passes to fetch."""
    sys.path.insert(0, str(ROOT))
    from modelyard.artifact.draft import stage_model
    from modelyard.checks import Target
    from modelyard.model import digest as hashing
    from modelyard.model.source import parse_source
    from modelyard.settings import Settings
    from modelyard.stages import fetch, verify

    settings = Settings(home=tmp / "hub-attr", hf_endpoint=endpoint)
    verify.verify_folder(tmp / "tiny", Target.create())  # imports, not counted
    a = read_io("self")["rchar"]
    snap = fetch.fetch(parse_source("hf://bench/demo@main"), settings,
                       before_weights=lambda s: verify.gate(verify.verify_folder(s.root, Target.create()), s.source))
    b = read_io("self")["rchar"]
    snap, hashed = hashing.hash_snapshot_counted(snap, cache=hashing.DigestCache.under(settings),
                                                 link_from=(settings.cache_dir(),))
    c = read_io("self")["rchar"]
    (tmp / "hub-staging").mkdir()
    stage_model(snap, tmp / "hub-staging", link_from=(settings.cache_dir(),))
    d = read_io("self")["rchar"]
    return [("fetch (download hashing the stream; verify of config, tokenizer and shard headers before the weights)", b - a),
            (f"hash (hash_snapshot_counted; reports {hashed:,} bytes read)", c - b),
            ("package (stage_model: hard links from the hub cache)", d - c)]


def hub_io(model: Path, tiny: Path, tmp: Path, env: dict[str, str]) -> None:
    """The ``hf://`` figure (module doc): both models served by a real olah hub."""
    sys.path.insert(0, str(ROOT))
    from tests.e2e.olah_hub import OlahServer, make_lfs_repo

    mirrors = tmp / "mirrors"
    for name, folder in (("tiny", tiny), ("demo", model)):
        make_lfs_repo(mirrors, "bench", name, [{p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}])
    m_bytes, t_bytes = folder_bytes(model), folder_bytes(tiny)
    with OlahServer(mirrors) as hub:
        e = {**env, "HF_ENDPOINT": hub.endpoint}
        ing = lambda repo, store: [str(MODELYARD), "ingest", f"hf://bench/{repo}@main", "--no-smoke",  # noqa: E731
                                   "--store", str(store), "--json"]
        run_measured(ing("tiny", tmp / "hub-warmup"), e)  # not counted, as for file://
        base = run_measured(ing("tiny", tmp / "hub-base"), e)
        first = run_measured(ing("demo", tmp / "hub-store"), e)
        again = run_measured(ing("demo", tmp / "hub-store"), e)
        stages = hub_attribute(hub.endpoint, tmp)
    out = json.loads(first["output"][first["output"].index("{"):])
    print("\n## hf://\n")
    print(f"hf://bench/demo@main served by olah over {model}; baseline hf://bench/tiny@main ({t_bytes:,} bytes)")
    r1 = table([("baseline: ingest of hf://bench/tiny", base), ("ingest hf://bench/demo --no-smoke, fresh store", first),
                ("same ingest again, same store", again)], m_bytes - t_bytes)
    print(f"\nbytes read back per byte downloaded, first ingest: {r1:.3f} (each byte is also received once from "
          f"the socket and written once); hash stage's hashed_bytes: {out['hashed_bytes']:,}")
    stage_table("where they come from (the same stage functions, in this process, fresh hub cache)", stages, m_bytes)
    print_polled(first)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", help="a safetensors model folder (default: the demo model)")
    ap.add_argument("--only", choices=("file", "hf"), help="measure one source kind (default: both)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary stores")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="ingest-io-"))
    try:
        model = find_model(args.model, tmp)
        tiny = tmp / "tiny"
        make_tiny(model, tiny)
        env = {k: v for k, v in os.environ.items() if k != "MODELYARD_HOME"}
        if args.only in (None, "file"):
            file_io(model, tiny, tmp, env)
        if args.only in (None, "hf"):
            hub_io(model, tiny, tmp, env)
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
