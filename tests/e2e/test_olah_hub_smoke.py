"""Smoke test: olah (offline) serving a local git+LFS repo to huggingface_hub."""

from __future__ import annotations

import json
import os
import random
import subprocess
from pathlib import Path

import pytest

try:  # works both as a package module and with pytest's rootdir/prepend import
    from .olah_hub import OlahServer, git_blob_sha1, make_lfs_repo, repo_path, sha256_hex
except ImportError:
    from olah_hub import OlahServer, git_blob_sha1, make_lfs_repo, repo_path, sha256_hex

from huggingface_hub import HfApi, snapshot_download
from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

pytestmark = pytest.mark.hub

REPO_ID = "org/tiny"


def _commits() -> list[dict[str, bytes]]:
    rnd = random.Random(1234)
    return [
        {
            "config.json": json.dumps({"model_type": "tiny", "v": 1}).encode() + b"\n",
            "README.md": b"---\nlicense: mit\n---\n# tiny\n",
            "model.safetensors": rnd.randbytes(100_000),
        },
        {
            "config.json": json.dumps({"model_type": "tiny", "v": 2}).encode() + b"\n",
            "model.safetensors": rnd.randbytes(100_000),
        },
    ]


def _tree_at(commits: list[dict[str, bytes]], upto: int) -> dict[str, bytes]:
    tree: dict[str, bytes] = {}
    for c in commits[: upto + 1]:
        tree.update(c)
    return tree


def _read_snapshot(path: str) -> dict[str, bytes]:
    root = Path(path)
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in root.rglob("*")
        if p.is_file() and p.name != ".gitattributes"
    }


def test_make_lfs_repo_layout(tmp_path: Path) -> None:
    commits = _commits()
    shas = make_lfs_repo(tmp_path, "org", "tiny", commits)
    repo = repo_path(tmp_path, "org", "tiny")
    assert repo == tmp_path / "models" / "org" / "tiny"
    assert (repo / ".git").is_dir()  # non-bare checkout

    def git(*args: str) -> str:
        env = dict(os.environ, GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1")
        return subprocess.run(["git", *args], cwd=repo, env=env, check=True,
                              capture_output=True, text=True).stdout.strip()

    assert len(shas) == 2 and len(set(shas)) == 2
    assert git("rev-parse", "main") == shas[-1]
    assert git("rev-parse", "--abbrev-ref", "HEAD") == "main"
    assert git("rev-parse", "HEAD~1") == shas[0]
    # The committed blob is an LFS pointer, the object lives in .git/lfs/objects.
    pointer = git("cat-file", "-p", f"{shas[0]}:model.safetensors")
    oid = sha256_hex(commits[0]["model.safetensors"])
    assert f"oid sha256:{oid}" in pointer and "size 100000" in pointer
    assert (repo / ".git/lfs/objects" / oid[:2] / oid[2:4] / oid).is_file()
    # Non-LFS files are plain blobs.
    assert git("rev-parse", f"{shas[0]}:config.json") == git_blob_sha1(commits[0]["config.json"])
    # Reproducible identity/dates -> same shas for same input.
    assert make_lfs_repo(tmp_path / "again", "org", "tiny", commits) == shas


def test_olah_serves_lfs_repo(tmp_path: Path) -> None:
    commits = _commits()
    mirrors = tmp_path / "mirrors"
    shas = make_lfs_repo(mirrors, "org", "tiny", commits)

    with OlahServer(mirrors, workdir=tmp_path / "olah", log_path=tmp_path / "olah.log") as hub:
        assert hub.endpoint.startswith("http://127.0.0.1:")
        api = HfApi(endpoint=hub.endpoint, token=False)

        # Resolve branch -> sha (olah's model_info needs an explicit revision).
        assert api.model_info(REPO_ID, revision="main").sha == shas[-1]
        assert api.model_info(REPO_ID, revision=shas[0]).sha == shas[0]
        # Quirk: an unknown revision reads as repo-not-found (401) in offline mode.
        with pytest.raises((RepositoryNotFoundError, RevisionNotFoundError)):
            api.model_info(REPO_ID, revision="no-such-branch")

        # paths-info: LFS -> lfs.sha256/size; non-LFS -> git blob id.
        for idx, sha in enumerate(shas):
            expected = _tree_at(commits, idx)
            infos = {
                i.path: i
                for i in api.get_paths_info(REPO_ID, ["model.safetensors", "config.json", "README.md"], revision=sha)
            }
            assert set(infos) == {"model.safetensors", "config.json", "README.md"}
            st = infos["model.safetensors"]
            data = expected["model.safetensors"]
            assert st.lfs is not None
            assert st.lfs.sha256 == sha256_hex(data)
            assert st.lfs.size == len(data) == st.size
            for name in ("config.json", "README.md"):
                assert infos[name].lfs is None
                assert infos[name].blob_id == git_blob_sha1(expected[name])
                assert infos[name].size == len(expected[name])

        cache = tmp_path / "hf-cache"
        # Download pinned to the first commit, then main.
        for rev, idx in ((shas[0], 0), ("main", len(shas) - 1)):
            path = snapshot_download(REPO_ID, revision=rev, endpoint=hub.endpoint, cache_dir=cache, token=False)
            assert Path(path).name == shas[idx]
            assert _read_snapshot(path) == _tree_at(commits, idx)

        # Cache blobs are keyed like the real Hub: sha256 for LFS, git sha1 otherwise.
        blobs = {p.name for p in (cache / "models--org--tiny" / "blobs").iterdir()}
        for idx in range(len(shas)):
            tree = _tree_at(commits, idx)
            assert sha256_hex(tree["model.safetensors"]) in blobs
            assert git_blob_sha1(tree["config.json"]) in blobs
        assert (cache / "models--org--tiny" / "refs" / "main").read_text() == shas[-1]

    assert hub.process is None
    assert "GET /api/models/org/tiny/revision/main" in (tmp_path / "olah.log").read_text()
