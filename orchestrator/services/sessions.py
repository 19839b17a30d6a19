"""Sessions by purpose: create one, read one, list them (ordinary chats unless asked otherwise)."""

from __future__ import annotations

import base64
import binascii
import json
import uuid
from collections.abc import Callable
from datetime import UTC, datetime

from sqlalchemy import Connection

from orchestrator.domain.vocabulary import SESSION_PURPOSES
from orchestrator.errors import NotFound, ValidationFailed
from orchestrator.store import sessions as store
from orchestrator.store.db import Database
from orchestrator.store.sessions import SessionRecord
from orchestrator.store.types import utcnow

__all__ = ["MAX_LIMIT", "SessionPage", "SessionService", "create_session_txn"]

MAX_LIMIT = 200
MAX_OWNER = 128
MAX_TITLE = 200


class SessionPage:
    """One page of sessions and the cursor of the next page (None on the last one)."""

    def __init__(self, items: list[SessionRecord], next_cursor: str | None) -> None:
        self.items = items
        self.next_cursor = next_cursor


def _fail(code: str, message: str, field: str) -> ValidationFailed:
    return ValidationFailed(
        message, code=code, details=[{"code": code, "message": message, "field": field}]
    )


def create_session_txn(
    conn: Connection,
    *,
    purpose: str,
    title: str,
    owner: str,
    task_id: str | None = None,
    generation: int | None = None,
    session_id: str | None = None,
    now: datetime | None = None,
) -> SessionRecord:
    """Check and insert a session inside the caller's transaction (executions use this)."""
    if purpose not in SESSION_PURPOSES:
        raise _fail(
            "invalid_purpose", f"purpose must be one of {', '.join(SESSION_PURPOSES)}", "purpose"
        )
    if not title.strip() or len(title) > MAX_TITLE:
        raise _fail("field_too_long", f"title must be 1-{MAX_TITLE} characters", "title")
    if not owner or len(owner) > MAX_OWNER:
        raise _fail("field_too_long", f"owner must be 1-{MAX_OWNER} characters", "owner")
    if "\x00" in title or "\x00" in owner:
        # Postgres text cannot hold NUL; refusing it keeps both stores alike.
        raise _fail("invalid_character", "title and owner cannot contain NUL", "title")
    if purpose != "ordinary_chat" and task_id is None:
        raise _fail(
            "task_required", f"a {purpose} session belongs to a task: give task_id", "task_id"
        )
    if task_id is not None and not store.task_exists(conn, task_id):
        raise _fail("unknown_task", f"task {task_id} does not exist", "task_id")
    stamp = now or utcnow()
    record = SessionRecord(
        session_id=session_id or str(uuid.uuid4()),
        purpose=purpose,
        task_id=task_id,
        generation=generation,
        owner=owner,
        title=title,
        created_at=stamp,
        updated_at=stamp,
    )
    store.insert_session(conn, record)
    return record


def encode_cursor(record: SessionRecord) -> str:
    raw = json.dumps([record.created_at.isoformat(), record.session_id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """The (created_at in UTC, session_id) of a cursor; anything else is 422 `invalid_cursor`.

    The conversion to UTC happens here, inside the check: a forged offset near the ends of the
    calendar ("0001-01-01T00:00:00+01:00") overflows, and must not reach the store.
    """
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        stamp, session_id = json.loads(raw)
        if not isinstance(stamp, str) or not isinstance(session_id, str):
            raise ValueError("bad cursor")
        moment = datetime.fromisoformat(stamp)
        if moment.tzinfo is None:
            raise ValueError("bad cursor")
        moment = moment.astimezone(UTC)
    except (ValueError, TypeError, OverflowError, binascii.Error, UnicodeDecodeError):
        raise _fail("invalid_cursor", "cursor is not one this API returned", "cursor") from None
    return moment, session_id


class SessionService:
    """Sessions over one `Database`."""

    def __init__(self, db: Database, clock: Callable[[], datetime] = utcnow) -> None:
        self.db = db
        self.clock = clock

    def create_session(
        self,
        *,
        purpose: str,
        title: str,
        owner: str = "api",
        task_id: str | None = None,
        generation: int | None = None,
    ) -> SessionRecord:
        """Create a session; task sessions need an existing task."""
        with self.db.transaction() as conn:
            return create_session_txn(
                conn,
                purpose=purpose,
                title=title,
                owner=owner,
                task_id=task_id,
                generation=generation,
                now=self.clock(),
            )

    def get_session(self, session_id: str) -> SessionRecord:
        with self.db.transaction(readonly=True) as conn:
            record = store.get_session(conn, session_id)
        if record is None:
            raise NotFound(f"session {session_id} does not exist")
        return record

    def list_sessions(
        self,
        *,
        purpose: str | None = None,
        task_id: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> SessionPage:
        """Newest first. Without a filter only `ordinary_chat`; task sessions need asking for."""
        if purpose is not None and purpose not in SESSION_PURPOSES:
            raise _fail(
                "invalid_purpose",
                f"purpose must be one of {', '.join(SESSION_PURPOSES)}",
                "purpose",
            )
        if not 1 <= limit <= MAX_LIMIT:
            raise _fail("invalid_limit", f"limit must be between 1 and {MAX_LIMIT}", "limit")
        if purpose is None and task_id is None:
            purpose = "ordinary_chat"
        after = decode_cursor(cursor) if cursor else None
        with self.db.transaction(readonly=True) as conn:
            # One extra row tells whether another page exists.
            rows = store.list_sessions(
                conn, purpose=purpose, task_id=task_id, limit=limit + 1, after=after
            )
        items = rows[:limit]
        next_cursor = encode_cursor(items[-1]) if len(rows) > limit else None
        return SessionPage(items, next_cursor)
