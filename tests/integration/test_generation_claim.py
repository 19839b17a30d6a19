"""The claim of a generation: queued -> running once, whole or not at all (both stores)."""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, timedelta

from sqlalchemy import event, update

from orchestrator.store import driver
from orchestrator.store import executions as execution_store
from orchestrator.store import generation_claims as claim_store
from orchestrator.store import tasks as task_store
from orchestrator.store.db import Database
from orchestrator.store.records import TaskRecord
from orchestrator.store.tables import executions
from orchestrator.store.types import utcnow


def new_task(db: Database) -> str:
    # As a trigger inserts it: one statement on Postgres (`store.driver`), else a transaction.
    task = task_store.insert_task_alone(
        db,
        task_store.NewTask(
            task_type="t", title="claim", context={}, trigger_id=f"claim:{uuid.uuid4()}"
        ),
    )
    assert task is not None
    return task.task_id


def claim(
    db: Database, task_id: str, token: str, generation: int = 1
) -> tuple[TaskRecord, str] | None:
    # As the execution service claims: its own unit of work.
    return claim_store.claim_generation_alone(
        db,
        task_id,
        generation,
        lease_token=token,
        worker=f"worker-{token}",
        celery_task_id=None,
        lease_expires_at=utcnow() + timedelta(seconds=30),
    )


def test_a_queued_generation_is_claimed_once(db: Database) -> None:
    task_id = new_task(db)
    claimed = claim(db, task_id, "first")
    assert claimed is not None
    task, session_id = claimed
    assert task.status == "running"
    assert task.generation == 1
    assert session_id == task.session_id
    assert claim(db, task_id, "second") is None
    assert claim(db, task_id, "other-generation", generation=2) is None
    with db.transaction() as conn:
        execution = execution_store.get_execution(conn, task_id, 1)
    assert execution is not None
    assert execution.lease_token == "first"
    assert execution.worker == "worker-first"
    assert execution.started_at is not None


def test_a_claim_over_a_closed_execution_row_writes_nothing(db: Database) -> None:
    task_id = new_task(db)
    with db.transaction() as conn:
        conn.execute(
            update(executions).where(executions.c.task_id == task_id).values(outcome="superseded")
        )
    assert claim(db, task_id, "late") is None
    with db.transaction() as conn:
        task = task_store.get_task(conn, task_id)
        execution = execution_store.get_execution(conn, task_id, 1)
    assert task is not None
    assert task.status == "queued"
    assert execution is not None
    assert execution.lease_token is None


def test_concurrent_claims_of_one_generation_grant_one(pg_url: str) -> None:
    # Postgres: the claim is one statement in autocommit; SQLite serializes its writers.
    db = Database.from_url(pg_url, pool_size=8)
    task_id = new_task(db)
    barrier = threading.Barrier(8)
    won: list[str] = []

    def contend(token: str) -> None:
        barrier.wait()
        if claim(db, task_id, token) is not None:
            won.append(token)

    threads = [threading.Thread(target=contend, args=(f"t{i}",)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(won) == 1
    with db.transaction() as conn:
        execution = execution_store.get_execution(conn, task_id, 1)
    db.dispose()
    assert execution is not None
    assert execution.lease_token == won[0]


def test_the_claimed_task_is_the_task_as_read_back_in_utc_whatever_the_session_zone(
    pg_url: str,
) -> None:
    # The claim's row comes from the driver in the session's time zone (store.driver); the
    # record must be the same as every other read of the store: UTC.
    setup = Database.from_url(pg_url)
    with setup.transaction() as conn:
        database = conn.exec_driver_sql("SELECT current_database()").scalar_one()
        conn.exec_driver_sql(f"ALTER DATABASE \"{database}\" SET timezone TO 'Asia/Shanghai'")
    setup.dispose()
    db = Database.from_url(pg_url)
    try:
        task_id = new_task(db)
        claimed = claim(db, task_id, "zoned")
        assert claimed is not None
        task, _ = claimed
        with db.transaction() as conn:
            zone = conn.exec_driver_sql("SHOW timezone").scalar_one()
            read_back = task_store.get_task(conn, task_id)
        assert zone == "Asia/Shanghai"
        assert task == read_back
        assert task.updated_at.tzinfo is UTC
        assert task.created_at.tzinfo is UTC
        assert task.queued_at is not None
        assert task.queued_at.tzinfo is UTC
    finally:
        db.dispose()


def test_a_claim_on_postgres_is_one_statement_in_autocommit_on_no_pooled_connection(
    pg_url: str,
) -> None:
    # The store's pool is for transactions: a claim alone goes on the driver's kept
    # autocommit connections, without a checkout switched to autocommit and back.
    db = Database.from_url(pg_url)
    try:
        task_id = new_task(db)
        checkouts: list[object] = []
        told: list[tuple[str, bool]] = []
        event.listen(db.engine, "checkout", lambda *args: checkouts.append(args))
        driver.observers.append(lambda sql, autocommit: told.append((sql.split()[0], autocommit)))
        try:
            claimed = claim(db, task_id, "alone")
        finally:
            driver.observers.pop()
        assert claimed is not None
        assert claimed[0].status == "running"
        assert checkouts == []
        assert told == [("WITH", True)]
        assert claim(db, task_id, "again") is None
    finally:
        db.dispose()
