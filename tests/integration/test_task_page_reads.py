"""What an open task page's reads cost a busy task: rows read, not time (Postgres), and the
indexes they search (the embedded SQLite store).

A task keeps its delivered webhooks ORCH_RETENTION_DAYS, thousands for a busy one, and its
decided actions for good. The tag of its view (`store.task_versions`, read at every 3 s poll of
every open tab) summed up each of its outbox rows, and the first page of its decided actions
read each of its actions and sorted them. The plans of the statements each read sends are
read with EXPLAIN ANALYZE: the rows read from tables stay about what the page shows.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import text

from orchestrator.store import Database
from orchestrator.store import actions as action_store
from orchestrator.store.task_versions import view_version
from tests.query_plans import sqlite_plans, table_and_index_rows, vacuumed

#: The busy task's delivered webhooks and its decided actions, each.
BUSY = 3000

SEED = [
    "INSERT INTO tasks (task_id, task_type, title, context, trigger_id, origin, status,"
    " generation, session_id, recoveries, handbacks, rounds, intent_round, created_at,"
    " updated_at) SELECT 't' || i, 'leak', 'Task ' || i, '{}', 'trig-' || i, 'live',"
    " 'waiting', 1, 's' || i, 0, 0, 1, 1, now() - i * interval '1 minute', now()"
    " FROM generate_series(0, 40) i",
    "INSERT INTO sessions (session_id, purpose, task_id, generation, owner, title, created_at,"
    " updated_at) SELECT session_id, 'task_execution', task_id, 1, 'task:' || task_id, title,"
    " created_at, created_at FROM tasks",
    # t0 is the busy task; each other one has a tenth of its history.
    "INSERT INTO outbox (kind, task_id, event_seq, body, status, attempts, next_attempt_at,"
    " created_at, delivered_at) SELECT 'webhook', task_id, seq, '{}', 'delivered', 1,"
    " now(), now() - interval '1 day' + seq * interval '1 second', now()"
    " FROM tasks, generate_series(1, :busy) seq"
    " WHERE task_id = 't0' OR seq <= :busy / 10",
    "INSERT INTO outbox (kind, task_id, event_seq, body, status, attempts, next_attempt_at,"
    " created_at, last_error) SELECT 'webhook', task_id, :busy + seq, '{}', 'pending', 1,"
    " now() + interval '1 minute', now(), 'HTTP 503' FROM tasks, generate_series(1, 3) seq",
    "INSERT INTO actions (action_id, task_id, generation, session_id, node_id, kind, payload,"
    " status, decided_by, decided_at, created_at, plan_revision, digest)"
    " SELECT task_id || '-a' || n, task_id, 1, session_id, 'n' || n, 'work_order', '{}',"
    " CASE WHEN n % 1000 = 0 THEN 'pending_approval' ELSE 'approved' END,"
    " CASE WHEN n % 1000 = 0 THEN NULL ELSE 'ops' END, now(),"
    # The others' actions are newer: the newest actions of the store are not the busy task's.
    " CASE WHEN task_id = 't0' THEN now() - interval '1 day' + n * interval '1 second'"
    " ELSE now() - n * interval '1 second' END, 1, repeat('0', 64)"
    " FROM tasks, generate_series(1, :busy) n WHERE task_id = 't0' OR n <= :busy / 10",
]


@pytest.fixture
def db(pg_url: str) -> Iterator[Database]:
    database = Database.from_url(pg_url)
    with database.transaction() as conn:
        for statement in SEED:
            conn.execute(text(statement), {"busy": BUSY})
    vacuumed(database, "outbox", "actions")
    yield database
    database.dispose()


def test_the_tag_of_a_busy_task_s_view_reads_its_undelivered_rows_not_its_history(
    db: Database,
) -> None:
    """Before: every outbox row and every action of the task read at each poll (3,000 and
    more of each)."""
    version: list[Any] = []

    def poll(conn: Any) -> None:
        version.append(view_version(conn, "t0"))

    actions_read, _entries = table_and_index_rows(db, poll, of="actions")
    assert actions_read < 10, f"{actions_read} actions read for one poll"
    table, index = table_and_index_rows(db, poll, of="outbox")
    assert table < 100, f"{table} outbox rows read for one poll"
    # The delivered ones counted from the index alone, once.
    assert BUSY <= index < BUSY + 100
    assert version[0] is not None
    assert version[0].task_id == "t0"


def test_the_first_page_of_a_busy_task_s_decided_actions_walks_its_index(db: Database) -> None:
    """Before: every action of the task read and sorted (3,000 for a page of 50)."""
    pages: list[Any] = []

    def first_page(conn: Any) -> None:
        pages.append(action_store.list_actions(conn, status=None, task_id="t0", limit=51,
                                               decided=True))  # fmt: skip

    table, _index = table_and_index_rows(db, first_page)
    assert table < 100, f"{table} rows read for a page of 50"
    [page] = pages
    # Newest first; t0-a3000 is pending (every thousandth is), not decided.
    assert [a.action_id for a in page[:3]] == ["t0-a2999", "t0-a2998", "t0-a2997"]
    assert len(page) == 51
    assert all(a.status == "approved" for a in page)


def test_a_busy_task_s_pending_actions_are_not_read_through_its_decided_ones(
    db: Database,
) -> None:
    """The task page's pending actions (read when its view changed): the index of the task's
    actions in the list's order must not make them a walk through its decided history."""
    pages: list[Any] = []

    def pending(conn: Any) -> None:
        pages.append(
            action_store.list_actions(conn, status="pending_approval", task_id="t0", limit=200)
        )

    table, _index = table_and_index_rows(db, pending, of="actions")
    assert table < 100, f"{table} actions read for 3 pending ones"
    [page] = pages
    assert [a.action_id for a in page] == ["t0-a3000", "t0-a2000", "t0-a1000"]


def test_the_embedded_store_reads_them_from_the_same_indexes(sqlite_url: str) -> None:
    """SQLite uses a partial index only for a query that repeats its predicate: the counts of
    settled deliveries search `ix_outbox_settled` alone (covering), the rows still to send
    `ix_outbox_unsettled`, and the decided actions' page the task's actions in its order."""
    database = Database.from_url(sqlite_url)
    try:

        def poll(conn: Any) -> None:
            view_version(conn, "t0")

        outbox_steps = [step for step in sqlite_plans(database, poll) if " outbox " in step]
        settled = [step for step in outbox_steps if "ix_outbox_settled" in step]
        assert len(settled) == 4
        assert all("COVERING INDEX" in step for step in settled)
        assert any("ix_outbox_unsettled" in step for step in outbox_steps)
        assert not [step for step in outbox_steps if step.startswith("SCAN")]
        action_steps = [step for step in sqlite_plans(database, poll) if " actions " in step]
        assert any("ix_actions_pending_task_id" in step for step in action_steps)
        assert not [step for step in action_steps if step.startswith("SCAN")]

        def first_page(conn: Any) -> None:
            action_store.list_actions(conn, status=None, task_id="t0", limit=51, decided=True)

        [step] = sqlite_plans(database, first_page)
        assert "USING INDEX ix_actions_task_id_created_at_action_id (task_id=?)" in step
    finally:
        database.dispose()
