"""The outbox's deliveries: claimed, sent, and recorded until delivered or dead.

Two kinds of row (DESIGN section 8, invariant 24): an approved action (one row per approval,
written by `orchestrator.store.action_notices`) and a webhook per reported task event (written
with the event by `orchestrator.store.task_events`). The body is frozen when the row is written,
so every retry sends the same bytes. The dispatcher (`orchestrator.services.outbox`) claims due
rows here, sends them outside any transaction, and records the result: delivered, failed and
due again, throttled, or dead until an operator retries it or discards it (settles it by hand:
`discarded`, with who, when and why; it no longer holds its task's later events back), a
pending one no dispatcher is sending discarded too (`discarded_from`); each retry records who
made it (`retried_by`). The
retention pass
(`orchestrator.services.cleanup`) deletes old webhooks here that are done with:
`delete_expired_webhooks`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from sqlalchemy import (
    ColumnElement,
    Connection,
    Row,
    and_,
    case,
    delete,
    exists,
    func,
    literal_column,
    or_,
    select,
    update,
)

from orchestrator.store.tables import attempted_pending, outbox
from orchestrator.store.types import utcnow

__all__ = [
    "REFUSAL",
    "SETTLED",
    "UNDELIVERED_SHOWN",
    "OutboxRow",
    "action_deliveries",
    "action_delivery",
    "claim_due",
    "delete_expired_webhooks",
    "delivery_summary",
    "discard",
    "get_row",
    "held_views",
    "hurry_all_pending",
    "hurry_pending",
    "list_rows",
    "mark_delivered",
    "mark_failed",
    "newest_sent_webhook",
    "oldest_deliverable",
    "release_claim",
    "renew_claim",
    "retry_all_dead",
    "retry_dead",
    "start_send",
    "waits_behind",
    "webhooks_were_sent",
]


@dataclass(frozen=True)
class OutboxRow:
    outbox_id: int
    kind: str
    task_id: str
    event_seq: int | None
    action_id: str | None
    body: str
    status: str
    attempts: int  # claims so far (each claim's compare-and-set token)
    throttled: int  # of the attempts, those answered 429 (not counted toward the limit)
    next_attempt_at: datetime
    last_error: str | None
    created_at: datetime
    delivered_at: datetime | None
    discarded_at: datetime | None  # an operator settled the dead letter by hand: when,
    discarded_by: str | None  # who,
    discard_reason: str | None  # and why
    discarded_from: str | None  # `dead` or `pending` (null: before migration 0026, dead)
    retried_at: datetime | None  # an operator's last retry of it: when,
    retried_by: str | None  # who,
    retry_note: str | None  # and their note, if any
    released_at: datetime | None  # an operator's retry or discard made it deliverable again
    claimed_until: datetime | None  # a dispatcher holds it to send it: its claim's hold
    sending_since: datetime | None  # when that dispatcher posted it (`posting`); None: waiting

    @classmethod
    def from_row(cls, row: Row[Any]) -> OutboxRow:
        return cls(**{name: getattr(row, name) for name in cls.__dataclass_fields__})

    @property
    def counted(self) -> int:
        """The attempts that count toward a webhook's ORCH_WEBHOOK_MAX_ATTEMPTS: the ones the
        backend did not throttle (a claim whose send never reported, its dispatcher killed,
        counts)."""
        return self.attempts - self.throttled

    def being_sent(self, now: datetime) -> bool:
        """Whether a dispatcher holds the row to send it at `now`: claimed, its answer not
        recorded yet, and the claim's hold not run out (a dispatcher killed mid-send holds it
        no longer, and the row is due again). Posted already (`posting`), or waiting its turn
        in the dispatcher's batch."""
        return (
            self.status == "pending" and self.claimed_until is not None and self.claimed_until > now
        )

    def posting(self, now: datetime) -> bool:
        """`being_sent`, and posted: the dispatcher waits for the backend's answer to it (not a
        row of its batch still waiting its turn)."""
        return self.being_sent(now) and self.sending_since is not None

    @property
    def delivered_after_discard(self) -> bool:
        """Delivered, and discarded by an operator before: the send under way at the discard
        (its hold had run out) was answered 2xx, so the backend did act on it."""
        return self.status == "delivered" and self.discarded_at is not None

    @property
    def dead_reason(self) -> str | None:
        """Why a dead (or discarded, so dead first) row was dead-lettered: `refused`, the
        backend refused it for good and it is never retried (an approved action is dead-lettered
        for nothing else), or `max_attempts`, a webhook out of ORCH_WEBHOOK_MAX_ATTEMPTS. Its
        error alone (`HTTP 503`) read as one more failure that would be retried."""
        if self.status not in ("dead", "discarded") or self.discarded_from == "pending":
            return None  # a row discarded while pending was never dead-lettered
        if self.kind == "action" or REFUSAL in (self.last_error or ""):
            return "refused"
        return "max_attempts"

    def public(self) -> dict[str, Any]:
        """What the API and `tasks show` print (the body is the backend's, shown parsed)."""
        view = {name: getattr(self, name) for name in self.__dataclass_fields__ if name != "body"}
        view["event_id"] = f"{self.task_id}:{self.event_seq}" if self.event_seq else None
        view["dead_reason"] = self.dead_reason
        if self.status != "pending":
            # Only a pending row has a next attempt. A dead one keeps the time of its last
            # backoff in the column, which read as "due now"; delivered and discarded ones are
            # never sent again either.
            view["next_attempt_at"] = None
        return view


#: In the error of a send the backend refused for good (a permanent 4xx): the dispatcher
#: writes it (`services.outbox`), `OutboxRow.dead_reason` reads it.
REFUSAL: Final = "a permanent refusal, not retried"

#: Done with: delivered, or a dead letter an operator discarded. Neither is sent again, and
#: neither holds its task's later events back.
SETTLED = ("delivered", "discarded")
#: The undelivered rows of a task `delivery_summary` lists (its counts cover them all).
UNDELIVERED_SHOWN = 20
#: A row in one of these was sent (discarded ones were dead-lettered first).
_SENT_STATUSES: Final = ("delivered", "dead", "discarded")


def oldest_deliverable(conn: Connection) -> dict[str, datetime]:
    """By kind, since when the oldest pending row that a dispatcher may send has waited: from
    when it was written or, later, when an operator's retry or discard released it
    (`released_at`: a dead letter retried after three days read three days until delivered,
    and so did each event of its task it had held back). A webhook held in order behind its
    task's dead letter (an earlier event, dead-lettered) is left out, as it waits for an
    operator's retry or discard, not for a dispatcher or the backend.

    The dead letters are few: their first event per task is joined by hash, not looked up once
    per pending row (300,000 pending webhooks: about 90 ms on Postgres against 1.5 s for a
    correlated NOT EXISTS, and 60 ms for all pending rows, held ones counted)."""
    first_dead = (
        select(outbox.c.task_id, func.min(outbox.c.event_seq).label("seq"))
        .where(outbox.c.kind == "webhook", outbox.c.status == "dead")
        .group_by(outbox.c.task_id)
        .subquery()
    )
    joined = outbox.outerjoin(
        first_dead, and_(first_dead.c.task_id == outbox.c.task_id, outbox.c.kind == "webhook")
    )
    # Waiting since it was written or, later, since an operator's retry or discard released it.
    waiting_since = case(
        (outbox.c.released_at > outbox.c.created_at, outbox.c.released_at),
        else_=outbox.c.created_at,
    )
    rows = conn.execute(
        select(outbox.c.kind, func.min(waiting_since))
        .select_from(joined)
        .where(
            outbox.c.status == "pending",
            or_(first_dead.c.seq.is_(None), outbox.c.event_seq < first_dead.c.seq),
        )
        .group_by(outbox.c.kind)
    ).all()
    return {str(kind): at for kind, at in rows}


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
        earlier.c.status.not_in(SETTLED),
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


def start_send(conn: Connection, row: OutboxRow, *, hold_seconds: float) -> bool:
    """`renew_claim` just before the claimed `row` is posted, recording when (`sending_since`):
    from then it is being sent, where the rows of the batch after it wait their turn. False,
    and nothing recorded, when the row is no longer this claim's (then it must not be sent)."""
    now = utcnow()
    until = now + timedelta(seconds=hold_seconds)
    return _update_claim(conn, row, next_attempt_at=until, claimed_until=until, sending_since=now)


def renew_claim(conn: Connection, row: OutboxRow, *, hold_seconds: float) -> bool:
    """Hold the claimed `row` again, from now, just before it is sent (a batch is sent one row
    after another, and a later row's hold may run out meanwhile). False when the row is no
    longer this claim's: another dispatcher claimed it since (compare-and-set on the attempt
    count), or it is no longer pending; then it must not be sent."""
    until = utcnow() + timedelta(seconds=hold_seconds)
    return _update_claim(conn, row, next_attempt_at=until, claimed_until=until)


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


def get_row(conn: Connection, outbox_id: int) -> OutboxRow | None:
    row = conn.execute(select(outbox).where(outbox.c.outbox_id == outbox_id)).one_or_none()
    return OutboxRow.from_row(row) if row is not None else None


def action_delivery(conn: Connection, action_id: str) -> OutboxRow | None:
    """The delivery of an approved action (one per approval), or None before an approval."""
    row = conn.execute(select(outbox).where(outbox.c.action_id == action_id)).one_or_none()
    return OutboxRow.from_row(row) if row is not None else None


def action_deliveries(conn: Connection, action_ids: Iterable[str]) -> dict[str, OutboxRow]:
    """`action_delivery` of each of `action_ids` that has one, in one query (a page of actions
    is listed with its deliveries, not read a row at a time)."""
    wanted = set(action_ids)
    if not wanted:
        return {}
    rows = conn.execute(select(outbox).where(outbox.c.action_id.in_(wanted)))
    return {str(row.action_id): OutboxRow.from_row(row) for row in rows}


def list_rows(
    conn: Connection,
    *,
    task_id: str | None = None,
    status: str | None = None,
    kind: str | None = None,
    after_id: int | None = None,
    limit: int = 50,
) -> list[OutboxRow]:
    """Oldest first; `after_id` is the last outbox id already seen (the cursor)."""
    conditions = []
    if task_id is not None:
        conditions.append(outbox.c.task_id == task_id)
    if status is not None:
        conditions.append(outbox.c.status == status)
    if kind is not None:
        conditions.append(outbox.c.kind == kind)
    if after_id is not None:
        conditions.append(outbox.c.outbox_id > after_id)
    query = select(outbox).where(*conditions).order_by(outbox.c.outbox_id).limit(limit)
    return [OutboxRow.from_row(row) for row in conn.execute(query)]


def waits_behind(conn: Connection, rows: Iterable[OutboxRow]) -> dict[int, tuple[str, int]]:
    """For each pending webhook of `rows` held back in order by an earlier event of its task
    that is not sent and was tried: whether that one is `dead` (an operator retries or discards
    it) or `retried` (pending, failing, not dead yet), and its outbox id. One query for all of
    them: a listing of pending rows showed them due and never attempted, which read as a stuck
    dispatcher. A task's events go one at a time, so the tried one is the first of its task not
    sent; one held behind an earlier event never tried yet (just written) is in order, not held."""
    pending = [r for r in rows if r.kind == "webhook" and r.status == "pending"]
    if not pending:
        return {}
    tried: dict[str, list[tuple[int, str, int]]] = {}
    for task_id, seq, status, outbox_id in conn.execute(
        select(outbox.c.task_id, outbox.c.event_seq, outbox.c.status, outbox.c.outbox_id)
        .where(
            outbox.c.task_id.in_({r.task_id for r in pending}),
            outbox.c.kind == "webhook",
            or_(outbox.c.status == "dead", attempted_pending),
        )
        .order_by(outbox.c.event_seq)
    ):
        tried.setdefault(str(task_id), []).append((int(seq), str(status), int(outbox_id)))
    held = {}
    for row in pending:
        first = next(
            (
                ("dead" if status == "dead" else "retried", number)
                for seq, status, number in tried.get(row.task_id, ())
                if seq < (row.event_seq or 0)
            ),
            None,
        )
        if first is not None:
            held[row.outbox_id] = first
    return held


def held_views(conn: Connection, rows: Iterable[OutboxRow]) -> list[dict[str, Any]]:
    """Each row's public view, with what a pending webhook waits behind (`waits_behind`: its
    task's dead letter; `waits_behind_retried`: an earlier event of its task failing and being
    retried), read in `conn`'s transaction."""
    rows = list(rows)
    held = waits_behind(conn, rows)
    views = []
    for row in rows:
        status, number = held.get(row.outbox_id, ("", None))
        views.append(
            {
                **row.public(),
                "waits_behind": number if status == "dead" else None,
                "waits_behind_retried": number if status == "retried" else None,
            }
        )
    return views


def delivery_summary(conn: Connection, task_id: str) -> dict[str, Any]:
    """For `tasks show`: counts per kind and status, the dead and undelivered rows (not the
    discarded ones: settled, they are counted), and
    `never_sent`: the kinds this task has pending of which no row of any task in the store
    is delivered, dead-lettered or tried (delivered ones are kept ORCH_RETENTION_DAYS): nothing
    sends them, most likely their URL is not set where a dispatcher runs (the reader,
    without the fleet's settings, cannot know which)."""
    counts: dict[str, dict[str, int]] = {}
    for kind, status, count in conn.execute(
        select(outbox.c.kind, outbox.c.status, func.count())
        .where(outbox.c.task_id == task_id)
        .group_by(outbox.c.kind, outbox.c.status)
    ):
        counts.setdefault(str(kind), {})[str(status)] = int(count)
    # Dead ones first (they need an operator), then in order: a dead action after twenty pending
    # events was left out, though `tasks show` puts dead ones first among those it shows.
    open_rows = conn.execute(
        select(outbox)
        .where(outbox.c.task_id == task_id, outbox.c.status.not_in(SETTLED))
        .order_by(case((outbox.c.status == "dead", 0), else_=1), outbox.c.outbox_id)
        .limit(UNDELIVERED_SHOWN)
    )
    never_sent = [
        kind
        for kind, by_status in sorted(counts.items())
        if by_status.get("pending") and not _ever_sent(conn, kind)
    ]
    return {
        "counts": counts,
        "undelivered": _with_waits(OutboxRow.from_row(r) for r in open_rows),
        "never_sent": never_sent,
    }


def _with_waits(rows: Iterable[OutboxRow]) -> list[dict[str, Any]]:
    """Each row's public view, and for a pending webhook behind a dead one of its task its
    `waits_behind`: that dead letter's id; behind one failing and being retried (pending and
    tried, not dead yet), its `waits_behind_retried`. Such a row reads "never attempted" and
    due, which looked like a stuck dispatcher; it is sent once the one before it is. `rows` are
    one task's not sent, oldest first (a task's webhooks are written in event order), so the
    first webhook is the one the others wait for."""
    views, head = [], None
    for row in rows:
        view = row.public()
        if row.kind == "webhook":
            if head is None:
                head = row
            elif row.status == "pending" and head.status == "dead":
                view["waits_behind"] = head.outbox_id
            elif row.status == "pending" and (head.attempts or head.last_error):
                view["waits_behind_retried"] = head.outbox_id
        views.append(view)
    return views


def _ever_sent(conn: Connection, kind: str) -> bool:
    """Whether a dispatcher ever sent a row of `kind` in the store: one is delivered or
    dead-lettered (discarded ones were dead-lettered first), or one still pending was tried (a
    receiver failing every time, not yet dead). Two index lookups (the status index, and the
    partial one of tried pending rows): a store full of never-sent rows is not scanned."""
    for sent in (outbox.c.status.in_(_SENT_STATUSES), attempted_pending):
        found = conn.execute(
            select(outbox.c.outbox_id).where(sent, outbox.c.kind == kind).limit(1)
        ).first()
        if found is not None:
            return True
    return False


def webhooks_were_sent(conn: Connection) -> bool:
    """Whether a dispatcher ever sent this store's webhooks: one of them is delivered, dead or
    discarded, or pending and tried. Then the fleet has an ORCH_WEBHOOK_URL, whatever the
    settings of the process asking (an operator's laptop); retention keeps the newest sent
    one (`newest_sent_webhook`), and never deletes a dead or retrying one, so the store goes on
    knowing it."""
    return _ever_sent(conn, "webhook")


def newest_sent_webhook(conn: Connection) -> int | None:
    """The newest webhook delivered or discarded (a dead one is never deleted): retention keeps
    it, whatever its age, as the store's record that its webhooks are sent."""
    found = conn.execute(
        select(outbox.c.outbox_id)
        .where(outbox.c.kind == "webhook", outbox.c.status.in_(SETTLED))
        .order_by(outbox.c.outbox_id.desc())
        .limit(1)
    ).first()
    return int(found.outbox_id) if found is not None else None


def delete_expired_webhooks(
    conn: Connection,
    cutoff: datetime,
    limit: int,
    *,
    never_sent: bool,
    keep: int | None = None,
    told: bool = False,
) -> tuple[int, int]:
    """One retention batch of webhook rows: (delivered or discarded, never sent) deleted, at most
    `limit`.

    Delivered webhooks delivered before `cutoff` go, and discarded ones discarded before it (an
    operator settled them; who, when and why stay visible that long), but not the row `keep`
    (`newest_sent_webhook`: the store's record that a dispatcher sends its webhooks). With
    `never_sent` (no dispatcher sends webhooks: `services.cleanup` decides), so do pending
    webhooks written before `cutoff` that were never attempted (no attempt counted, and no
    error from before an operator's retry), unless their task has a webhook that was tried and
    not delivered or discarded: a dead letter an operator has not dealt with holds its task's
    later events back, and they must still follow it once it is retried or discarded. Kept
    whatever their age: pending rows being retried, dead rows (an operator retries or discards
    them from the console or `outbox retry|discard`), and approved actions (one per approval;
    the action's delivery is read from its row). A webhook is always deleted from its task's
    oldest on, so no gap opens before an event still to be sent.

    Unless `told` (an operator said the fleet has no receiver), never attempted ones go only
    while no webhook of the store was ever sent or tried (`webhooks_were_sent`), checked again
    by each batch as it deletes: a dispatcher that sent one since the cleanup decided (back after an
    absence longer than the retention) would deliver them.
    """
    tried = outbox.alias("tried")
    stuck_behind = exists().where(
        tried.c.task_id == outbox.c.task_id,
        tried.c.kind == "webhook",
        tried.c.status.not_in(SETTLED),
        or_(tried.c.attempts > 0, tried.c.last_error.is_not(None)),
    )
    delivered = or_(
        and_(outbox.c.status == "delivered", outbox.c.delivered_at < cutoff),
        and_(outbox.c.status == "discarded", outbox.c.discarded_at < cutoff),
    )
    if keep is not None:
        delivered = and_(delivered, outbox.c.outbox_id != keep)
    unsent = and_(
        outbox.c.status == "pending",
        outbox.c.attempts == 0,
        outbox.c.last_error.is_(None),  # a retried dead letter is due, not unsent
        outbox.c.created_at < cutoff,
        ~stuck_behind,
    )
    if not told:
        # `webhooks_were_sent` again, as two lookups of an index each (one OR would not be).
        sent, tried_one = outbox.alias("sent"), outbox.alias("tried_one")
        unsent = and_(
            unsent,
            ~exists().where(sent.c.kind == "webhook", sent.c.status.in_(_SENT_STATUSES)),
            ~exists().where(
                tried_one.c.kind == literal_column("'webhook'"),
                tried_one.c.status == literal_column("'pending'"),
                or_(
                    tried_one.c.attempts > literal_column("0"), tried_one.c.last_error.is_not(None)
                ),
            ),
        )
    expired = and_(outbox.c.kind == "webhook", or_(delivered, unsent) if never_sent else delivered)
    rows = conn.execute(
        select(outbox.c.outbox_id, outbox.c.status)
        .where(expired)
        .order_by(outbox.c.outbox_id)
        .limit(limit)
    ).all()
    if not rows:
        return 0, 0
    # The conditions are checked again as the rows are deleted: a row a dispatcher claimed
    # meanwhile (its attempt counted) is no longer never sent, and stays.
    gone = conn.execute(
        delete(outbox)
        .where(outbox.c.outbox_id.in_([row.outbox_id for row in rows]), expired)
        .returning(outbox.c.status)
    ).all()
    done = sum(1 for row in gone if row.status in SETTLED)
    return done, len(gone) - done
