"""What a command imports before it answers: bad ingest input fails before Prefect is imported, and a
``verify`` whose checks need neither torch nor transformers does not import them. Observed through
``python -X importtime`` on the real CLI (one line per imported module on stderr), never timed: the
speed itself is measured in ``benchmarks/everyday.py``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, json_error


def _imports(*args: str, env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess, set[str]]:
    """Run ``python -X importtime -m modelyard ARGS``; returns the process (stderr without the import
    lines) and the top-level names of every module it imported. The command asks no facts worker (the suite's
    session worker is dropped from its environment): what it imports is what it imports on its own."""
    e = {k: v for k, v in {**os.environ, **(env or {})}.items() if k != "MODELYARD_FACTS_WORKER"}
    p = subprocess.run([sys.executable, "-X", "importtime", "-m", "modelyard", *args], capture_output=True,
                       text=True, cwd=ROOT, env=e, timeout=300)
    mods, rest = set(), []
    for line in p.stderr.splitlines():
        if line.startswith("import time:"):
            name = line.rsplit("|", 1)[-1].strip()
            if name != "imported package":
                mods.add(name.split(".")[0])
        else:
            rest.append(line)
    p.stderr = "\n".join(rest) + ("\n" if rest else "")
    return p, mods


def _store_is_empty(store: Path) -> bool:
    return not store.exists() or not any(store.iterdir())


def test_ingest_of_a_folder_without_config_fails_before_prefect(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    p, mods = _imports("ingest", f"file://{empty}", "--no-smoke", "--store", str(tmp_path / "store"))
    assert (p.returncode, p.stdout) == (2, "")
    assert p.stderr.splitlines()[:2] == [f"error[missing_config]: folder {empty} has no config.json",
                                         "fix: Point SOURCE at a transformers model folder (with config.json)."]
    assert "prefect" not in mods and "torch" not in mods and "transformers" not in mods
    assert "modelyard" in mods  # the import lines were read
    assert _store_is_empty(tmp_path / "store")


def test_ingest_of_pickle_only_weights_fails_before_prefect(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text("{}")
    (d / "pytorch_model.bin").write_bytes(b"\x80\x02}q\x00.")
    p, mods = _imports("ingest", f"file://{d}", "--store", str(tmp_path / "store"), "--json")
    assert p.returncode == 2
    assert json_error(p.stdout, "ingest", 2) == {
        "type": "UnsupportedWeightsError", "code": "unsupported_weights",
        "message": f"folder {d} has only pickle weights (pytorch_model.bin); modelyard never unpickles",
        "fix": "Convert them to safetensors in a sandbox (transformers save_pretrained) and ingest that."}
    assert "prefect" not in mods


def test_ingest_with_exclude_patterns_is_prechecked_with_them(tmp_path, tiny_llama_dir):
    """--exclude applies to the early check as to the fetch: excluding the weights leaves none."""
    p, mods = _imports("ingest", f"file://{tiny_llama_dir}", "--exclude", "*.safetensors", "--no-smoke",
                       "--store", str(tmp_path / "store"))
    assert p.returncode == 2
    assert p.stderr.splitlines()[:2] == [f"error[unsupported_weights]: folder {tiny_llama_dir} has no *.safetensors weights",
                                         "fix: Publish the weights as safetensors."]
    assert "prefect" not in mods


@pytest.mark.parametrize("kind", ["gguf", "tar"])
def test_ingest_of_a_damaged_single_file_source_fails_before_prefect(tmp_path, kind):
    f = tmp_path / ("m.gguf" if kind == "gguf" else "m.tar.zst")
    f.write_bytes(b"not a model at all")
    p, mods = _imports("ingest", f"{kind}://{f}", "--no-smoke", "--store", str(tmp_path / "store"))
    assert p.returncode == 2
    want = (f"error[invalid_source]: {f} is not a GGUF file (no GGUF magic)" if kind == "gguf" else
            f"error[bundle_invalid]: {f.name}: no zstd frame at byte 0 (magic 0x20746f6e); the file is not zstd-compressed")
    assert p.stderr.splitlines()[0] == want
    assert "prefect" not in mods


# --------------------------------------------------------------------------- verify and the facts cache

def _verify(folder: Path, cache: Path) -> tuple[subprocess.CompletedProcess, set[str]]:
    return _imports("verify", str(folder), "--json", env={"MODELYARD_FACTS_CACHE": str(cache)})


def _copy(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def test_verify_answers_from_the_facts_cache_without_torch_or_transformers(tmp_path, tiny_llama_dir):
    cache = tmp_path / "facts"
    cold, mods = _verify(tiny_llama_dir, cache)
    assert cold.returncode == 0, cold.stderr
    assert {"torch", "transformers"} <= mods  # the first run asks transformers (config, meta model, tokenizer)
    assert len(list(cache.glob("*.json"))) == 1
    warm, mods = _verify(tiny_llama_dir, cache)
    assert warm.returncode == 0, warm.stderr
    assert "torch" not in mods and "transformers" not in mods and "tokenizers" not in mods
    assert warm.stdout == cold.stdout  # the same report, byte for byte
    assert json.loads(warm.stdout)["result"]["summary"] == {"errors": 0, "warnings": 0, "infos": 0, "not_judged": 0, "passed": True}


def test_a_changed_file_is_asked_again(tmp_path, tiny_llama_dir):
    d = _copy(tiny_llama_dir, tmp_path / "m")
    cache = tmp_path / "facts"
    assert _verify(d, cache)[0].returncode == 0
    (d / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    p, mods = _verify(d, cache)
    assert "transformers" in mods and len(list(cache.glob("*.json"))) == 2
    codes = [f["code"] for f in json.loads(p.stdout)["result"]["findings"]]
    assert "tokenizer.chat_template.no_turn_terminator" in codes  # the new template, not the cached answer


def test_the_folder_path_is_not_part_of_the_key(tmp_path, tiny_llama_dir):
    """The same content in another folder answers from the cache, with that folder's path in messages."""
    a = _copy(tiny_llama_dir, tmp_path / "a")
    (a / "tokenizer.json").unlink()
    (a / "tokenizer.model").write_bytes(b"not a sentencepiece model\n" * 10)
    b = _copy(a, tmp_path / "b")
    cache = tmp_path / "facts"
    pa, _ = _verify(a, cache)
    pb, mods = _verify(b, cache)
    assert "transformers" not in mods
    msg = {f["code"]: f["message"] for f in json.loads(pb.stdout)["result"]["findings"]}["tokenizer.load_failed"]
    assert msg == ("transformers cannot build the tokenizer: ValueError: Error parsing line "
                   f"b'not a sentencepiece model' in {b}/tokenizer.model")
    assert pa.stdout.replace(str(a), str(b)) == pb.stdout


def test_an_unreadable_cache_entry_is_a_miss(tmp_path, tiny_llama_dir):
    cache = tmp_path / "facts"
    cold, _ = _verify(tiny_llama_dir, cache)
    (entry,) = cache.glob("*.json")
    entry.write_text("{not json")
    again, mods = _verify(tiny_llama_dir, cache)
    assert "transformers" in mods and again.stdout == cold.stdout
    assert json.loads(entry.read_text())["key"] == entry.stem  # rewritten whole


def test_facts_cache_off_writes_nothing(tmp_path, tiny_llama_dir):
    p, mods = _imports("verify", str(tiny_llama_dir), "--json", env={"MODELYARD_FACTS_CACHE": "off",
                                                                     "XDG_CACHE_HOME": str(tmp_path)})
    assert p.returncode == 0 and "transformers" in mods
    assert not any(tmp_path.rglob("*.json"))
