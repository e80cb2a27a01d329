"""The ingest flow runs in Prefect (ephemeral API): one task run per stage, named ``name@revision``,
the Markdown report and the findings table attached as artifacts; an identical re-run takes verify
from Prefect's cache and says so."""

from __future__ import annotations

import asyncio

import pytest

from modelyard.flows.ingest import findings_rows, ingest_flow
from modelyard.flows.options import IngestOptions
from modelyard.model import digest as hashing

pytestmark = pytest.mark.e2e


def _read(flow_run_id):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey, FlowRunFilter, FlowRunFilterId

    async def read():
        async with get_client() as client:
            run = await client.read_flow_run(flow_run_id)
            tasks = await client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
            arts = await client.read_artifacts(
                artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["ingest-report", "ingest-findings"])),
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
            return run, tasks, {a.key: a for a in arts}

    return asyncio.run(read())


def test_flow_records_tasks_artifacts_and_reuses_cached_verify(tmp_path, tiny_llama_dir):
    state = ingest_flow(f"file://{tiny_llama_dir}", IngestOptions(smoke=False), str(tmp_path), return_state=True)
    assert state.is_completed()
    result = state.result()
    assert result.artifact.path.parent == tmp_path / "tiny-llama"
    assert result.cached == ()
    run, tasks, arts = _read(state.state_details.flow_run_id)
    assert run.name == f"tiny-llama@{result.artifact.revision[:14]}"
    assert sorted(t.name.split("-")[0] for t in tasks) == ["fetch", "hash", "package", "plan", "publish", "serve", "verify"]
    assert all(t.state.is_completed() for t in tasks)
    assert arts["ingest-report"].data == (result.artifact.path / "report.md").read_text()
    import json

    table = arts["ingest-findings"].data
    rows = json.loads(table) if isinstance(table, str) else table
    assert rows == findings_rows(result.report)
    # the artifact is exactly the bytes hashed: hashing copied a user's files, packaging moved them
    files = {f["path"].removeprefix("model/"): f["sha256"]
             for f in json.loads((result.artifact.path / "manifest.json").read_text())["files"]}
    assert len(files) == len(list(tiny_llama_dir.iterdir()))
    for name, sha in files.items():
        assert hashing.file_digest(result.artifact.path / "model" / name).sha256 == sha
        assert (result.artifact.path / "model" / name).stat().st_ino != (tiny_llama_dir / name).stat().st_ino
    assert list((tmp_path / ".staging").iterdir()) == []  # the hash-time copies were moved or removed

    again = ingest_flow(f"file://{tiny_llama_dir}", IngestOptions(smoke=False), str(tmp_path), return_state=True)
    res2 = again.result()
    assert res2.artifact.reused and res2.artifact.path == result.artifact.path
    assert res2.cached == ("verify",)
    assert res2.to_dict()["cached_stages"] == ["verify"]
    _, tasks2, _ = _read(again.state_details.flow_run_id)
    assert {t.name.split("-")[0]: t.state.name for t in tasks2}["verify"] == "Cached"
    assert res2.report.to_dict() == result.report.to_dict()


@pytest.mark.parametrize(("options", "error", "message"), [
    ({"gpu": "V100-16GB-typo"}, "InvalidTargetError", "unknown GPU 'V100-16GB-typo'"),
    ({"quantize": "int3"}, "QuantizeError", "--quantize/--scheme 'int3' is not a scheme modelyard knows"),
])
def test_bad_options_fail_before_any_work(tiny_llama_dir, tmp_path, options, error, message):
    """An unknown --gpu or scheme is refused before the source is read or the store is touched."""
    home = tmp_path / "home"
    with pytest.raises(Exception) as info:
        ingest_flow(f"file://{tiny_llama_dir}", IngestOptions(smoke=False, **options), str(home))
    assert (type(info.value).__name__, info.value.message) == (error, message)
    assert not home.exists()


def test_reuse_with_other_serve_options_is_refused(tiny_llama_dir, tmp_path):
    """Re-ingesting the same content for another host must not keep the stored serve/ plan silently."""
    from modelyard.errors import ArtifactConflictError

    home = str(tmp_path / "home")
    first = ingest_flow(f"file://{tiny_llama_dir}", IngestOptions(smoke=False), home)
    same = ingest_flow(f"file://{tiny_llama_dir}", IngestOptions(smoke=False, gpu="H100-80GB", gpus=1), home)
    assert (same.artifact.reused, same.artifact.path) == (True, first.artifact.path)
    with pytest.raises(ArtifactConflictError) as info:
        ingest_flow(f"file://{tiny_llama_dir}", IngestOptions(smoke=False, gpu="L4-24GB", gpus=1), home)
    rev = first.artifact.revision
    assert info.value.message.startswith(f"tiny-llama@{rev} is already in the store with serve/ for 1 x H100-80GB, "
                                         "max_model_len ")
    assert "the options ask for 1 x L4-24GB, max_model_len " in info.value.message
