"""Each constraint of the schema refuses a bad write with a domain error and writes nothing."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import Connection, delete, func, insert, select

from orchestrator.errors import ConstraintViolation
from orchestrator.store import Database
from orchestrator.store import tables as t
from orchestrator.store.types import utcnow


def _id() -> str:
    return str(uuid.uuid4())


def task_row(**overrides: Any) -> dict[str, Any]:
    now = utcnow()
    row: dict[str, Any] = {
        "task_id": _id(),
        "task_type": "water_quality",
        "title": "Complaint",
        "context": {"district": "north"},
        "trigger_id": _id(),
        "origin": "live",
        "status": "queued",
        "generation": 1,
        "created_at": now,
        "updated_at": now,
    }
    row.update(overrides)
    return row


def session_row(task_id: str | None, **overrides: Any) -> dict[str, Any]:
    now = utcnow()
    row: dict[str, Any] = {
        "session_id": _id(),
        "purpose": "task_execution" if task_id else "ordinary_chat",
        "task_id": task_id,
        "owner": "tester",
        "title": "s",
        "created_at": now,
        "updated_at": now,
    }
    row.update(overrides)
    return row


def _webhook(task_id: str, **overrides: Any) -> dict[str, Any]:
    now = utcnow()
    row: dict[str, Any] = {
        "kind": "webhook",
        "task_id": task_id,
        "event_seq": 1,
        "body": "{}",
        "status": "pending",
        "next_attempt_at": now,
        "created_at": now,
    }
    row.update(overrides)
    return row


@pytest.fixture
def seeded(db: Database) -> dict[str, str]:
    """One task with a session and a first execution."""
    task = task_row()
    session = session_row(task["task_id"])
    with db.transaction() as conn:
        conn.execute(insert(t.tasks).values(task))
        conn.execute(insert(t.sessions).values(session))
        conn.execute(
            insert(t.executions).values(
                task_id=task["task_id"],
                generation=1,
                session_id=session["session_id"],
                created_at=utcnow(),
            )
        )
    return {"task_id": task["task_id"], "session_id": session["session_id"]}


def _plan(session_id: str, revision: int, request_id: str) -> dict[str, Any]:
    return {
        "session_id": session_id,
        "revision": revision,
        "request_id": request_id,
        "schema_version": "execution-plan@1",
        "title": "p",
        "reason": "r",
        "nodes": [],
        "edges": [],
        "content_digest": "0" * 64,
        "updated_at": utcnow(),
    }


def _receipt(owner: str, identity: str, status: str = "running") -> dict[str, Any]:
    now = utcnow()
    return {
        "invocation_id": _id(),
        "owner": owner,
        "tool_name": "call_api",
        "identity_key": identity,
        "args_digest": "a" * 64,
        "claim_token": _id(),
        "status": status,
        "summary": "claimed",
        "created_at": now,
        "updated_at": now,
    }


Violation = Callable[[Connection, dict[str, str]], object]

VIOLATIONS: dict[str, Violation] = {
    "duplicate trigger_id": lambda c, s: [
        c.execute(insert(t.tasks).values(task_row(trigger_id="same"))) for _ in range(2)
    ],
    "unknown task status": lambda c, s: c.execute(
        insert(t.tasks).values(task_row(status="sleeping"))
    ),
    "unknown task origin": lambda c, s: c.execute(insert(t.tasks).values(task_row(origin="mars"))),
    "generation zero": lambda c, s: c.execute(insert(t.tasks).values(task_row(generation=0))),
    "duplicate (task_id, generation)": lambda c, s: c.execute(
        insert(t.executions).values(
            task_id=s["task_id"], generation=1, session_id=s["session_id"], created_at=utcnow()
        )
    ),
    "unknown execution outcome": lambda c, s: c.execute(
        insert(t.executions).values(
            task_id=s["task_id"],
            generation=2,
            session_id=s["session_id"],
            created_at=utcnow(),
            outcome="vanished",
        )
    ),
    "execution of a missing task": lambda c, s: c.execute(
        insert(t.executions).values(
            task_id=_id(), generation=1, session_id=s["session_id"], created_at=utcnow()
        )
    ),
    "unknown session purpose": lambda c, s: c.execute(
        insert(t.sessions).values(session_row(None, purpose="gossip"))
    ),
    "task session without a task": lambda c, s: c.execute(
        insert(t.sessions).values(session_row(None, purpose="task_execution"))
    ),
    "duplicate (session_id, revision)": lambda c, s: [
        c.execute(insert(t.plan_revisions).values(_plan(s["session_id"], 1, r))) for r in ("a", "b")
    ],
    "duplicate (session_id, request_id)": lambda c, s: [
        c.execute(insert(t.plan_revisions).values(_plan(s["session_id"], n, "same")))
        for n in (1, 2)
    ],
    "plan for a missing session": lambda c, s: c.execute(
        insert(t.plan_revisions).values(_plan(_id(), 1, "x"))
    ),
    "unknown report outcome": lambda c, s: c.execute(
        insert(t.reports).values(
            report_id=_id(),
            task_id=s["task_id"],
            generation=1,
            session_id=s["session_id"],
            summary="s",
            findings=[],
            evidence_refs=[],
            outcome="maybe",
            created_at=utcnow(),
        )
    ),
    "unknown evidence origin": lambda c, s: c.execute(
        insert(t.evidence).values(
            evidence_id=_id(),
            task_id=s["task_id"],
            generation=1,
            session_id=s["session_id"],
            source="scada",
            queried_at=utcnow(),
            content_ref="ref",
            origin="rumour",
            truncated=False,
            summary="s",
            created_at=utcnow(),
        )
    ),
    "unknown action status": lambda c, s: c.execute(
        insert(t.actions).values(
            action_id=_id(),
            task_id=s["task_id"],
            generation=1,
            session_id=s["session_id"],
            node_id="n1",
            kind="work_order",
            payload={},
            status="executed",
            created_at=utcnow(),
        )
    ),
    "unknown action kind": lambda c, s: c.execute(
        insert(t.actions).values(
            action_id=_id(),
            task_id=s["task_id"],
            generation=1,
            session_id=s["session_id"],
            node_id="n1",
            kind="explosion",
            payload={},
            status="pending_approval",
            created_at=utcnow(),
        )
    ),
    "approval without a decider": lambda c, s: c.execute(
        insert(t.actions).values(
            action_id=_id(),
            task_id=s["task_id"],
            generation=1,
            session_id=s["session_id"],
            node_id="n1",
            kind="command",
            payload={},
            status="approved",
            created_at=utcnow(),
        )
    ),
    "duplicate receipt identity": lambda c, s: [
        c.execute(insert(t.invocation_receipts).values(_receipt("task:x", "id-1")))
        for _ in range(2)
    ],
    "unknown receipt status": lambda c, s: c.execute(
        insert(t.invocation_receipts).values(_receipt("task:x", "id-2", status="done"))
    ),
    # `attempts - throttled` counts toward the limit: more throttled than attempts, or fewer
    # than none, would make a webhook undying or dead before its time.
    "outbox throttled above its attempts": lambda c, s: c.execute(
        insert(t.outbox).values(_webhook(s["task_id"], attempts=1, throttled=2))
    ),
    "outbox throttled below zero": lambda c, s: c.execute(
        insert(t.outbox).values(_webhook(s["task_id"], attempts=1, throttled=-1))
    ),
    "unknown message role": lambda c, s: c.execute(
        insert(t.collaboration_messages).values(
            message_id=_id(),
            session_id=s["session_id"],
            role="system",
            text="hi",
            created_at=utcnow(),
        )
    ),
}


def _counts(db: Database) -> dict[str, int]:
    with db.transaction(readonly=True) as conn:
        return {
            name: conn.execute(select(func.count()).select_from(table)).scalar_one()
            for name, table in t.metadata.tables.items()
        }


@pytest.mark.parametrize("case", sorted(VIOLATIONS))
def test_violation_is_refused_and_nothing_is_written(
    db: Database, seeded: dict[str, str], case: str
) -> None:
    before = _counts(db)
    with pytest.raises(ConstraintViolation), db.transaction() as conn:
        # A valid write first: it must be rolled back with the refused one.
        conn.execute(insert(t.tasks).values(task_row()))
        VIOLATIONS[case](conn, seeded)
    assert _counts(db) == before


def test_deleting_a_task_takes_its_records_but_not_an_unresolved_receipt(
    db: Database, seeded: dict[str, str]
) -> None:
    with db.transaction() as conn:
        conn.execute(insert(t.plan_revisions).values(_plan(seeded["session_id"], 1, "r")))
        receipt = _receipt("task:" + seeded["task_id"], "k")  # running: a recovery boundary
        receipt["session_id"] = seeded["session_id"]
        conn.execute(insert(t.invocation_receipts).values(receipt))
    with db.transaction() as conn:
        conn.execute(delete(t.tasks).where(t.tasks.c.task_id == seeded["task_id"]))
    counts = _counts(db)
    for table in ("executions", "sessions", "plan_revisions"):
        assert counts[table] == 0, table
    # Seed 000: running/unknown receipts are never deleted with their session; they stay as
    # orphans (session_id NULL) that retention never removes for age.
    with db.transaction(readonly=True) as conn:
        kept = conn.execute(
            select(t.invocation_receipts.c.status, t.invocation_receipts.c.session_id)
        ).all()
    assert [(row.status, row.session_id) for row in kept] == [("running", None)]


def test_timestamps_come_back_as_aware_utc(db: Database, seeded: dict[str, str]) -> None:
    with db.transaction(readonly=True) as conn:
        created = conn.execute(
            select(t.tasks.c.created_at).where(t.tasks.c.task_id == seeded["task_id"])
        ).scalar_one()
    assert created.utcoffset() is not None
    assert created.utcoffset().total_seconds() == 0


def test_an_outbox_row_may_have_every_attempt_throttled(
    db: Database, seeded: dict[str, str]
) -> None:
    """The bounds are inclusive: the rows the violations above are refused beside are valid."""
    with db.transaction() as conn:
        for attempts, throttled in ((0, 0), (2, 2), (3, 1)):
            row = _webhook(seeded["task_id"], attempts=attempts, throttled=throttled)
            conn.execute(insert(t.outbox).values(row))
    with db.transaction(readonly=True) as conn:
        stored = conn.execute(select(t.outbox.c.attempts, t.outbox.c.throttled)).all()
    assert sorted(tuple(row) for row in stored) == [(0, 0), (2, 2), (3, 1)]
