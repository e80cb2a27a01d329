"""A user's folder that changes between hashing and verification is refused: the verdict would be about other
bytes than the ones stored (an ingest of file:// published "passed" about bytes it never stored)."""

from __future__ import annotations

import pytest

from modelyard.errors import HashMismatchError
from modelyard.flows.ingest import ingest_flow
from modelyard.flows.options import IngestOptions
from modelyard.stages import verify
from tests.conftest import store_artifacts
from tests.fixtures import make_tiny_llama


@pytest.mark.parametrize("restore", [False, True], ids=["changed", "changed-and-restored"])
def test_a_file_changed_while_verify_reads_the_folder_stops_the_ingest(tmp_path, monkeypatch, restore):
    src = make_tiny_llama(tmp_path / "m")
    cfg = src / "generation_config.json"
    original = cfg.read_bytes()
    real = verify.verify_folder

    def edited_meanwhile(root, *args, **kwargs):  # noqa: ANN001, ANN202 - a writer racing the ingest
        cfg.write_bytes(original.replace(b"}", b', "eos_token_id": 1}', 1) if b'"eos_token_id"' not in original
                        else original.replace(b'"eos_token_id"', b'"eos_token_id": 1, "x"', 1))
        try:
            return real(root, *args, **kwargs)
        finally:
            if restore:
                cfg.write_bytes(original)

    monkeypatch.setattr(verify, "verify_folder", edited_meanwhile)
    home = tmp_path / "home"
    with pytest.raises(HashMismatchError) as e:
        ingest_flow(f"file://{src}", IngestOptions(smoke=False), str(home))
    assert e.value.message.startswith(f"generation_config.json changed while file://{src} was being ingested")
    assert store_artifacts(home) == []
