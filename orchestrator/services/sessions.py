"""Sessions by purpose: create one, read one, list them (ordinary chats unless asked otherwise)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime

from sqlalchemy import Connection

from orchestrator.domain.cursors import decode_cursor, encode_cursor
from orchestrator.domain.storable import NAME_MAX
from orchestrator.domain.vocabulary import SESSION_PURPOSES
from orchestrator.errors import ConflictError, Forbidden, NotFound, ValidationFailed, echoed
from orchestrator.store import sessions as store
from orchestrator.store import tasks as task_store
from orchestrator.store.collaboration import collaboration_session_of
from orchestrator.store.db import Database
from orchestrator.store.receipts import delete_session_txn
from orchestrator.store.sessions import SessionRecord
from orchestrator.store.types import utcnow

__all__ = ["MAX_LIMIT", "SessionPage", "SessionService", "create_session_txn"]

MAX_LIMIT = 200
#: Whose session: a person (an account's name, or whom the shared token names), as long as who
#: acted may be, or a task (`task:<id>`, shorter).
MAX_OWNER = NAME_MAX
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
            if purpose == "task_collaboration" and task_id is not None:
                _no_collaboration_session_yet(conn, task_id, owner)
            return create_session_txn(
                conn,
                purpose=purpose,
                title=title,
                owner=owner,
                task_id=task_id,
                generation=generation,
                now=self.clock(),
            )

    def get_session(self, session_id: str, *, caller: str | None = None) -> SessionRecord:
        """One session; with `caller` (a named account), another person's chat or
        collaboration is refused (a task's execution session is the task's)."""
        with self.db.transaction(readonly=True) as conn:
            record = store.get_session(conn, session_id)
        if record is None:
            raise NotFound(f"session {echoed(session_id)} does not exist")
        if caller is not None and record.purpose != "task_execution" and record.owner != caller:
            raise Forbidden(f"session {session_id} is another person's", code="not_session_owner")
        return record

    def delete_session(self, session_id: str, *, caller: str | None = None) -> int:
        """Delete a chat or a collaboration session with what it holds: its plans, messages,
        snapshots and transcript, and its finished receipts (seed 000: receipts go with their
        session); `running` and `unknown` receipts stay, as orphans, for a recovery to verify
        (DESIGN invariant 20). How many receipts went.

        Refused: 404 for no session, `403 not_session_owner` for another person's, `409
        execution_session` for a task's execution session (the task's record, which follows
        the retention period instead)."""
        with self.db.transaction() as conn:
            record = store.get_session(conn, session_id, lock=True)
            if record is None:
                raise NotFound(f"session {echoed(session_id)} does not exist")
            if record.purpose == "task_execution":
                raise ConflictError(
                    f"session {session_id} is an execution of task {record.task_id}: the task's "
                    "record, kept with the task and deleted by retention, never on its own",
                    code="execution_session",
                )
            if caller is not None and record.owner != caller:
                raise Forbidden(
                    f"session {session_id} is another person's", code="not_session_owner"
                )
            return delete_session_txn(conn, session_id)

    def list_sessions(
        self,
        *,
        purpose: str | None = None,
        task_id: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
        owner: str | None = None,
    ) -> SessionPage:
        """Newest first. Without a filter only `ordinary_chat`; task sessions need asking for.
        With `owner` (a named account), other people's chats and collaborations are left out."""
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
                conn, purpose=purpose, task_id=task_id, limit=limit + 1, after=after, owner=owner
            )
        items = rows[:limit]
        more = len(rows) > limit and items
        next_cursor = encode_cursor(items[-1].created_at, items[-1].session_id) if more else None
        return SessionPage(items, next_cursor)


def _no_collaboration_session_yet(conn: Connection, task_id: str, owner: str) -> None:
    """A person has one collaboration session per task (`CollaborationService.open` makes it
    and reads it back): a second one would take questions that no one reads."""
    task_store.get_task(conn, task_id, lock=True)  # as `open` does: one at a time per task
    existing = collaboration_session_of(conn, task_id, owner)
    if existing is not None:
        raise ConflictError(
            f"{owner} has a collaboration session about task {task_id} already "
            f"({existing.session_id}); "
            f"POST /api/v1/tasks/{task_id}/collaboration returns it",
            code="collaboration_exists",
        )
