from pathlib import Path

import pytest

from modelyard.errors import InvalidSourceError
from modelyard.model.source import parse_source, sanitize_name


def test_hf_with_revision():
    s = parse_source("hf://org/tiny@v1.0")
    assert (s.kind, s.repo_id, s.revision, s.uri, s.default_name) == ("hf", "org/tiny", "v1.0", "hf://org/tiny@v1.0", "tiny")


def test_hf_defaults_to_main():
    assert parse_source("hf://HuggingFaceTB/SmolLM2-135M").revision == "main"


def test_file_and_gguf():
    f = parse_source("file:///models/My Model")
    assert (f.kind, f.path, f.default_name) == ("file", Path("/models/My Model"), "my-model")
    g = parse_source("gguf:///x/SmolLM2-135M-Instruct.Q4_1.gguf")
    assert (g.kind, g.path, g.default_name) == ("gguf", Path("/x/SmolLM2-135M-Instruct.Q4_1.gguf"), "smollm2-135m-instruct")


@pytest.mark.parametrize("uri,needle", [
    ("s4://x/y", "unsupported source scheme 's4'"),
    ("hf://justname", "is not an org/name repo id"),
    ("gguf:///x/model.bin", "does not name a .gguf file"),
    ("no-such-thing-here", "is not a URI and no such path exists"),
])
def test_invalid(uri, needle):
    with pytest.raises(InvalidSourceError) as ei:
        parse_source(uri)
    assert needle in str(ei.value)
    assert ei.value.exit_code == 2


def test_sanitize_name():
    assert sanitize_name("Org/Llama 3.1 8B!") == "org-llama-3.1-8b"
    with pytest.raises(InvalidSourceError):
        sanitize_name("!!!")


def test_stale_partial_downloads_are_swept_but_live_ones_kept(tmp_path):
    """A SIGKILLed hub download leaves <etag>.<8 hex>.incomplete for good (huggingface_hub 1.x never
    reuses another process's file); the next fetch removes it unless a live download holds its lock."""
    import subprocess
    import sys
    import time

    from modelyard.stages.fetch import sweep_incomplete

    blobs = tmp_path / "models--org--m" / "blobs"
    locks = tmp_path / ".locks" / "models--org--m"
    blobs.mkdir(parents=True)
    locks.mkdir(parents=True)
    (blobs / "aaa.1234abcd.incomplete").write_bytes(b"partial")
    (blobs / "bbb.5678abcd.incomplete").write_bytes(b"in progress")
    (blobs / "ccc").write_bytes(b"complete blob")
    (blobs / "ddd.incomplete").write_bytes(b"resumable")  # modelyard's own partial download: resumed, not swept
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\nfrom filelock import FileLock\n"
        f"l = FileLock({str(locks / 'bbb.lock')!r}); l.acquire(); print('held', flush=True); time.sleep(30)")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert sweep_incomplete(tmp_path, "org/m") == 1
        assert sorted(p.name for p in blobs.iterdir()) == ["bbb.5678abcd.incomplete", "ccc", "ddd.incomplete"]
    finally:
        holder.kill()
        holder.wait()
    time.sleep(0.1)
    assert sweep_incomplete(tmp_path, "org/m") == 1
    assert sorted(p.name for p in blobs.iterdir()) == ["ccc", "ddd.incomplete"]


@pytest.mark.parametrize(("url", "uri"), [
    ("https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct", "hf://HuggingFaceTB/SmolLM2-135M-Instruct@main"),
    ("https://huggingface.co/org/name/tree/v1.0", "hf://org/name@v1.0"),
    ("https://huggingface.co/org/name/tree/refs%2Fpr%2F3", "hf://org/name@refs/pr/3"),
    ("https://huggingface.co/org/name/blob/0123abc/config.json", "hf://org/name@0123abc"),
    ("https://hf.co/org/name/", "hf://org/name@main"),
])
def test_a_hub_page_url_is_an_hf_source(url, uri):
    assert parse_source(url).uri == uri


def test_a_hub_url_of_a_dataset_is_refused():
    with pytest.raises(InvalidSourceError) as info:
        parse_source("https://huggingface.co/datasets/org/data")
    assert info.value.message == "'https://huggingface.co/datasets/org/data' is not the URL of a model repo"


@pytest.mark.parametrize(("entry", "want"), [
    ({"type": "file", "path": "w.safetensors", "size": 10, "oid": "1" * 40,
      "lfs": {"oid": "a" * 64, "size": 10, "pointerSize": 130}}, (True, "a" * 64, None, False)),
    ({"type": "file", "path": "w.safetensors", "size": 10, "oid": "1" * 40,
      "lfs": {"oid": "*" * 64, "size": 10, "pointerSize": 130}}, (True, None, None, True)),
    ({"type": "file", "path": "w.safetensors", "size": 10, "oid": "1" * 40,
      "lfs": {"oid": None, "size": 10, "pointerSize": 130}}, (True, None, None, True)),
    ({"type": "file", "path": "config.json", "size": 2, "oid": "b" * 40}, (False, None, "b" * 40, False)),
    ({"type": "file", "path": "config.json", "size": 2, "oid": "*" * 40}, (False, None, None, True)),
    ({"type": "file", "path": "config.json", "size": 2, "oid": None}, (False, None, None, True)),
])
def test_hub_tree_digests_that_are_redacted_or_missing_are_unverifiable(entry, want):
    """A gated repo's tree API may redact a digest with asterisks or give none (null): no digest then,
    and the file is unverifiable (never compared, origin "unverified")."""
    from huggingface_hub.hf_api import RepoFile

    from modelyard.stages.fetch.hub import hub_file

    f = hub_file(RepoFile(**entry))
    assert (f.lfs, f.sha256, f.git_oid, f.unverifiable) == want
    assert f.entry().origin == ("unverified" if want[3] else "hub-lfs" if want[0] else "hub-git")
