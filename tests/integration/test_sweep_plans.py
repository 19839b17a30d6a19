"""A batch of requeues reads the tasks table by key, however many tasks it holds.

With Postgres's default cost model (random_page_cost 4, for spinning disks) a batch of 100 keys
among 10,000 tasks is planned as a scan of the whole table, three times per sweep (the row
locks, the tasks' move to the next generation, their events): a sweep then grows with the
table, not with its expiries. Counted with `pg_stat_xact_user_tables`, inside the transaction.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest
from sqlalchemy import Connection, text

from orchestrator.store import task_events as event_store
from orchestrator.store.db import Database, make_engine
from orchestrator.store.lost import Limits, requeue_lost
from orchestrator.store.task_events import NewEvent
from orchestrator.store.types import utcnow
from tests.executions_support import insert_running

RUNNING = 10_000
EXPIRED = 100


@pytest.fixture
def running(pg_url: str) -> Iterator[tuple[Database, list[str]]]:
    """`RUNNING` generation-1 executions, inserted in bulk, with the statistics analysed."""
    db = Database(make_engine(pg_url))
    runs = [(str(uuid.uuid4()), str(uuid.uuid4()), "t") for _ in range(RUNNING)]
    with db.transaction() as conn:
        insert_running(
            conn,
            runs,
            task_type="simple",
            worker="bulk",
            lease_expires_at=utcnow() - timedelta(seconds=1),
        )
    with db.engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").execute(text("ANALYZE"))
    yield db, [task_id for task_id, _, _ in runs]
    db.dispose()


def scans_of_tasks(conn: Connection) -> int:
    """Whole-table scans of `tasks` in this transaction so far."""
    return int(
        conn.execute(
            text("SELECT seq_scan FROM pg_stat_xact_user_tables WHERE relname = 'tasks'")
        ).scalar_one()
    )


def test_a_batch_of_requeues_reads_tasks_by_key(running: tuple[Database, list[str]]) -> None:
    db, ids = running
    lost = [(task_id, 1) for task_id in ids[:EXPIRED]]
    with db.transaction() as conn:
        before = scans_of_tasks(conn)
        batch = requeue_lost(conn, lost, reason="test", limits=Limits(3, 10))
        events = event_store.record_events(
            conn, [NewEvent(t, "queued", n, reason="test") for t, _, n in batch.requeued]
        )
        assert scans_of_tasks(conn) == before
    assert len(batch.requeued) == EXPIRED
    assert [event.seq for event in events] == [1] * EXPIRED
    with db.transaction(readonly=True) as conn:
        moved = conn.execute(
            text("SELECT count(*) FROM tasks WHERE status = 'queued' AND generation = 2")
        ).scalar_one()
    assert moved == EXPIRED


def test_the_cheaper_cost_model_ends_with_the_transaction(
    running: tuple[Database, list[str]],
) -> None:
    db, ids = running
    with db.transaction() as conn:
        default = conn.execute(text("SHOW random_page_cost")).scalar_one()
        requeue_lost(conn, [(ids[0], 1)], reason="test", limits=Limits(3, 10))
    with db.transaction(readonly=True) as conn:
        assert conn.execute(text("SHOW random_page_cost")).scalar_one() == default
