"""Cold start in a fleet: a worker start orphans only the receipts of generations that are gone."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.domain.fences import Fence
from orchestrator.leases.keys import task_lease
from orchestrator.runtime import Runtime
from orchestrator.services.tasks import Trigger
from orchestrator.store import executions as execution_store
from orchestrator.store.receipts import ReceiptLedger
from tests.executions_support import claim_as_worker, runtime_for
from tests.integration.test_sweeper import TTL, abandon


@pytest.fixture
def rt(store_url: str, tmp_path: Path) -> Iterator[Runtime]:
    runtime, _ = runtime_for(store_url, tmp_path)
    yield runtime
    runtime.close()


def running_receipt(rt: Runtime, task_id: str, key: str) -> str:
    with rt.db.transaction(readonly=True) as conn:
        execution = execution_store.get_execution(conn, task_id, 1)
    assert execution is not None
    assert execution.lease_token is not None
    claim = ReceiptLedger(rt.db).claim(
        owner=f"task:{task_id}",
        session_id=execution.session_id,
        tool_name="call_api",
        identity_key=key,
        args_digest="d" * 64,
        fence=Fence(task_id, 1, execution.lease_token),
    )
    assert claim.granted
    return claim.receipt.invocation_id


def status(rt: Runtime, invocation_id: str) -> str:
    receipt = ReceiptLedger(rt.db).get(invocation_id)
    assert receipt is not None
    return receipt.status


def test_a_worker_start_leaves_live_generations_alone(rt: Runtime) -> None:
    live = rt.tasks.trigger(Trigger(task_type="x", title="live")).task.task_id
    dead = rt.tasks.trigger(Trigger(task_type="x", title="dead")).task.task_id
    abandon(rt, dead, 1)
    live_ttl = 30.0
    claim_as_worker(rt, live, 1, "alive", live_ttl)
    live_id = running_receipt(rt, live, "k-live")
    dead_id = running_receipt(rt, dead, "k-dead")
    time.sleep(TTL + 0.2)
    assert rt.cold_start() == 1
    assert status(rt, live_id) == "running"
    assert status(rt, dead_id) == "unknown"


def test_a_worker_start_leaves_a_live_generation_with_a_lagging_mirror_alone(rt: Runtime) -> None:
    # As the sweeper finds it: the lease back end holds the lease, only the store's mirror of
    # its expiry is behind (the renewal's mirror write did not land). The generation is live.
    task_id = rt.tasks.trigger(Trigger(task_type="x", title="lagging")).task.task_id
    token = claim_as_worker(rt, task_id, 1, "alive", TTL)
    invocation_id = running_receipt(rt, task_id, "k")
    assert rt.leases.renew(task_lease(task_id), token, 30)
    time.sleep(TTL + 0.2)
    assert rt.cold_start() == 0
    assert status(rt, invocation_id) == "running"
    assert rt.sweeper.sweep().requeued == []  # the sweeper agrees: still live


def test_the_sweeper_orphans_the_lost_generations_receipts(rt: Runtime) -> None:
    task_id = rt.tasks.trigger(Trigger(task_type="x", title="t")).task.task_id
    abandon(rt, task_id, 1)
    invocation_id = running_receipt(rt, task_id, "k")
    time.sleep(TTL + 0.2)
    assert rt.sweeper.sweep().requeued == [(task_id, 1, 2)]
    assert status(rt, invocation_id) == "unknown"
