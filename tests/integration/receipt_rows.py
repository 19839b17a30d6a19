"""Rows the receipt tests need (chat sessions, a running task generation), written directly."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import select, text, update

from orchestrator.domain.fences import Fence
from orchestrator.domain.fingerprints import fingerprint, identity_key
from orchestrator.store import Database
from orchestrator.store.tables import executions, invocation_receipts, metadata, sessions, tasks
from orchestrator.store.types import utcnow

__all__ = [
    "DIGEST",
    "chat_session",
    "claim_arguments",
    "dump_database",
    "running_task",
    "supersede",
    "task_receipt_statuses",
]

#: The digest of the arguments of the claims the receipt tests make by default.
DIGEST = fingerprint({"value": 1})


def claim_arguments(session_id: str | None, **overrides: Any) -> dict[str, Any]:
    """`ReceiptLedger.claim` keywords: alice's `call_api` write in round r1, unless overridden."""
    values: dict[str, Any] = {
        "owner": "alice",
        "session_id": session_id,
        "tool_name": "call_api",
        "identity_key": identity_key("intent", "s", "r1", "call_api", DIGEST),
        "args_digest": DIGEST,
    }
    values.update(overrides)
    return values


def chat_session(db: Database, owner: str = "alice") -> str:
    session_id = str(uuid.uuid4())
    now = utcnow()
    with db.transaction() as conn:
        conn.execute(
            sessions.insert().values(
                session_id=session_id,
                purpose="ordinary_chat",
                owner=owner,
                title="chat",
                created_at=now,
                updated_at=now,
            )
        )
    return session_id


def running_task(db: Database, generation: int = 1) -> tuple[str, str, Fence]:
    """A task whose `generation` is running under a lease: (task_id, session_id, fence)."""
    task_id = str(uuid.uuid4())
    session_id = str(uuid.uuid4())
    token = uuid.uuid4().hex
    now = utcnow()
    with db.transaction() as conn:
        conn.execute(
            tasks.insert().values(
                task_id=task_id,
                task_type="complaint",
                title="t",
                context={},
                trigger_id=f"trigger-{task_id}",
                origin="live",
                status="running",
                generation=generation,
                session_id=session_id,
                created_at=now,
                updated_at=now,
            )
        )
        conn.execute(
            sessions.insert().values(
                session_id=session_id,
                purpose="task_execution",
                task_id=task_id,
                generation=generation,
                owner=f"task:{task_id}",
                title="execution",
                created_at=now,
                updated_at=now,
            )
        )
        conn.execute(
            executions.insert().values(
                task_id=task_id,
                generation=generation,
                session_id=session_id,
                lease_token=token,
                created_at=now,
                started_at=now,
            )
        )
    return task_id, session_id, Fence(task_id, generation, token)


def supersede(db: Database, fence: Fence) -> tuple[str, Fence]:
    """Start generation n+1 of the task (the sweeper's requeue): (new session_id, new fence)."""
    new_generation = fence.generation + 1
    session_id = str(uuid.uuid4())
    token = uuid.uuid4().hex
    now = utcnow()
    with db.transaction() as conn:
        conn.execute(
            update(executions)
            .where(
                executions.c.task_id == fence.task_id,
                executions.c.generation == fence.generation,
            )
            .values(outcome="lost", ended_at=now)
        )
        conn.execute(
            sessions.insert().values(
                session_id=session_id,
                purpose="task_execution",
                task_id=fence.task_id,
                generation=new_generation,
                owner=f"task:{fence.task_id}",
                title="execution",
                created_at=now,
                updated_at=now,
            )
        )
        conn.execute(
            executions.insert().values(
                task_id=fence.task_id,
                generation=new_generation,
                session_id=session_id,
                lease_token=token,
                created_at=now,
                started_at=now,
            )
        )
        conn.execute(
            update(tasks)
            .where(tasks.c.task_id == fence.task_id)
            .values(generation=new_generation, session_id=session_id, updated_at=now)
        )
    return session_id, Fence(fence.task_id, new_generation, token)


def dump_database(db: Database) -> str:
    """Every row of every table the database has (not only the known ones), as one text."""
    chunks: list[str] = []
    with db.transaction(readonly=True) as conn:
        if db.dialect == "postgresql":
            names = conn.execute(
                text(
                    "SELECT schemaname || '.' || tablename FROM pg_tables "
                    "WHERE schemaname NOT IN ('pg_catalog', 'information_schema')"
                )
            ).scalars()
        else:
            names = conn.execute(
                text("SELECT name FROM sqlite_master WHERE type = 'table'")
            ).scalars()
        listed = list(names)
        assert set(metadata.tables) <= {name.split(".")[-1] for name in listed}
        for name in listed:
            rows: list[Any] = list(conn.execute(text(f"SELECT * FROM {name}")).all())
            chunks.append(f"{name}: {rows!r}")
        chunks.append(repr(conn.execute(select(sessions)).all()))
    return "\n".join(chunks)


def task_receipt_statuses(db: Database, task_id: str) -> list[str]:
    """The statuses of a task's receipts, oldest first."""
    with db.transaction(readonly=True) as conn:
        rows = conn.execute(
            select(invocation_receipts.c.status)
            .where(invocation_receipts.c.owner == f"task:{task_id}")
            .order_by(invocation_receipts.c.created_at)
        )
        return [row.status for row in rows]
