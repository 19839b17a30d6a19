"""An operator's acts on the outbox's rows: retry a dead letter (fresh counts) or hurry a
failing one (counts kept), one or all at once, and discard one dealt with by hand.

Each act records who made it and when (`retried_by`, `discarded_by`); a retry or discard of a
task's dead letter releases the task's later events it held back (`released_at`, from which the
oldest-pending gauge times their wait). The service (`orchestrator.services.outbox`) says why
an act is refused: a row a dispatcher has posted is not discarded nor hurried.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Connection, and_, case, func, or_, select, update

from orchestrator.store.tables import attempted_pending, outbox
from orchestrator.store.types import utcnow

__all__ = [
    "discard",
    "hurry_all_pending",
    "hurry_pending",
    "retry_all_dead",
    "retry_dead",
]


def _retried(now: datetime, by: str, note: str | None) -> dict[str, Any]:
    """The record an operator's retry leaves on each row it retries: when, who, their note."""
    return {"retried_at": now, "retried_by": by, "retry_note": note}


def _revived(now: datetime, by: str, note: str | None) -> dict[str, Any]:
    """A dead row an operator retried: pending and due now with fresh counts, released now (its
    wait counts from here), and the retry's record (`_retried`)."""
    return {
        "status": "pending",
        "attempts": 0,
        "throttled": 0,
        "next_attempt_at": now,
        "released_at": now,
        **_retried(now, by, note),
    }


def retry_dead(conn: Connection, outbox_id: int, *, by: str, note: str | None = None) -> bool:
    """An operator's retry: a dead row is due again now, with fresh attempt and throttled
    counts, released now (as are the pending webhooks of its task, which it held back), and
    who retried it recorded."""
    now = utcnow()
    _release_held_behind(conn, [outbox.c.outbox_id == outbox_id, outbox.c.status == "dead"], now)
    return (
        conn.execute(
            update(outbox)
            .where(outbox.c.outbox_id == outbox_id, outbox.c.status == "dead")
            .values(**_revived(now, by, note))
        ).rowcount
        == 1
    )


def hurry_pending(conn: Connection, outbox_id: int, *, by: str, note: str | None = None) -> bool:
    """An operator's retry of a pending row (failing, backing off): due now, its counts kept
    (it is not dead). False when the row is not pending, or a dispatcher is sending it (its
    claim's hold not run out): made due meanwhile, a second dispatcher would send it while the
    first waits for its answer. On Postgres a claim being written holds the row's lock: this
    waits for it and then finds the row claimed."""
    now = utcnow()
    return (
        conn.execute(
            update(outbox)
            .where(
                outbox.c.outbox_id == outbox_id,
                outbox.c.status == "pending",
                or_(outbox.c.claimed_until.is_(None), outbox.c.claimed_until <= now),
            )
            .values(next_attempt_at=now, **_retried(now, by, note))
        ).rowcount
        == 1
    )


def hurry_all_pending(
    conn: Connection, *, kind: str | None, task_id: str | None, by: str, note: str | None = None
) -> tuple[int, int]:
    """`hurry_pending` for every pending row (of `kind`, of `task_id`) that failed and waits
    out its backoff: after an outage of the backend, all of them due now in one statement.
    Those a dispatcher is sending are left to it. How many were made due, and how many were
    being sent."""
    now = utcnow()
    conditions = [attempted_pending, outbox.c.next_attempt_at > now]
    if kind is not None:
        conditions.append(outbox.c.kind == kind)
    if task_id is not None:
        conditions.append(outbox.c.task_id == task_id)
    free = or_(outbox.c.claimed_until.is_(None), outbox.c.claimed_until <= now)
    hurried = conn.execute(
        update(outbox)
        .where(*conditions, free)
        .values(next_attempt_at=now, **_retried(now, by, note))
    )
    sending = conn.execute(
        select(func.count()).select_from(outbox).where(*conditions, ~free)
    ).scalar_one()
    return int(hurried.rowcount), int(sending)


def retry_all_dead(
    conn: Connection, *, kind: str | None, task_id: str | None, by: str, note: str | None = None
) -> int:
    """`retry_dead` for every dead row (of `kind`, of `task_id`): after an outage or a secret
    that was not the backend's, each dead letter is due again in one statement. How many."""
    conditions = [outbox.c.status == "dead"]
    if kind is not None:
        conditions.append(outbox.c.kind == kind)
    if task_id is not None:
        conditions.append(outbox.c.task_id == task_id)
    now = utcnow()
    _release_held_behind(conn, conditions, now)
    result = conn.execute(update(outbox).where(*conditions).values(**_revived(now, by, note)))
    return int(result.rowcount)


def discard(conn: Connection, outbox_id: int, *, by: str, reason: str) -> bool:
    """An operator's discard: a dead row, or a pending one no dispatcher has posted (one that
    waits its turn in a batch too), is settled by hand, never sent again, and its task's later
    events go on (released now); it keeps what it was (`discarded_from`). False when it is
    neither: delivered or discarded already, or posted (`sending_since`, its hold not run out).
    A dispatcher posts a row only after `start_send`'s compare-and-set (pending, its claim's
    attempt): both update the row, so on Postgres the later waits for the earlier's lock and
    re-reads it; either the post is skipped or this finds it posted. A claim being written
    holds the lock too; one while this is written skips the locked row."""
    now = utcnow()
    discardable = [
        outbox.c.outbox_id == outbox_id,
        or_(
            outbox.c.status == "dead",
            and_(
                outbox.c.status == "pending",
                or_(
                    outbox.c.claimed_until.is_(None),
                    outbox.c.claimed_until <= now,
                    outbox.c.sending_since.is_(None),  # claimed, waiting its turn: not posted
                ),
            ),
        ),
    ]
    # A claim it meets unposted (waiting its turn, or its dispatcher gone before the post)
    # never sends it now: its attempt is taken back, as `release_claim` does. One posted keeps
    # it, and so do earlier claims never posted (their dispatchers died: the attempt budget).
    unposted = and_(
        outbox.c.claimed_until.is_not(None),
        outbox.c.sending_since.is_(None),
        outbox.c.attempts > outbox.c.throttled,  # a claim's own attempt is never a throttled one
    )
    _release_held_behind(conn, discardable, now)
    return (
        conn.execute(
            update(outbox)
            .where(*discardable)
            .values(
                # The status before this statement: `dead` or `pending`.
                discarded_from=outbox.c.status,
                attempts=case((unposted, outbox.c.attempts - 1), else_=outbox.c.attempts),
                status="discarded",
                discarded_at=now,
                discarded_by=by,
                discard_reason=reason,
                claimed_until=None,
                sending_since=None,
            )
        ).rowcount
        == 1
    )


def _release_held_behind(conn: Connection, dead: list[ColumnElement[bool]], now: datetime) -> None:
    """Stamp `released_at` on the pending webhooks of the tasks of the `dead` webhooks an
    operator retries or discards (read before that write; a failing one discarded while
    pending too): a task's events go in order, so its pending ones waited behind it, for the
    operator, not for the dispatcher. The oldest-pending gauge measures their wait from now
    (`oldest_deliverable`)."""
    tasks_of_dead = select(outbox.c.task_id).where(*dead, outbox.c.kind == "webhook")
    conn.execute(
        update(outbox)
        .where(
            outbox.c.kind == "webhook",
            outbox.c.status == "pending",
            outbox.c.task_id.in_(tasks_of_dead),
            # Not a pending one discarded itself: it is settled, not deliverable again.
            outbox.c.outbox_id.not_in(select(outbox.c.outbox_id).where(*dead)),
        )
        .values(released_at=now)
    )
