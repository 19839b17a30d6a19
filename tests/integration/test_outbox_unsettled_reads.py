"""What a held task event waits behind, and which events are due, are read from each task's
webhooks not yet delivered or discarded, not from all of them (Postgres).

A task's delivered webhooks stay ORCH_RETENTION_DAYS: a busy task has thousands. Both reads
asked the index on (task, kind, seq) for every webhook of the task (or every one before a
due row) and threw the delivered ones away at the heap: `waits_behind` (every view of a
pending webhook: `outbox list`, `outbox show`, the task's view) and the dispatcher's
`claim_due` read each task's delivered rows at each page and each round. The plans of the
statements they send are read with EXPLAIN ANALYZE and the rows their scans read counted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Connection, event, text

from orchestrator.store import Database, outbox_sending, outbox_views
from orchestrator.store.outbox import OutboxRow
from orchestrator.store.types import utcnow

TASKS = 20
DELIVERED = 2000  # per task
HEAD, BEHIND = DELIVERED + 1, DELIVERED + 2  # the events after them

TASK_ROWS = (
    "INSERT INTO tasks (task_id, task_type, title, context, trigger_id, origin, status,"
    " generation, recoveries, handbacks, rounds, intent_round, created_at, updated_at)"
    " SELECT 't' || lpad(i::text, 3, '0'), 'leak', 'Task ' || i, '{}', 'trig-' || i, 'live',"
    " 'waiting', 1, 0, 0, 0, 1, :now, :now FROM generate_series(1, :tasks) i"
)
WEBHOOKS = (
    "INSERT INTO outbox (kind, task_id, event_seq, body, status, attempts, throttled,"
    " next_attempt_at, last_error, created_at, delivered_at)"
    " SELECT 'webhook', task_id, seq, '{}', :status, :attempts, 0, :due, :error, :now,"
    " :delivered FROM tasks, generate_series(CAST(:first AS integer), CAST(:last AS integer))"
    " seq WHERE task_id BETWEEN :low AND :high"
)


@pytest.fixture
def db(pg_url: str) -> Iterator[Database]:
    """TASKS tasks of DELIVERED delivered webhooks each, then: t001-t005 a dead letter and a
    pending event behind it, t006-t010 a failing event backing off and one behind it, the rest
    one event due now, never tried, and one after it."""
    database = Database.from_url(pg_url)
    now = utcnow()

    def webhooks(conn: Any, low: int, high: int, first: int, last: int, **row: Any) -> None:
        delivered = now if row["status"] == "delivered" else None
        values = {"attempts": 0, "due": now, "error": None, "delivered": delivered, **row}
        conn.execute(
            text(WEBHOOKS),
            {"now": now, "first": first, "last": last, "low": f"t{low:03}", "high": f"t{high:03}"}
            | values,
        )

    with database.transaction() as conn:
        conn.execute(text(TASK_ROWS), {"now": now, "tasks": TASKS})
        webhooks(conn, 1, TASKS, 1, DELIVERED, status="delivered", attempts=1)
        head, behind = HEAD, BEHIND
        webhooks(conn, 1, 5, head, head, status="dead", attempts=3, error="HTTP 503")
        later = now.replace(year=now.year + 1)
        webhooks(conn, 6, 10, head, head, status="pending", attempts=2, error="HTTP 503", due=later)
        webhooks(conn, 11, TASKS, head, head, status="pending")
        webhooks(conn, 1, TASKS, behind, behind, status="pending")
        conn.execute(text("ANALYZE tasks, outbox"))
    yield database
    database.dispose()


def _pending(db: Database) -> list[OutboxRow]:
    with db.transaction(readonly=True) as conn:
        return outbox_views.list_rows(conn, status="pending", kind="webhook", limit=50)


def _rows_read(db: Database, read: Callable[[Connection], Any]) -> tuple[Any, int]:
    """What `read(conn)` returns, and the rows the scans of the SELECTs it sends read (each
    loop of a scan counted: a check repeated per candidate row reads its rows each time),
    replayed with EXPLAIN ANALYZE; both in a transaction rolled back."""
    sent: list[tuple[str, Any]] = []

    def keep(_conn: Any, _cursor: Any, statement: str, params: Any, *_: Any) -> None:
        sent.append((statement, params))

    with db.engine.connect() as conn:
        event.listen(db.engine, "before_cursor_execute", keep)
        try:
            with conn.begin() as transaction:
                result = read(conn)
                transaction.rollback()
        finally:
            event.remove(db.engine, "before_cursor_execute", keep)
        total = 0
        with conn.begin() as transaction:
            for statement, params in sent:
                if statement.lstrip().upper().startswith("SELECT"):
                    [[plan]] = conn.exec_driver_sql(
                        f"EXPLAIN (ANALYZE, FORMAT JSON) {statement}", params
                    ).fetchall()
                    total += _scanned(plan[0]["Plan"])
            transaction.rollback()
    return result, total


def _scanned(node: dict[str, Any]) -> int:
    # A bitmap heap scan's rows are its bitmap index scan's: counted once, at the heap.
    own = 0
    if "Scan" in node["Node Type"] and node["Node Type"] != "Bitmap Index Scan":
        per_loop = int(node["Actual Rows"]) + int(node.get("Rows Removed by Filter", 0))
        own = per_loop * int(node["Actual Loops"])
    return own + sum(_scanned(child) for child in node.get("Plans", []))


def test_what_a_held_event_waits_behind_reads_no_delivered_webhook(db: Database) -> None:
    rows = _pending(db)
    assert len(rows) == 5 + 2 * 5 + 2 * 10  # behind a dead letter; failing and behind; due
    held, scanned = _rows_read(db, lambda conn: outbox_views.waits_behind(conn, rows))
    waits = {row.task_id: held.get(row.outbox_id) for row in rows if row.event_seq == BEHIND}
    assert {task: found and found[0] for task, found in waits.items()} == {
        f"t{i:03}": "dead" if i <= 5 else "retried" if i <= 10 else None
        for i in range(1, TASKS + 1)
    }
    # Each task's one or two unsent webhooks, not its thousands delivered.
    assert scanned < 10 * TASKS, scanned


def test_a_dispatchers_claim_reads_no_delivered_webhook(db: Database) -> None:
    """The claim's check, for each due event, that nothing earlier of its task is still to
    send: the event after each task's dead or failing one is not due, nor the one after the
    first due one of a task."""
    claimed, scanned = _rows_read(
        db,
        lambda conn: outbox_sending.claim_due(conn, ("webhook",), limit=20, hold_seconds=60),
    )
    assert sorted((row.task_id, row.event_seq) for row in claimed) == [
        (f"t{i:03}", HEAD) for i in range(11, TASKS + 1)
    ]
    assert scanned < 10 * TASKS, scanned
