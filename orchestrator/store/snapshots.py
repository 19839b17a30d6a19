"""Recovery snapshots, one per session (a session belongs to one generation).

A snapshot taken by the round itself (`replace=True`) wins over one built later from the durable
transcript (`replace=False`, kept only if none exists): the round also knows the results the
store could no longer take once its lease was gone.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, insert, select, update

from orchestrator.domain.recovery import Snapshot
from orchestrator.store.tables import recovery_snapshots
from orchestrator.store.types import stored_list, utcnow

__all__ = ["bound_wait", "get_snapshot", "save_snapshot"]


def bound_wait(conn: Connection, seconds: float) -> None:
    """No statement of this transaction waits longer than `seconds` (a lock held elsewhere, a
    slow server): it fails instead. Postgres only; SQLite's connections already give up on a
    lock after their busy timeout."""
    if conn.dialect.name == "postgresql":
        milliseconds = max(1, int(seconds * 1000))
        conn.exec_driver_sql(f"SET LOCAL lock_timeout = {milliseconds}")
        conn.exec_driver_sql(f"SET LOCAL statement_timeout = {milliseconds}")


def save_snapshot(
    conn: Connection,
    session_id: str,
    snapshot: Snapshot,
    *,
    messages: list[dict[str, Any]] | None = None,
    replace: bool = True,
) -> bool:
    """Store `snapshot` for `session_id`; False when one existed and `replace` is False."""
    values = {
        "messages": messages or [],
        "receipts": list(snapshot.received),
        "unknown_calls": list(snapshot.unknown),
        "summary": {
            "reason": snapshot.reason,
            "generation": snapshot.generation,
            "last_plan": snapshot.last_plan,
        },
        "updated_at": utcnow(),
    }
    table = recovery_snapshots
    exists = conn.execute(
        select(table.c.session_id).where(table.c.session_id == session_id).with_for_update()
    ).first()
    if exists is not None:
        if not replace:
            return False
        conn.execute(update(table).where(table.c.session_id == session_id).values(**values))
        return True
    conn.execute(insert(table).values(session_id=session_id, **values))
    return True


def get_snapshot(conn: Connection, session_id: str) -> Snapshot | None:
    row = conn.execute(
        select(recovery_snapshots).where(recovery_snapshots.c.session_id == session_id)
    ).one_or_none()
    if row is None:
        return None
    summary = row.summary if isinstance(row.summary, dict) else {}
    return Snapshot(
        reason=str(summary.get("reason") or "the round ended abnormally"),
        generation=summary.get("generation"),
        received=_calls(row.receipts),
        unknown=_calls(row.unknown_calls),
        last_plan=summary.get("last_plan"),
    )


def _calls(stored: Any) -> tuple[Any, ...]:
    """A stored list of calls as it is; a single value an older version stored as one call: a
    reader shows what it cannot read."""
    return tuple(stored_list(stored))
