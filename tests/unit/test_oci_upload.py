"""The OCI upload journal: a kept session is used only for the bytes it was started for (CPU only; the upload
itself is tested against the real registry in tests/e2e/test_pull_resume.py)."""

from __future__ import annotations

from modelyard.transport import oci_upload

DIGEST = "sha256:" + "ab" * 32


def test_the_journal_names_one_file_per_registry_repository_and_digest(tmp_path):
    a = oci_upload.journal_file(tmp_path, "127.0.0.1:5000", "models/x", DIGEST)
    assert a.parent == tmp_path and a.suffix == ".json" and len(a.stem) == 32
    assert a != oci_upload.journal_file(tmp_path, "127.0.0.1:5000", "models/y", DIGEST)
    assert a != oci_upload.journal_file(tmp_path, "127.0.0.1:5001", "models/x", DIGEST)
    assert a == oci_upload.journal_file(tmp_path, "127.0.0.1:5000", "models/x", DIGEST)


def test_a_kept_session_is_read_back_only_for_its_own_digest(tmp_path):
    record = oci_upload.journal_file(tmp_path / "j", "r", "models/x", DIGEST)
    oci_upload._keep(record, "http://r/v2/models/x/blobs/uploads/u?_state=s", DIGEST)
    assert oci_upload._kept(record, DIGEST) == "http://r/v2/models/x/blobs/uploads/u?_state=s"
    assert oci_upload._kept(record, "sha256:" + "cd" * 32) is None  # another file's bytes: start anew
    assert not list(record.parent.glob("*.tmp"))  # written through a temp file and a rename
    record.write_text("{not json")
    assert oci_upload._kept(record, DIGEST) is None
    assert oci_upload._kept(tmp_path / "missing.json", DIGEST) is None
