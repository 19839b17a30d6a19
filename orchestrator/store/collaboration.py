"""Collaboration messages: a person's questions and the agent's answers about one task.

Kept in their own table (seed 004: 协作会话独立持久化用户与 Agent 的问答文本), never mixed with an
execution's messages. Paged by (created_at, message_id), oldest first.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Row, and_, insert, or_, select

from orchestrator.store.sessions import SessionRecord
from orchestrator.store.tables import collaboration_messages, sessions

__all__ = [
    "KeyedAsk",
    "MessageRecord",
    "asked_with_key",
    "collaboration_session_of",
    "insert_message",
    "latest_messages",
    "list_messages",
]


@dataclass(frozen=True)
class MessageRecord:
    message_id: str
    session_id: str
    role: str
    text: str
    created_at: datetime

    @classmethod
    def from_row(cls, row: Row[Any]) -> MessageRecord:
        return cls(row.message_id, row.session_id, row.role, row.text, row.created_at)


def collaboration_session_of(conn: Connection, task_id: str, owner: str) -> SessionRecord | None:
    """`owner`'s collaboration session about the task (the oldest, should two exist)."""
    row = conn.execute(
        select(sessions)
        .where(
            sessions.c.task_id == task_id,
            sessions.c.purpose == "task_collaboration",
            sessions.c.owner == owner,
        )
        .order_by(sessions.c.created_at, sessions.c.session_id)
        .limit(1)
    ).one_or_none()
    return SessionRecord.from_row(row) if row is not None else None


def insert_message(
    conn: Connection,
    session_id: str,
    role: str,
    text: str,
    at: datetime,
    *,
    idempotency_key: str | None = None,
    request_digest: str | None = None,
) -> MessageRecord:
    """One message; with `idempotency_key`, a second question (or answer) under the same key
    in the session is refused by the unique index (`ConstraintViolation` at commit)."""
    record = MessageRecord(str(uuid.uuid4()), session_id, role, text, at)
    conn.execute(
        insert(collaboration_messages).values(
            message_id=record.message_id,
            session_id=session_id,
            role=role,
            text=text,
            created_at=at,
            idempotency_key=idempotency_key,
            request_digest=request_digest,
        )
    )
    return record


@dataclass(frozen=True)
class KeyedAsk:
    """A question stored under an idempotency key, its answer, and the digest of the request."""

    question: MessageRecord
    answer: MessageRecord
    request_digest: str


def asked_with_key(conn: Connection, session_id: str, idempotency_key: str) -> KeyedAsk | None:
    """The question and answer stored under `idempotency_key` in the session, if any."""
    t = collaboration_messages
    rows = {
        row.role: row
        for row in conn.execute(
            select(t).where(t.c.session_id == session_id, t.c.idempotency_key == idempotency_key)
        )
    }
    if "user" not in rows or "agent" not in rows:  # the two commit together
        return None
    question = rows["user"]
    return KeyedAsk(
        MessageRecord.from_row(question),
        MessageRecord.from_row(rows["agent"]),
        str(question.request_digest),
    )


def list_messages(
    conn: Connection, session_id: str, *, after: tuple[datetime, str] | None, limit: int
) -> list[MessageRecord]:
    """Oldest first; `after` is the (created_at, message_id) of the last message seen."""
    t = collaboration_messages
    query = select(t).where(t.c.session_id == session_id)
    if after is not None:
        at, message_id = after
        query = query.where(
            or_(t.c.created_at > at, and_(t.c.created_at == at, t.c.message_id > message_id))
        )
    query = query.order_by(t.c.created_at, t.c.message_id).limit(limit)
    return [MessageRecord.from_row(row) for row in conn.execute(query)]


def latest_messages(conn: Connection, session_id: str, limit: int) -> list[MessageRecord]:
    """The newest `limit` messages, oldest first (the conversation a new question follows)."""
    t = collaboration_messages
    query = (
        select(t)
        .where(t.c.session_id == session_id)
        .order_by(t.c.created_at.desc(), t.c.message_id.desc())
        .limit(limit)
    )
    return [MessageRecord.from_row(row) for row in conn.execute(query)][::-1]
