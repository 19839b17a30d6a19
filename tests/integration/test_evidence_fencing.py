"""An evidence record is a fenced write: on Postgres the check and the insert are one statement
(sent in autocommit), elsewhere a transaction; either way a superseded generation writes
nothing."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator.agent.evidence import EvidenceRecorder
from orchestrator.domain.evidence import EvidenceFacts
from orchestrator.domain.fences import Fence
from orchestrator.errors import StaleGeneration
from orchestrator.services.tasks import Trigger
from orchestrator.store import evidence as evidence_store
from orchestrator.store import tasks as task_store
from tests.executions_support import claim_as_worker, fenced_ctx, runtime_for

FACTS = EvidenceFacts(
    kind="data_source",
    source="scada_sim",
    origin="synthetic",
    truncated=False,
    row_count=1,
    params={"point": "DM-RN-01"},
    content=[{"value": 0.4}],
)


def test_only_the_live_generation_records_evidence(store_url: str, scripts: Path) -> None:
    rt, _ = runtime_for(store_url, scripts)
    try:
        task = rt.tasks.trigger(Trigger(task_type="t", title="fenced evidence")).task
        token = claim_as_worker(rt, task.task_id, 1, "w:1", ttl=60)
        with rt.db.transaction(readonly=True) as conn:
            session_id = task_store.get_task(conn, task.task_id).session_id  # type: ignore[union-attr]
        assert session_id is not None
        fence = Fence(task.task_id, 1, token)
        recorder = EvidenceRecorder(rt.db)
        cited = recorder.cite(fenced_ctx(fence, session_id), FACTS, cut=False, result_id=None)
        assert cited is not None
        evidence_id = cited.evidence_id

        # Another token (a holder that lost its lease) writes nothing.
        stale = fenced_ctx(replace(fence, lease_token="not-the-holder"), session_id)
        with pytest.raises(StaleGeneration):
            recorder.cite(stale, FACTS, cut=False, result_id=None)
        # Nor does the generation once the task was requeued past it.
        rt.tasks.requeue(task.task_id, "test: a new generation")
        with pytest.raises(StaleGeneration):
            recorder.cite(fenced_ctx(fence, session_id), FACTS, cut=False, result_id=None)

        with rt.db.transaction(readonly=True) as conn:
            stored = evidence_store.evidence_of_task(conn, task.task_id)
        assert [record["evidence_id"] for record in stored] == [evidence_id]
    finally:
        rt.close()
