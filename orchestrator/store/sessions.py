"""Sessions: insert, read, lock, and list by purpose or task with a keyset cursor."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from types import SimpleNamespace
from typing import Any

from sqlalchemy import Connection, Row, bindparam, insert, or_, select

from orchestrator.domain.times import wire_time
from orchestrator.store.keyset import past
from orchestrator.store.tables import sessions, tasks

__all__ = [
    "SessionRecord",
    "get_session",
    "insert_session",
    "list_sessions",
    "task_exists",
]


@dataclass(frozen=True)
class SessionRecord:
    """One session row."""

    session_id: str
    purpose: str
    task_id: str | None
    generation: int | None
    owner: str
    title: str
    created_at: datetime
    updated_at: datetime

    @classmethod
    def from_row(cls, row: Row[Any] | SimpleNamespace) -> SessionRecord:
        return cls(
            session_id=row.session_id,
            purpose=row.purpose,
            task_id=row.task_id,
            generation=row.generation,
            owner=row.owner,
            title=row.title,
            created_at=row.created_at,
            updated_at=row.updated_at,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "purpose": self.purpose,
            "task_id": self.task_id,
            "generation": self.generation,
            "owner": self.owner,
            "title": self.title,
            "created_at": wire_time(self.created_at),
            "updated_at": wire_time(self.updated_at),
        }


def insert_session(conn: Connection, record: SessionRecord) -> None:
    conn.execute(
        insert(sessions).values(
            session_id=record.session_id,
            purpose=record.purpose,
            task_id=record.task_id,
            generation=record.generation,
            owner=record.owner,
            title=record.title,
            created_at=record.created_at,
            updated_at=record.updated_at,
        )
    )


_SESSION = select(sessions).where(sessions.c.session_id == bindparam("session_id"))
_LOCKED_SESSION = _SESSION.with_for_update()


def get_session(conn: Connection, session_id: str, *, lock: bool = False) -> SessionRecord | None:
    """The session, or None; `lock` takes its row lock (FOR UPDATE) until the transaction ends."""
    query = _LOCKED_SESSION if lock else _SESSION
    row = conn.execute(query, {"session_id": session_id}).one_or_none()
    return SessionRecord.from_row(row) if row is not None else None


def task_exists(conn: Connection, task_id: str) -> bool:
    return (
        conn.execute(select(tasks.c.task_id).where(tasks.c.task_id == task_id)).first() is not None
    )


def list_sessions(
    conn: Connection,
    *,
    purpose: str | None,
    task_id: str | None,
    limit: int,
    after: tuple[datetime, str] | None = None,
    owner: str | None = None,
) -> list[SessionRecord]:
    """Newest first; `after` is the (created_at, session_id) of the last row already seen.
    With `owner`, a person's sessions (chats, collaborations) are that owner's only; a task's
    execution sessions are the task's, listed for anyone."""
    query = select(sessions)
    if purpose is not None:
        query = query.where(sessions.c.purpose == purpose)
    if owner is not None:
        query = query.where(or_(sessions.c.purpose == "task_execution", sessions.c.owner == owner))
    if task_id is not None:
        query = query.where(sessions.c.task_id == task_id)
    if after is not None:
        query = query.where(past(sessions.c.created_at, sessions.c.session_id, after))
    query = query.order_by(sessions.c.created_at.desc(), sessions.c.session_id.desc()).limit(limit)
    return [SessionRecord.from_row(row) for row in conn.execute(query)]
