"""A page of a long list reads about its own rows, not every row before it (Postgres).

The keyset condition was an OR the planner cannot use as an index range: page n scanned the
index from the newest row and threw the rows of the n-1 pages before it away. The plan of the
statement a list sends is read with EXPLAIN ANALYZE and the rows its scans read are counted.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import text

from orchestrator.domain.task_filter import TaskFilter
from orchestrator.store import Database
from orchestrator.store import actions as action_store
from orchestrator.store import sessions as session_store
from orchestrator.store import tasks as task_store
from orchestrator.store.types import utcnow
from tests.query_plans import rows_scanned

ROWS = 5000
#: The API lists sessions of one purpose (`ordinary_chat` unless asked otherwise).
PURPOSE = "task_execution"


#: Tasks a second apart after `start`, without sessions (`rows` of them).
MORE_TASKS = (
    "INSERT INTO tasks (task_id, task_type, title, context, trigger_id, origin, status,"
    " generation, recoveries, handbacks, rounds, intent_round, created_at, updated_at)"
    " SELECT 'm' || lpad(i::text, 6, '0'), 'leak', 'Task ' || i, '{}', 'more-' || i, 'live',"
    " (ARRAY['queued','waiting','completed'])[1 + i % 3], 1, 0, 0, 0, 1,"
    " :start + i * interval '1 second', :start + i * interval '1 second'"
    " FROM generate_series(1, :rows) i"
)


@pytest.fixture
def db(pg_url: str) -> Iterator[Database]:
    """ROWS tasks a minute apart, each with its session (as the trigger writes them) and a
    decided action."""
    database = Database.from_url(pg_url)
    start = utcnow() - timedelta(minutes=ROWS)
    with database.transaction() as conn:
        conn.execute(
            text(
                "INSERT INTO tasks (task_id, task_type, title, context, trigger_id, origin,"
                " status, generation, session_id, recoveries, handbacks, rounds, intent_round,"
                " created_at, updated_at)"
                " SELECT 't' || lpad(i::text, 6, '0'), 'leak', 'Task ' || i, '{}', 'trig-' || i,"
                " 'live', (ARRAY['queued','waiting','completed'])[1 + i % 3], 1,"
                " 's' || lpad(i::text, 6, '0'), 0, 0, 0, 1,"
                " :start + i * interval '1 minute', :start + i * interval '1 minute'"
                " FROM generate_series(1, :rows) i"
            ),
            {"start": start, "rows": ROWS},
        )
        conn.execute(
            text(
                "INSERT INTO sessions (session_id, purpose, task_id, generation, owner, title,"
                " created_at, updated_at)"
                " SELECT session_id, 'task_execution', task_id, 1, 'task:' || task_id, title,"
                " created_at, created_at FROM tasks"
            )
        )
        conn.execute(
            text(
                "INSERT INTO actions (action_id, task_id, generation, session_id, node_id, kind,"
                " payload, status, decided_by, created_at, plan_revision, digest)"
                " SELECT 'a' || task_id, task_id, 1, session_id, 'n', 'command', '{}',"
                " 'approved', 'ops', created_at, 1, repeat('0', 64) FROM tasks"
            )
        )
        conn.execute(text("ANALYZE tasks, sessions, actions"))
    yield database
    database.dispose()


def test_a_deep_page_of_tasks_reads_its_own_rows(db: Database) -> None:
    with db.transaction(readonly=True) as conn:
        deep = task_store.list_tasks(conn, where=TaskFilter(), limit=4000)[-1]
    seen = (deep.created_at, deep.task_id)
    page = []

    def read(conn: Any) -> None:
        page.extend(task_store.list_tasks(conn, where=TaskFilter(), limit=51, after=seen))

    assert rows_scanned(db, read) < 200  # was every row newer than the cursor too: 4,052
    assert [t.task_id for t in page] == [f"t{n:06d}" for n in range(1000, 949, -1)]
    waiting = TaskFilter(status="waiting")

    def read_waiting(conn: Any) -> None:
        task_store.list_tasks(conn, where=waiting, limit=51, after=seen)

    assert rows_scanned(db, read_waiting) < 400


def test_a_status_and_type_filter_that_matches_nothing_reads_no_task(db: Database) -> None:
    """Both filters at once, a pair no task has while each value alone is common: the planner,
    taking the two for independent, walked the created_at index through every task to find
    none (100,000 tasks: ~10-45 ms for an empty page). Migration 0022's index and statistics of
    the pairs make it read the pair's rows."""
    with db.transaction() as conn:
        conn.execute(text(MORE_TASKS), {"start": utcnow(), "rows": 25_000})
        # Half the tasks are leaks, and no leak ever failed.
        conn.execute(
            text(
                "UPDATE tasks SET status = CASE WHEN n % 4 = 0 THEN 'failed' ELSE status END,"
                " task_type = CASE WHEN n % 2 = 1 THEN 'leak' ELSE 'pressure' END"
                " FROM (SELECT task_id AS id, row_number() OVER (ORDER BY task_id) AS n"
                " FROM tasks) numbered WHERE task_id = numbered.id"
            )
        )
    with db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE tasks"))  # as autovacuum leaves it
    rare = TaskFilter(status="failed", task_type="leak")
    found: list[Any] = []

    def read(conn: Any) -> None:
        found.extend(task_store.list_tasks(conn, where=rare, limit=51))

    assert rows_scanned(db, read) < 50  # was every failed task: 7,500
    assert found == []
    failed = TaskFilter(status="failed", task_type="pressure")
    with db.transaction(readonly=True) as conn:
        page = task_store.list_tasks(conn, where=failed, limit=2)
    assert [(t.status, t.task_type) for t in page] == [("failed", "pressure")] * 2


def test_a_deep_page_of_sessions_reads_its_own_rows(db: Database) -> None:
    with db.transaction(readonly=True) as conn:
        deep = session_store.list_sessions(conn, purpose=PURPOSE, task_id=None, limit=4000)[-1]
    seen = (deep.created_at, deep.session_id)

    def read(conn: Any) -> None:
        session_store.list_sessions(conn, purpose=PURPOSE, task_id=None, limit=51, after=seen)

    assert rows_scanned(db, read) < 200


def test_a_page_of_every_action_reads_its_own_rows(db: Database) -> None:
    """`any=true` (every status): its order had no index, so each page, the first too, read
    and sorted every action ever proposed."""

    def first(conn: Any) -> None:
        action_store.list_actions(conn, status=None, task_id=None, limit=101)

    assert rows_scanned(db, first) < 200  # was all 5,000
    with db.transaction(readonly=True) as conn:
        deep = action_store.list_actions(conn, status=None, task_id=None, limit=4000)[-1]
    seen = (deep.created_at, deep.action_id)

    def read(conn: Any) -> None:
        action_store.list_actions(conn, status=None, task_id=None, limit=101, after=seen)

    assert rows_scanned(db, read) < 200
