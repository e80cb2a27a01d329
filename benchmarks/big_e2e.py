"""A 10 GB-class checkpoint end to end, as a user runs it, against the sum of its parts run by hand, in one run.

Run: ``.venv/bin/python benchmarks/big_e2e.py [--sizes 1GiB,10GiB] [--keep DIR]`` (about 40 min for both sizes
on 2 cores; needs about 7x the largest size of free disk under ``$TMPDIR`` or /tmp; the numbers are in
benchmarks/README.md).

What it builds, per size:

- a synthetic Llama checkpoint: the tiny test model's config and tokenizer with a Llama-3-8B layer shape
  (hidden 4096, intermediate 14336, 32 heads, 8 KV heads) and as many layers as the size holds; every tensor
  name and shape is ``transformers.LlamaForCausalLM``'s (instantiated on the meta device), BF16, in shards of
  about 512 MiB with ``model.safetensors.index.json``; the bytes are random (zstd cannot shrink them: the bundle
  steps are not flattered);
- a git+LFS repository of it served by olah (the local HF-compatible endpoint of the tests), a ``moto_server``
  S3 and a bucket, all on 127.0.0.1.

modelyard, as a user runs it (each a CLI process; a fresh HF cache and a fresh store):
``ingest hf://org/big@main --no-smoke``, ``bundle``, ``unbundle -o``, ``publish --to s3://``, ``pull s3://``.

The same work by hand: huggingface_hub's ``snapshot_download`` of the repo (what ``hf download`` does),
``sha256sum`` of every file, ``tar | zstd -3 -T0`` of the artifact folder and ``zstd -d | tar -x`` back, and boto3's
``upload_file`` / ``download_file`` of every file with ``TransferConfig(max_concurrency=10, 16 MiB parts)``
(the TransferManager ``aws s3 cp`` uses).

Memory: each command's process tree is polled every 0.1 s (``/proc/PID/status`` VmRSS of every process in
it, Prefect's API server and the runtime oracle included); the peak of the largest process and of the tree's
sum are printed per command and per size, so a peak that grows with the checkpoint shows as such.
"""

from __future__ import annotations

import argparse
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

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

MiB, GiB = 1 << 20, 1 << 30
SHAPE = {"hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8,
         "head_dim": 128}
SHARD_BYTES = 512 * MiB  # olah reads a whole file into memory per request: bigger shards time out


def _size(text: str) -> int:
    for unit, mult in (("GiB", GiB), ("MiB", MiB)):
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * mult)
    return int(text)


# --------------------------------------------------------------------------- the checkpoint

def _tensors(cfg: dict) -> list[tuple[str, tuple[int, ...]]]:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    keep = {k: v for k, v in cfg.items() if k not in ("architectures", "model_type", "transformers_version",
                                                     "torch_dtype", "dtype")}
    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(**keep))
    return [(k, tuple(v.shape)) for k, v in model.state_dict().items()]


def _nbytes(shape: tuple[int, ...]) -> int:
    n = 2
    for d in shape:
        n *= d
    return n


def _write_shard(path: Path, tensors: list[tuple[str, tuple[int, ...]]], rng) -> int:  # noqa: ANN001
    header: dict = {"__metadata__": {"format": "pt"}}
    off = 0
    for name, shape in tensors:
        n = _nbytes(shape)
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw)
        left = off
        while left:
            k = min(left, 64 * MiB)
            fh.write(rng.bytes(k))
            left -= k
    return off


def build_checkpoint(out: Path, size: int) -> dict:
    """A synthetic Llama checkpoint of about ``size`` bytes in ``out`` (module docstring)."""
    import numpy as np

    from tests.fixtures import make_tiny_llama

    tiny = make_tiny_llama(out.parent / f"{out.name}-tiny")
    cfg = json.loads((tiny / "config.json").read_text())
    cfg.update(SHAPE, num_hidden_layers=1)
    per_layer = sum(_nbytes(s) for n, s in _tensors(cfg) if ".layers." in n)
    rest = sum(_nbytes(s) for n, s in _tensors(cfg) if ".layers." not in n)
    cfg["num_hidden_layers"] = max(1, round((size - rest) / per_layer))
    tensors = _tensors(cfg)
    out.mkdir(parents=True)
    for f in tiny.iterdir():
        if not f.name.endswith(".safetensors") and f.name != "config.json":
            shutil.copy2(f, out / f.name)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    rng = np.random.default_rng(0)
    weight_map, shard, total, k = {}, [], 0, 0
    groups: list[list[tuple[str, tuple[int, ...]]]] = []
    for t in tensors:
        if shard and sum(_nbytes(s) for _, s in shard) + _nbytes(t[1]) > SHARD_BYTES:
            groups.append(shard)
            shard = []
        shard.append(t)
    groups.append(shard)
    for k, grp in enumerate(groups, 1):
        name = f"model-{k:05d}-of-{len(groups):05d}.safetensors"
        total += _write_shard(out / name, grp, rng)
        weight_map.update({n: name for n, _ in grp})
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    shutil.rmtree(tiny)
    return {"layers": cfg["num_hidden_layers"], "shards": len(groups), "bytes": _folder_bytes(out)}


def _folder_bytes(p: Path) -> int:
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


def lfs_repo(mirrors: Path, src: Path) -> None:
    """``mirrors/models/org/big``: a git+LFS checkout of ``src`` (files moved in, never read into memory)."""
    from tests.e2e.olah_hub import repo_path

    repo = repo_path(mirrors, "org", "big")
    repo.mkdir(parents=True)
    env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_AUTHOR_NAME": "bench",
           "GIT_AUTHOR_EMAIL": "bench@example.invalid", "GIT_COMMITTER_NAME": "bench",
           "GIT_COMMITTER_EMAIL": "bench@example.invalid"}
    (repo / ".gitattributes").write_text("*.safetensors filter=lfs diff=lfs merge=lfs -text\n")
    for f in src.iterdir():
        shutil.move(str(f), repo / f.name)
    for args in (["init", "-q", "-b", "main"], ["lfs", "install", "--local"], ["add", "-A"],
                 ["commit", "-q", "--no-verify", "-m", "big"]):
        subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True)
    for f in repo.glob("*.safetensors"):  # disk: the checkout's copy becomes a link to the LFS object (same bytes)
        oid = subprocess.run(["git", "lfs", "pointer", f"--file={f.name}"], cwd=repo, env=env, check=True,
                             capture_output=True, text=True).stdout.split("sha256:")[1].split()[0]
        f.unlink()
        os.link(repo / ".git" / "lfs" / "objects" / oid[:2] / oid[2:4] / oid, f)


def _empty(endpoint: str, prefix: str) -> None:
    import boto3

    c = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    for page in c.get_paginator("list_objects_v2").paginate(Bucket="big", Prefix=prefix):
        for o in page.get("Contents", []):
            c.delete_object(Bucket="big", Key=o["Key"])


# --------------------------------------------------------------------------- measuring

def _children(pid: int) -> list[int]:
    out = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as fh:
                out += [int(c) for c in fh.read().split()]
    except OSError:
        pass
    return out


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def run(label: str, cmd: list[str] | str, env: dict | None = None, results: list | None = None) -> dict:
    """Run ``cmd`` (a list, or a shell line); record wall seconds and the tree's peak RSS (largest process, sum)."""
    peak = {"max": 0, "sum": 0}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, shell=isinstance(cmd, str), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO)
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            todo, seen, rss = [proc.pid], set(), []
            while todo:
                p = todo.pop()
                if p not in seen:
                    seen.add(p)
                    rss.append(_rss(p))
                    todo += _children(p)
            peak["max"], peak["sum"] = max(peak["max"], max(rss)), max(peak["sum"], sum(rss))
            done.wait(0.1)

    th = threading.Thread(target=poll, daemon=True)
    th.start()
    stdout, stderr = proc.communicate()
    wall = time.perf_counter() - t0
    done.set()
    th.join()
    if proc.returncode != 0:
        sys.exit(f"{label}: {cmd} failed ({proc.returncode}):\n{stdout[-2000:]}\n{stderr[-3000:]}")
    row = {"label": label, "wall": wall, "peak_max": peak["max"], "peak_sum": peak["sum"], "stdout": stdout}
    if results is not None:
        results.append(row)
    free = shutil.disk_usage(os.environ.get("TMPDIR", "/tmp")).free
    print(f"  {label}: {wall:.1f} s, peak RSS {peak['max'] / MiB:.0f} MiB (tree {peak['sum'] / MiB:.0f} MiB); "
          f"{free / 1e9:.0f} GB free after it", flush=True)
    return row


def _result(stdout: str) -> dict:
    return json.loads(stdout)["result"]


# --------------------------------------------------------------------------- one size

def one_size(root: Path, size: int) -> dict:
    from tests.e2e.olah_hub import OlahServer
    from tests.e2e.publish_servers import AWS_ENV, moto_s3

    py = str(REPO / ".venv" / "bin" / "python")
    t0 = time.perf_counter()
    facts = build_checkpoint(root / "src", size)
    print(f"checkpoint: {facts['bytes'] / 1e9:.2f} GB, {facts['layers']} layers, {facts['shards']} shards "
          f"(built in {time.perf_counter() - t0:.0f} s)", flush=True)
    lfs_repo(root / "mirrors", root / "src")
    ours: list[dict] = []
    hand: list[dict] = []
    with OlahServer(root / "mirrors", workdir=root / "olah") as hub, moto_s3(root / "moto") as s3:
        import boto3

        os.environ.update(AWS_ENV)
        env = {**os.environ, **AWS_ENV, "HF_ENDPOINT": hub.endpoint, "HF_HUB_CACHE": str(root / "hf-a"),
               "MODELYARD_HOME": str(root / "store"), "MODELYARD_S3_ENDPOINT_URL": s3,
               "HF_HUB_DISABLE_PROGRESS_BARS": "1",
               # olah answers a big file only once it has read it whole: both sides wait as long for it
               "HF_HUB_DOWNLOAD_TIMEOUT": "300", "HF_HUB_ETAG_TIMEOUT": "60"}
        boto3.client("s3", endpoint_url=s3, region_name="us-east-1").create_bucket(Bucket="big")
        my = [py, "-m", "modelyard"]
        # modelyard, as a user runs it
        r = run("ingest hf:// --no-smoke", my + ["ingest", "hf://org/big@main", "--no-smoke", "--json"], env, ours)
        art = Path(_result(r["stdout"])["artifact"])
        shutil.rmtree(root / "store" / ".cache" / "hf", ignore_errors=True)  # disk: the download, now in the artifact
        run("bundle", my + ["bundle", str(art), "-o", str(root / "big.tar.zst"), "--json"], env, ours)
        run("unbundle", my + ["unbundle", str(root / "big.tar.zst"), "-o", str(root / "unbundled"), "--json"], env, ours)
        shutil.rmtree(root / "unbundled")
        (root / "big.tar.zst").unlink()
        run("publish --to s3://", my + ["publish", str(art), "--to", "s3://big/ours", "--json"], env, ours)
        run("pull s3://", my + ["pull", "s3://big/ours", "-o", str(root / "pulled"), "--json"], env, ours)
        shutil.rmtree(root / "pulled")
        shutil.rmtree(root / "hf-a", ignore_errors=True)  # modelyard downloads into its store's cache, not here
        _empty(s3, "ours/")  # disk: moto keeps objects in temp files
        # the same work by hand
        dl = root / "hf-b"
        hand_env = {**env, "HF_HUB_CACHE": str(dl)}
        run("snapshot_download (huggingface_hub)",
            [py, "-c", "import sys; from huggingface_hub import snapshot_download; "
                       "print(snapshot_download('org/big', revision='main'))"], hand_env, hand)
        snap = next((dl / "models--org--big" / "snapshots").iterdir())
        run("sha256sum", f"cd {snap} && sha256sum -- * > /dev/null", env, hand)
        run("tar | zstd -3 -T0", f"tar -C {art} -cf - . | zstd -q -3 -T0 --check -o {root / 'hand.tar.zst'}", env, hand)
        (root / "untar").mkdir()
        run("zstd -d | tar -x", f"zstd -q -d -c {root / 'hand.tar.zst'} | tar -C {root / 'untar'} -xf -", env, hand)
        shutil.rmtree(root / "untar")
        (root / "hand.tar.zst").unlink()
        shutil.rmtree(dl)
        transfer = ("import sys, boto3, pathlib; from boto3.s3.transfer import TransferConfig; "
                    "c = boto3.client('s3', endpoint_url=sys.argv[1]); "
                    "cfg = TransferConfig(max_concurrency=10, multipart_chunksize=16 << 20, multipart_threshold=16 << 20); "
                    "art = pathlib.Path(sys.argv[2]); down = pathlib.Path(sys.argv[3]); "
                    "files = [p for p in sorted(art.rglob('*')) if p.is_file()]; ")
        run("boto3 upload_file", [py, "-c", transfer + "[c.upload_file(str(p), 'big', 'hand/' + p.relative_to(art)"
                                  ".as_posix(), Config=cfg) for p in files]", s3, str(art), ""], env, hand)
        run("boto3 download_file", [py, "-c", transfer + "[(down / p.relative_to(art)).parent.mkdir(parents=True, "
                                    "exist_ok=True) or c.download_file('big', 'hand/' + p.relative_to(art).as_posix(), "
                                    "str(down / p.relative_to(art)), Config=cfg) for p in files]", s3, str(art),
                                    str(root / "boto3-down")], env, hand)
        shutil.rmtree(root / "boto3-down")
        _empty(s3, "hand/")
    return {"size": facts["bytes"], "facts": facts, "ours": ours, "hand": hand}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1GiB,10GiB", help="checkpoint sizes, comma-separated (MiB/GiB suffixes)")
    ap.add_argument("--keep", default=None, help="work in this folder and keep it (default: a temp folder)")
    args = ap.parse_args()
    runs = []
    for text in args.sizes.split(","):
        size = _size(text)
        base = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="modelyard-big-",
                                                                       dir=os.environ.get("TMPDIR", "/tmp")))
        root = base / text
        try:
            print(f"== {text} ({os.cpu_count()} CPUs)", flush=True)
            runs.append(one_size(root, size))
        finally:
            if not args.keep:
                shutil.rmtree(base, ignore_errors=True)
    print()
    for r in runs:
        ours = sum(x["wall"] for x in r["ours"])
        hand = sum(x["wall"] for x in r["hand"])
        gb = r["size"] / 1e9
        print(f"{gb:.2f} GB: modelyard {ours:.0f} s, parts by hand {hand:.0f} s, ratio {ours / hand:.2f}; "
              f"peak RSS modelyard {max(x['peak_max'] for x in r['ours']) / MiB:.0f} MiB "
              f"(tree {max(x['peak_sum'] for x in r['ours']) / MiB:.0f} MiB), "
              f"by hand {max(x['peak_max'] for x in r['hand']) / MiB:.0f} MiB")
        for x in r["ours"] + r["hand"]:
            print(f"  {x['label']:<38} {x['wall']:7.1f} s  {gb / x['wall'] * 1e3:6.0f} MB/s  "
                  f"peak {x['peak_max'] / MiB:6.0f} MiB  tree {x['peak_sum'] / MiB:6.0f} MiB")
    if len(runs) > 1:
        small, big = runs[0], runs[-1]
        grow = max(x["peak_max"] for x in big["ours"]) / max(x["peak_max"] for x in small["ours"])
        print(f"peak RSS at {big['size'] / 1e9:.1f} GB / at {small['size'] / 1e9:.1f} GB: {grow:.2f}x "
              f"for {big['size'] / small['size']:.1f}x the bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
