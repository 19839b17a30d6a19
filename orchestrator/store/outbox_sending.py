"""The dispatcher's path through the outbox: claim due rows, post them one at a time, record
each answer.

The dispatcher (`orchestrator.services.outbox`) claims due rows here (the claim, with its
attempt counted and a hold, commits before anything is sent), posts each after a
compare-and-set on its claim (`start_send`), renews the hold while a send lasts (and that of
the rows of its batch waiting their turn, at each post and renewal), and records
the answer: delivered, or failed and due again, throttled, or dead. The claim's attempt count is
its compare-and-set token: a row whose hold ran out and that another dispatcher claimed is no
longer this claim's to post or record.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, and_, case, exists, literal, or_, select, update

from orchestrator.store.outbox import OutboxRow
from orchestrator.store.tables import outbox, unsettled
from orchestrator.store.types import utcnow

__all__ = [
    "claim_due",
    "mark_delivered",
    "mark_failed",
    "release_claim",
    "renew_claim",
    "start_send",
]


def claim_due(
    conn: Connection, kinds: tuple[str, ...], *, limit: int, hold_seconds: float
) -> list[OutboxRow]:
    """Due rows of `kinds`, each held for `hold_seconds` with its attempt counted.

    A webhook is due only when every earlier event of its task was delivered or discarded (in
    order per task; a dead one holds the later ones back until an operator retries or
    discards it). The hold is
    committed before anything is sent: a dispatcher killed mid-send leaves the row due again
    once the hold runs out, never lost. Postgres: `FOR UPDATE SKIP LOCKED`, so dispatchers
    share the work; SQLite: the write transaction is exclusive anyway.
    """
    if not kinds:
        return []
    now = utcnow()
    earlier = outbox.alias("earlier")
    held_back = exists().where(
        earlier.c.task_id == outbox.c.task_id,
        earlier.c.kind == "webhook",
        unsettled(earlier),  # from its partial index: not the task's delivered ones
        earlier.c.event_seq < outbox.c.event_seq,
    )
    query = (
        select(outbox)
        .where(
            outbox.c.status == "pending",
            outbox.c.next_attempt_at <= now,
            outbox.c.kind.in_(kinds),
            or_(outbox.c.kind == "action", ~held_back),
        )
        .order_by(outbox.c.next_attempt_at, outbox.c.outbox_id)
        .limit(limit)
    )
    if conn.dialect.name == "postgresql":
        query = query.with_for_update(skip_locked=True, of=outbox)
    rows = [OutboxRow.from_row(row) for row in conn.execute(query)]
    if not rows:
        return []
    until = now + timedelta(seconds=hold_seconds)
    conn.execute(
        update(outbox)
        .where(outbox.c.outbox_id.in_([row.outbox_id for row in rows]))
        .values(
            attempts=outbox.c.attempts + 1,
            next_attempt_at=until,
            claimed_until=until,
            sending_since=None,  # posted one by one (`start_send`), not at the claim
        )
    )
    return [
        OutboxRow(
            **{
                **row.__dict__,
                "attempts": row.attempts + 1,
                "next_attempt_at": until,
                "claimed_until": until,
                "sending_since": None,
            }
        )
        for row in rows
    ]


def start_send(
    conn: Connection, row: OutboxRow, *, hold_seconds: float, waiting: Sequence[OutboxRow] = ()
) -> bool:
    """`renew_claim` just before the claimed `row` is posted, recording when (`sending_since`):
    from then it is being sent, where the rows of the batch after it wait their turn (those of
    `waiting` held again in the same statement). False, and nothing recorded, when the row is
    no longer this claim's (then it must not be sent)."""
    now = utcnow()
    return _hold(conn, row, waiting, until=now + timedelta(seconds=hold_seconds), posted_at=now)


def renew_claim(
    conn: Connection, row: OutboxRow, *, hold_seconds: float, waiting: Sequence[OutboxRow] = ()
) -> bool:
    """Hold the claimed `row` again, from now, while its send lasts, and the rows of its batch
    still waiting their turn (`waiting`) with it: a batch is sent one row after another, and
    a waiting row whose hold ran out was claimed by another dispatcher, an attempt counted that
    this one, finding it taken at its turn, never posted (a webhook was dead-lettered before it
    was posted ORCH_WEBHOOK_MAX_ATTEMPTS times). A dispatcher killed holds them no more: they
    are due again when the hold runs out. False when the row is no longer this claim's:
    another dispatcher claimed it since (compare-and-set on the attempt count), or it is no
    longer pending; then it must not be sent."""
    until = utcnow() + timedelta(seconds=hold_seconds)
    return _hold(conn, row, waiting, until=until)


def _hold(
    conn: Connection,
    row: OutboxRow,
    waiting: Sequence[OutboxRow],
    *,
    until: datetime,
    posted_at: datetime | None = None,
) -> bool:
    """Hold `row` and the rows of `waiting` until `until`, each while still pending under its
    claim's attempt count (one a discard settled, or another dispatcher claimed, is left
    alone), `row` recorded as posted at `posted_at` when given; one statement. Whether `row`
    was."""
    values: dict[str, Any] = {"next_attempt_at": until, "claimed_until": until}
    if posted_at is not None:
        values["sending_since"] = case(
            (outbox.c.outbox_id == row.outbox_id, literal(posted_at, outbox.c.sending_since.type)),
            else_=outbox.c.sending_since,
        )
    claims = [
        and_(outbox.c.outbox_id == claimed.outbox_id, outbox.c.attempts == claimed.attempts)
        for claimed in (row, *waiting)
    ]
    held = conn.execute(
        update(outbox)
        .where(outbox.c.status == "pending", or_(*claims))
        .values(**values)
        .returning(outbox.c.outbox_id)
    ).scalars()
    return row.outbox_id in set(held)


def release_claim(conn: Connection, row: OutboxRow) -> bool:
    """Give back a claimed `row` that was not sent (its dispatcher is stopping): due again now,
    its attempt not counted. False when the row is no longer this claim's (as `renew_claim`)."""
    return _update_claim(
        conn,
        row,
        attempts=row.attempts - 1,
        next_attempt_at=utcnow(),
        claimed_until=None,
        sending_since=None,
    )


def _update_claim(conn: Connection, row: OutboxRow, **values: Any) -> bool:
    """Set `values` on `row` while it is still pending under this claim's attempt count."""
    return (
        conn.execute(
            update(outbox)
            .where(
                outbox.c.outbox_id == row.outbox_id,
                outbox.c.status == "pending",
                outbox.c.attempts == row.attempts,
            )
            .values(**values)
        ).rowcount
        == 1
    )


def mark_delivered(conn: Connection, outbox_id: int) -> OutboxRow | None:
    """Record a 2xx: the row as delivered, or None when it was already. A row an operator
    discarded while its send was under way (its hold had run out) is delivered too, the
    backend having acted on it, and keeps who discarded it, when and why: delivered after
    its discard (`OutboxRow.delivered_after_discard`), neither fact hidden."""
    row = conn.execute(
        update(outbox)
        .where(outbox.c.outbox_id == outbox_id, outbox.c.status != "delivered")
        .values(
            status="delivered",
            delivered_at=utcnow(),
            last_error=None,
            claimed_until=None,
            sending_since=None,
        )
        .returning(*outbox.c)
    ).first()
    return OutboxRow.from_row(row) if row is not None else None


def mark_failed(
    conn: Connection,
    row: OutboxRow,
    error: str,
    *,
    retry_at: datetime,
    dead: bool,
    throttled: bool = False,
) -> bool:
    """Record a failed attempt of the claim `row` (compare-and-set on its attempt count: a
    later claim of the same row is not overwritten). A `throttled` one (the backend answered
    429) is counted in `throttled` too, in the same compare-and-set: `attempts` never goes back,
    so a claim taken over meanwhile still finds its token spent."""
    values: dict[str, Any] = {
        "status": "dead" if dead else "pending",
        "last_error": error[:1000],
        "next_attempt_at": retry_at,
        "claimed_until": None,  # the claim's answer is in: no longer being sent
        "sending_since": None,
    }
    if throttled:
        values["throttled"] = outbox.c.throttled + 1
    return _update_claim(conn, row, **values)
