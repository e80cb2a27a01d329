"""The ingest flow runs in Prefect (ephemeral API): one task run per stage, the Markdown report
attached as the `ingest-report` artifact."""

from __future__ import annotations

import asyncio

import pytest

from modelyard.flows.ingest import ingest_flow
from modelyard.pipeline.options import IngestOptions

pytestmark = pytest.mark.e2e


def test_flow_records_tasks_and_report_artifact(tmp_path, tiny_llama_dir):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey, FlowRunFilter, FlowRunFilterId

    state = ingest_flow(f"file://{tiny_llama_dir}", IngestOptions(smoke=False), str(tmp_path), return_state=True)
    assert state.is_completed()
    result = state.result()
    assert result.artifact.path.parent == tmp_path / "tiny-llama"
    flow_run_id = state.state_details.flow_run_id

    async def read():
        async with get_client() as client:
            tasks = await client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
            arts = await client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["ingest-report"])),
                                               flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
            return tasks, arts

    tasks, arts = asyncio.run(read())
    assert sorted(t.name.split("-")[0] for t in tasks) == ["fetch", "hash", "package", "plan", "publish", "serve", "verify"]
    assert all(t.state.is_completed() for t in tasks)
    assert len(arts) == 1
    assert arts[0].data == (result.artifact.path / "report.md").read_text()
