"""Structure checks never read weight bytes; their cost does not grow with the model's size in bytes.

Run: ``.venv/bin/python benchmarks/verify_structure.py [--keep DIR]``

What it builds (in a temp dir under ``$TMPDIR`` or /tmp, removed at the end unless ``--keep DIR``):

- a Llama-3.1-405B-shaped checkpoint: the real config, the real tensor names and shapes (taken from
  ``transformers.LlamaForCausalLM`` instantiated on the ``meta`` device), all BF16, split in
  ``state_dict`` order into 191 byte-balanced shards (~4.2 GB each, ~811 GB in all), with
  ``model.safetensors.index.json`` and ``generation_config.json``;
- a Llama-3.1-8B-shaped checkpoint the same way, in 4 shards (~16 GB).

Every shard is a valid safetensors file (8-byte LE header length, JSON header with contiguous
``data_offsets``) whose data section is a *hole*: the file is extended with ``truncate`` so it has its
full logical size but occupies no disk. Reading the data would return zeros, and would show up in the
byte counters below. No tokenizer is written, so the report carries ``tokenizer.files.missing`` (and
whatever follows from having no tokenizer); that is expected.

What it measures: each folder is verified in a fresh child process (so memory figures are per run) with
``verify_folder(path, Target(tensor_parallel_size=8, max_model_len=131072))``. The child records

- RSS of the bare interpreter, then RSS after ``import torch, transformers`` and modelyard (the
  *baseline*: what any process using modelyard's architecture check pays before verifying anything);
- ``/proc/self/io`` ``rchar`` (bytes returned by read() syscalls, page cache or not) and ``read_bytes``
  (bytes fetched from the block device) at the baseline and after verify;
- the wall time of ``verify_folder`` alone (``time.perf_counter``);
- peak RSS of the whole process (``VmHWM`` and ``ru_maxrss``) and RSS added by verify (peak − baseline).

The targets from the issue ("≤ 1 s and ≤ 150 MB") are compared with the verify wall time and the RSS
*added by verify*; the whole-process peak (torch + transformers included) is printed beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192}
COMMON = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256,
    "max_position_embeddings": 131072, "rope_scaling": ROPE, "rope_theta": 500000.0, "torch_dtype": "bfloat16",
    "tie_word_embeddings": False, "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009],
    "rms_norm_eps": 1e-5, "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
    "attention_dropout": 0.0, "initializer_range": 0.02, "pretraining_tp": 1, "use_cache": True,
}
MODELS = [
    # (label, shards, shape fields)
    ("Llama-3.1-8B", 4, {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                          "num_attention_heads": 32, "num_key_value_heads": 8}),
    ("Llama-3.1-405B", 191, {"hidden_size": 16384, "intermediate_size": 53248, "num_hidden_layers": 126,
                              "num_attention_heads": 128, "num_key_value_heads": 8}),
]
TP, MAX_LEN = 8, 131072
TARGET_S, TARGET_MB = 1.0, 150.0
GEN_CONFIG = {"bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "do_sample": True,
              "temperature": 0.6, "top_p": 0.9}


# --------------------------------------------------------------------------- child: one measured run

def _status_kb(key: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return -1


def _io() -> dict[str, int]:
    out = {}
    with open("/proc/self/io") as fh:
        for line in fh:
            k, v = line.split(":")
            out[k.strip()] = int(v)
    return out


def child(path: str) -> None:
    bare_kb = _status_kb("VmRSS")
    import resource

    import torch  # noqa: F401
    import transformers  # noqa: F401

    sys.path.insert(0, str(REPO))
    from modelyard.checks import Target
    from modelyard.pipeline.verify import verify_folder

    target = Target(tensor_parallel_size=TP, max_model_len=MAX_LEN)
    base_kb = _status_kb("VmRSS")
    base_hwm_kb = _status_kb("VmHWM")
    io0 = _io()
    t0 = time.perf_counter()
    report = verify_folder(path, target)
    wall = time.perf_counter() - t0
    io1 = _io()
    after_kb = _status_kb("VmRSS")
    hwm_kb = _status_kb("VmHWM")
    maxrss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    findings = [{"code": f.code, "severity": f.severity.value, "message": f.message} for f in report.findings]
    print(json.dumps({
        "wall_s": wall, "bare_rss_kb": bare_kb, "base_rss_kb": base_kb, "base_hwm_kb": base_hwm_kb,
        "after_rss_kb": after_kb, "hwm_kb": hwm_kb, "maxrss_kb": maxrss_kb,
        "rchar": io1["rchar"] - io0["rchar"], "read_bytes": io1["read_bytes"] - io0["read_bytes"],
        "syscr": io1["syscr"] - io0["syscr"],
        "codes": dict(Counter(f.code for f in report.findings)), "findings": findings,
        "passed": report.passed,
    }))


# --------------------------------------------------------------------------- parent: build + report

def tensor_shapes(cfg_dict: dict) -> list[tuple[str, tuple[int, ...]]]:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**cfg_dict)
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    return [(k, tuple(v.shape)) for k, v in model.state_dict().items()]


def split_balanced(sizes: list[int], n: int) -> list[list[int]]:
    """Contiguous split of indices into exactly ``n`` non-empty groups, cutting where the running byte
    total crosses k·total/n (each tensor goes to the group its midpoint falls in)."""
    if len(sizes) < n:
        raise ValueError(f"{len(sizes)} tensors cannot fill {n} shards")
    total = sum(sizes)
    groups: list[list[int]] = [[] for _ in range(n)]
    pos, g = 0, 0
    for i, s in enumerate(sizes):
        want = min(n - 1, int((pos + s / 2) * n // total))
        left = len(sizes) - i  # tensors still to place, this one included
        g = max(g, min(want, n - left))  # never go backwards, never leave later groups unfillable
        if g < n - 1 and groups[g] and left <= n - 1 - g:
            g += 1
        groups[g].append(i)
        pos += s
    if any(not grp for grp in groups):
        raise AssertionError("empty shard")
    return groups


def write_shard(path: Path, tensors: list[tuple[str, tuple[int, ...]]]) -> int:
    header: dict = {"__metadata__": {"format": "pt"}}
    off = 0
    for name, shape in tensors:
        n = 2
        for d in shape:
            n *= d
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # pad to 8 bytes like safetensors does (spaces are valid JSON)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw)
        fh.truncate(8 + len(raw) + off)  # the data section is a hole
    return off


def build(root: Path, label: str, shards: int, shape: dict) -> dict:
    cfg = {**COMMON, **shape, "head_dim": shape["hidden_size"] // shape["num_attention_heads"]}
    cfg["transformers_version"] = __import__("transformers").__version__
    folder = root / label
    folder.mkdir(parents=True)
    t0 = time.perf_counter()
    tensors = tensor_shapes({k: v for k, v in cfg.items() if k not in ("architectures", "model_type",
                                                                        "transformers_version")})
    t_meta = time.perf_counter() - t0
    sizes = []
    for _, s in tensors:
        n = 2
        for d in s:
            n *= d
        sizes.append(n)
    weight_map, total = {}, 0
    for k, grp in enumerate(split_balanced(sizes, shards), 1):
        name = f"model-{k:05d}-of-{shards:05d}.safetensors"
        part = [tensors[i] for i in grp]
        total += write_shard(folder / name, part)
        weight_map.update({t: name for t, _ in part})
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    (folder / "generation_config.json").write_text(json.dumps(GEN_CONFIG, indent=2))
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    disk = sum(p.stat().st_blocks * 512 for p in folder.iterdir())
    logical = sum(p.stat().st_size for p in folder.iterdir())
    return {"label": label, "path": folder, "shards": shards, "tensors": len(tensors), "model_bytes": total,
            "disk_bytes": disk, "logical_bytes": logical, "meta_s": t_meta, "build_s": time.perf_counter() - t0}


def sparse_ok(root: Path) -> bool:
    p = root / "sparse_probe"
    with open(p, "wb") as fh:
        fh.write(b"x")
        fh.truncate(1 << 30)
    ok = p.stat().st_size == 1 << 30 and p.stat().st_blocks * 512 < (1 << 20)
    p.unlink()
    return ok


def machine() -> str:
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    import torch
    import transformers
    return (f"{cpu}, nproc {os.cpu_count()} (affinity {len(os.sched_getaffinity(0))}), "
            f"Python {platform.python_version()}, torch {torch.__version__}, transformers {transformers.__version__}")


def measure(path: Path) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--child", str(path)], capture_output=True, text=True,
                          cwd=REPO, timeout=300)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        raise SystemExit(f"child failed for {path} (exit {proc.returncode})")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keep", metavar="DIR", help="build the checkpoints in DIR and keep them")
    ap.add_argument("--child", metavar="PATH", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child)
        return 0

    t_start = time.perf_counter()
    if args.keep:
        root = Path(args.keep).resolve()
        root.mkdir(parents=True, exist_ok=True)
        if any(root.iterdir()):
            print(f"--keep {root}: the folder is not empty", file=sys.stderr)
            return 2
    else:
        root = Path(tempfile.mkdtemp(prefix="modelyard-verify-structure-"))
    try:
        if not sparse_ok(root):
            print(f"{root}: this filesystem does not support sparse files (a 1 GiB hole used real blocks); "
                  "run with TMPDIR or --keep on ext4/xfs/btrfs/tmpfs", file=sys.stderr)
            return 2
        print(f"machine: {machine()}")
        print(f"target:  Target(tensor_parallel_size={TP}, max_model_len={MAX_LEN})")
        print(f"folders: {root}{'' if args.keep else ' (removed at the end)'}")
        built = [build(root, label, n, shape) for label, n, shape in MODELS]
        for b in built:
            print(f"built {b['label']}: {b['shards']} shards, {b['tensors']} tensors, "
                  f"{b['logical_bytes'] / 1e9:.1f} GB logical, {b['disk_bytes'] / 1e6:.1f} MB on disk "
                  f"(meta instantiation {b['meta_s']:.2f} s, build {b['build_s']:.2f} s)")
        runs = {b["label"]: measure(b["path"]) for b in built}

        print()
        cols = ["checkpoint", "shards", "tensors", "model GB", "verify s", "peak RSS MB", "+RSS MB",
                "read MB", "read/model"]
        fmt = "{:<15} {:>6} {:>7} {:>9} {:>9} {:>11} {:>8} {:>8} {:>11}"
        print(fmt.format(*cols))
        print(fmt.format(*("-" * len(c) if i else "-" * 15 for i, c in enumerate(cols))))
        for b in built:
            r = runs[b["label"]]
            added = (r["hwm_kb"] - r["base_rss_kb"]) / 1024
            print(fmt.format(b["label"], b["shards"], b["tensors"], f"{b['model_bytes'] / 1e9:.1f}",
                             f"{r['wall_s']:.3f}", f"{r['hwm_kb'] / 1024:.0f}", f"{added:.1f}",
                             f"{r['rchar'] / 1e6:.2f}", f"{r['rchar'] / b['model_bytes']:.1e}"))
        print()
        print("columns: peak RSS = VmHWM of the whole child (interpreter + torch + transformers + modelyard + verify);")
        print("         +RSS = that peak minus RSS right before verify_folder; read = /proc/self/io rchar during verify")
        for b in built:
            r = runs[b["label"]]
            print(f"{b['label']}: bare interpreter {r['bare_rss_kb'] / 1024:.0f} MB, after importing torch+transformers"
                  f"+modelyard {r['base_rss_kb'] / 1024:.0f} MB (imports cost "
                  f"{(r['base_rss_kb'] - r['bare_rss_kb']) / 1024:.0f} MB); ru_maxrss {r['maxrss_kb'] / 1024:.0f} MB; "
                  f"read_bytes from disk {r['read_bytes']} B; {r['syscr']} read syscalls; "
                  f"RSS after verify {r['after_rss_kb'] / 1024:.0f} MB")

        small, big = (runs[label] for label, _, _ in MODELS)
        sb, bb = built
        print()
        print(f"405B / 8B: model bytes x{bb['model_bytes'] / sb['model_bytes']:.1f}, "
              f"tensors x{bb['tensors'] / sb['tensors']:.1f}, shards x{bb['shards'] / sb['shards']:.1f}; "
              f"verify wall x{big['wall_s'] / small['wall_s']:.2f}, "
              f"+RSS x{(big['hwm_kb'] - big['base_rss_kb']) / max(1, small['hwm_kb'] - small['base_rss_kb']):.2f}, "
              f"bytes read x{big['rchar'] / max(1, small['rchar']):.2f}")

        print()
        print(f"targets (issue): verify <= {TARGET_S:g} s and <= {TARGET_MB:g} MB (RSS added by verify)")
        for b in built:
            r = runs[b["label"]]
            added = (r["hwm_kb"] - r["base_rss_kb"]) / 1024
            ws = "PASS" if r["wall_s"] <= TARGET_S else "MISS"
            ms = "PASS" if added <= TARGET_MB else "MISS"
            wp = "PASS" if r["hwm_kb"] / 1024 <= TARGET_MB else "MISS"
            print(f"  {b['label']:<15} wall {r['wall_s']:.3f} s {ws}; +RSS {added:.1f} MB {ms}; "
                  f"whole-process peak {r['hwm_kb'] / 1024:.0f} MB ({wp} against {TARGET_MB:g} MB: "
                  f"importing torch+transformers alone is {(r['base_rss_kb'] - r['bare_rss_kb']) / 1024:.0f} MB)")
            no_bytes = r["rchar"] < 64 * 1024 * 1024 and r["rchar"] / b["model_bytes"] < 1e-3
            print(f"  {'':<15} weight bytes read: {'none beyond headers' if no_bytes else 'YES'} "
                  f"({r['rchar']} B read vs {b['model_bytes']} B of tensor data)")

        print()
        print("findings (no tokenizer is written, so tokenizer.files.missing and its consequences are expected):")
        for b in built:
            r = runs[b["label"]]
            print(f"  {b['label']}: passed={r['passed']} " + ", ".join(f"{c} x{n}" for c, n in sorted(r["codes"].items())))
            for f in r["findings"]:
                print(f"    [{f['severity']}] {f['code']}: {f['message'][:200]}")
        print(f"\ntotal {time.perf_counter() - t_start:.1f} s")
        return 0
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
