"""A task's deliveries as its view shows them (`outbox_views.delivery_summary`: `tasks show`, the
console's task page), on a task with thousands of outbox rows, on both stores.

The counts per kind and status are one aggregate statement (GROUP BY): the store hands Python
the handful of counts, never the task's rows, however many it delivered (a busy task keeps
thousands for ORCH_RETENTION_DAYS, and its view is read at every change the console sees).
"""

from __future__ import annotations

import pytest
from sqlalchemy import insert

from orchestrator.store import Database
from orchestrator.store.outbox_views import UNDELIVERED_SHOWN, delivery_summary
from orchestrator.store.tables import outbox, tasks
from orchestrator.store.types import utcnow
from tests.query_plans import rows_returned

#: The task's delivered webhooks: enough that reading them shows among a handful of counts.
DELIVERED = 3000


@pytest.fixture
def busy(db: Database) -> Database:
    """Task `busy`: DELIVERED delivered webhooks, then 1 dead and 29 pending ones; 35 delivered
    and 5 discarded actions. Task `quiet` beside it: 500 delivered webhooks, not counted."""
    now = utcnow()
    row = {
        "event_seq": None,
        "action_id": None,
        "body": "{}",
        "attempts": 1,
        "next_attempt_at": now,
        "created_at": now,
        "delivered_at": None,
        "discarded_at": None,
    }
    webhooks = [
        row | {"kind": "webhook", "task_id": "busy", "event_seq": seq, "status": status}
        for seq, status in enumerate(
            ["delivered"] * DELIVERED + ["dead"] + ["pending"] * 29, start=1
        )
    ]
    for hook in webhooks[DELIVERED + 1 :]:
        hook["attempts"] = 0
    decided = [
        row | {"kind": "action", "task_id": "busy", "action_id": f"act-{i}", "status": status}
        for i, status in enumerate(["delivered"] * 35 + ["discarded"] * 5)
    ]
    quiet = [
        row | {"kind": "webhook", "task_id": "quiet", "event_seq": seq, "status": "delivered"}
        for seq in range(1, 501)
    ]
    task = {
        "task_type": "leak",
        "title": "t",
        "context": {},
        "origin": "live",
        "status": "completed",
        "generation": 1,
        "recoveries": 0,
        "handbacks": 0,
        "rounds": 1,
        "intent_round": 1,
        "created_at": now,
        "updated_at": now,
    }
    with db.transaction() as conn:
        conn.execute(
            insert(tasks),
            [task | {"task_id": t, "trigger_id": f"trigger-{t}"} for t in ("busy", "quiet")],
        )
        conn.execute(insert(outbox), webhooks + decided + quiet)
    return db


def test_the_counts_of_a_task_s_deliveries_are_counted_by_the_store(busy: Database) -> None:
    with busy.transaction(readonly=True) as conn:
        summary = delivery_summary(conn, "busy")
    assert summary["counts"] == {
        "webhook": {"delivered": DELIVERED, "dead": 1, "pending": 29},
        "action": {"delivered": 35, "discarded": 5},
    }
    shown = summary["undelivered"]
    assert len(shown) == UNDELIVERED_SHOWN
    assert [x["status"] for x in shown[:2]] == ["dead", "pending"]  # the dead one first
    assert [x["event_seq"] for x in shown[1:]] == list(range(DELIVERED + 2, DELIVERED + 21))
    assert all(x["waits_behind"] == shown[0]["outbox_id"] for x in shown[1:])
    assert summary["never_sent"] == []  # webhooks were delivered: something sends them

    # The counts, the rows shown, whether each kind was ever sent, and what the held ones wait
    # behind: a few statements and about the rows shown, not the task's thousands.
    statements, returned = rows_returned(busy, lambda conn: delivery_summary(conn, "busy"))
    assert statements <= 6, statements
    assert returned <= UNDELIVERED_SHOWN + 10, returned
