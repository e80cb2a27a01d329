"""The folder a resumable pull writes into (``transport._transfer.Staging`` with ``resume``): what a killed pull
left is kept only when its bytes are the file's own, and a pull that fails for any other reason leaves nothing.
The servers' side (ranged GETs from the partial file's end) is in tests/e2e/test_pull_resume.py."""

from __future__ import annotations

import hashlib
import os

import pytest

from modelyard.errors import HashMismatchError, PublishError
from modelyard.transport._transfer import Staging

DATA = bytes(range(256)) * 4096  # 1 MiB
SHA = hashlib.sha256(DATA).hexdigest()


def _from(start: int, asked: list[int]):  # noqa: ANN202 - a ranged source: records where it was asked to start
    asked.append(start)
    yield from (DATA[a:a + 65536] for a in range(start, len(DATA), 65536))


def _broken(start: int):  # noqa: ANN202 - the network goes away after 300 KiB
    yield DATA[start:300 * 1024]
    raise PublishError("connection reset", fix="retry")


def _partial_dirs(tmp_path):  # noqa: ANN001, ANN202
    return sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".out.pull-"))


def _left_by_a_killed_pull(tmp_path):  # noqa: ANN001, ANN202
    """The model/ folder of the resume folder a killed pull of ``tmp_path / "out"`` left: made as the pull makes it
    (mode 0700, this user's; a folder open to others is refused as planted)."""
    root = tmp_path / ".out.pull-0123456789abcdef"
    root.mkdir(mode=0o700)
    (root / "model").mkdir()
    return root / "model"


def test_a_failed_download_is_continued_by_the_next_pull(tmp_path):
    into = tmp_path / "out"
    with pytest.raises(PublishError, match="connection reset"), Staging(into, resume="sha256:" + "ab" * 32) as st:
        st.write("model/w.bin", _broken, len(DATA), SHA, "s3://b/p")
    assert not into.exists() and _partial_dirs(tmp_path) == [".out.pull-abababababababab"]
    assert (tmp_path / ".out.pull-abababababababab" / "model" / "w.bin").stat().st_size == 300 * 1024
    asked: list[int] = []
    with Staging(into, resume="sha256:" + "ab" * 32) as st:
        st.write("model/w.bin", lambda start: _from(start, asked), len(DATA), SHA, "s3://b/p")
        assert (st.continued, st.reused) == (300 * 1024, 0)
        st.commit()
    assert asked == [300 * 1024] and (into / "model" / "w.bin").read_bytes() == DATA
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no partial folder, no lock file


def test_a_complete_file_is_hashed_and_kept_not_downloaded(tmp_path):
    into = tmp_path / "out"
    d = _left_by_a_killed_pull(tmp_path)
    (d / "w.bin").write_bytes(DATA)
    asked: list[int] = []
    with Staging(into, resume="0123456789abcdef" * 4) as st:
        st.write("model/w.bin", lambda start: _from(start, asked), len(DATA), SHA, "s3://b/p")
        assert (st.reused, asked) == (len(DATA), [])
        st.commit()
    assert (into / "model" / "w.bin").read_bytes() == DATA and oct(os.stat(into / "model" / "w.bin").st_mode)[-3:] == "444"


def test_a_partial_file_that_is_not_a_prefix_fails_and_is_removed(tmp_path):
    """Bytes that are not the file's start (a disk error): the whole sha256 differs, the message says the file was
    continued, and the folder is removed so that the next pull starts afresh."""
    into = tmp_path / "out"
    d = _left_by_a_killed_pull(tmp_path)
    (d / "w.bin").write_bytes(b"\xff" * 4096)
    with pytest.raises(HashMismatchError, match=r"continued from 4096 bytes a killed pull left; they are removed"), \
            Staging(into, resume="0123456789abcdef" * 4) as st:
        st.write("model/w.bin", lambda start: _from(start, []), len(DATA), SHA, "s3://b/p")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_file_longer_than_recorded_or_wrong_at_full_size_is_downloaded_again(tmp_path):
    into = tmp_path / "out"
    d = _left_by_a_killed_pull(tmp_path)
    (d / "long.bin").write_bytes(DATA + b"x")
    (d / "wrong.bin").write_bytes(DATA[:-1] + b"x")
    asked: list[int] = []
    with Staging(into, resume="0123456789abcdef" * 4) as st:
        for rel in ("model/long.bin", "model/wrong.bin"):
            st.write(rel, lambda start: _from(start, asked), len(DATA), SHA, "s3://b/p")
        st.commit()
    assert asked == [0, 0] and (into / "model" / "wrong.bin").read_bytes() == DATA


def test_two_pulls_into_one_folder_at_once_are_refused(tmp_path):
    into = tmp_path / "out"
    with Staging(into, resume="cd" * 32):
        with pytest.raises(PublishError, match=r"another pull into .*out is running"):
            Staging(into, resume="cd" * 32)
