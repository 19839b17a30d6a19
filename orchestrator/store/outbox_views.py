"""What operators and metrics read of the outbox: rows, one task's deliveries, what a held
task event waits behind, and the oldest delivery still to send.

Read by the API, the CLI and the console (through `orchestrator.services.outbox_operations`,
`services.task_explain` and `services.actions`) and by the metrics' oldest-pending gauge;
nothing here writes.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    FromClause,
    and_,
    case,
    func,
    literal_column,
    or_,
    select,
)

from orchestrator.store.outbox import SENT_STATUSES, OutboxRow
from orchestrator.store.tables import outbox, unsettled

__all__ = [
    "UNDELIVERED_SHOWN",
    "action_deliveries",
    "action_delivery",
    "delivery_summary",
    "get_row",
    "held_views",
    "kind_was_sent",
    "list_rows",
    "oldest_deliverable",
    "sent_lookups",
    "waits_behind",
]

#: The undelivered rows of a task `delivery_summary` lists (its counts cover them all).
UNDELIVERED_SHOWN = 20


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
    """For each pending webhook of `rows` held back in order, what it waits behind: the
    earliest event of its task before it that is not delivered or discarded (the dispatcher
    sends a task's events in that order, `outbox_sending.claim_due`), when that one was tried:
    `dead` (an operator retries or discards it) or `retried` (pending, failing, not dead yet),
    and its outbox id. One behind an event never tried yet (just written) is in order, not
    held. Both views ask this: `outbox list` and `GET /api/v1/outbox` (`held_views`), and the
    task's (`delivery_summary`); held rows listed due and never attempted read as a stuck
    dispatcher. One query for all of them: each task's earliest unsent webhook (the earliest
    before a row, when it is before it at all), from the partial index of the rows not
    delivered or discarded (a task's thousands of delivered webhooks are not read)."""
    pending = [r for r in rows if r.kind == "webhook" and r.status == "pending"]
    if not pending:
        return {}
    unsent = and_(
        outbox.c.task_id.in_({r.task_id for r in pending}),
        outbox.c.kind == "webhook",
        unsettled(outbox),
    )
    earliest = (
        select(outbox.c.task_id, func.min(outbox.c.event_seq).label("seq"))
        .where(unsent)
        .group_by(outbox.c.task_id)
        .subquery()
    )
    heads = {
        str(head.task_id): head
        for head in conn.execute(
            select(outbox).join(
                earliest,
                and_(
                    outbox.c.task_id == earliest.c.task_id,
                    outbox.c.kind == "webhook",
                    outbox.c.event_seq == earliest.c.seq,
                ),
            )
        )
    }
    held = {}
    for row in pending:
        head = heads.get(row.task_id)
        if head is None or head.event_seq >= (row.event_seq or 0):
            continue  # the first of its task not sent: nothing before it
        if head.status == "dead":
            held[row.outbox_id] = ("dead", int(head.outbox_id))
        elif head.attempts or head.last_error:
            held[row.outbox_id] = ("retried", int(head.outbox_id))
    return held


def _waits(row: OutboxRow, held: dict[int, tuple[str, int]]) -> dict[str, int]:
    """What the row waits behind (`waits_behind`) as its view says it: its task's dead letter
    (`waits_behind`) or an earlier event failing and being retried (`waits_behind_retried`);
    nothing for a row not held."""
    found = held.get(row.outbox_id)
    if found is None:
        return {}
    status, number = found
    return {"waits_behind" if status == "dead" else "waits_behind_retried": number}


def held_views(conn: Connection, rows: Iterable[OutboxRow]) -> list[dict[str, Any]]:
    """Each row's public view, with what a pending webhook waits behind (`waits_behind`: its
    task's dead letter; `waits_behind_retried`: an earlier event of its task failing and being
    retried; both null for a row not held), read in `conn`'s transaction."""
    rows = list(rows)
    held = waits_behind(conn, rows)
    return [
        {**row.public(), "waits_behind": None, "waits_behind_retried": None, **_waits(row, held)}
        for row in rows
    ]


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
    undelivered = [
        OutboxRow.from_row(row)
        for row in conn.execute(
            select(outbox)
            .where(outbox.c.task_id == task_id, unsettled(outbox))
            .order_by(case((outbox.c.status == "dead", 0), else_=1), outbox.c.outbox_id)
            .limit(UNDELIVERED_SHOWN)
        )
    ]
    never_sent = [
        kind
        for kind, by_status in sorted(counts.items())
        if by_status.get("pending") and not kind_was_sent(conn, kind)
    ]
    held = waits_behind(conn, undelivered)
    return {
        "counts": counts,
        # A key only for a row held (the task's view leaves out what a record does not have).
        "undelivered": [{**row.public(), **_waits(row, held)} for row in undelivered],
        "never_sent": never_sent,
    }


def kind_was_sent(conn: Connection, kind: str) -> bool:
    """Whether a dispatcher ever sent a row of `kind` in the store: one is delivered or
    dead-lettered, or one pending or discarded was tried (a receiver failing every time, not
    yet dead; a dead letter or a failing row an operator discarded). A row discarded while
    pending before any attempt was never sent: a store whose only settled webhooks are such
    has nothing that sends them. Index lookups (`sent_lookups`): a store full of never-sent
    rows is not scanned."""
    for sent in sent_lookups(outbox):
        found = conn.execute(
            select(outbox.c.outbox_id).where(sent, outbox.c.kind == kind).limit(1)
        ).first()
        if found is not None:
            return True
    return False


def sent_lookups(table: FromClause) -> tuple[ColumnElement[bool], ...]:
    """What says, from what a row of `table` (the outbox, or an alias of it) records, that a
    dispatcher sent or tried it: three conditions, each one index's lookup (an OR of them
    would not be). Delivered or dead-lettered (the status index); pending and tried, an
    attempt counted or the error of one (an operator's retry of a dead letter resets the
    counts and keeps the error: the partial index of tried pending rows, whose predicate this
    repeats with literals); discarded and tried likewise (the status index). A discard takes
    back the attempt of a claim that never posted the row, so a row discarded before any post
    records none."""
    tried = or_(table.c.attempts > literal_column("0"), table.c.last_error.is_not(None))
    return (
        table.c.status.in_(SENT_STATUSES),
        and_(table.c.status == literal_column("'pending'"), tried),
        and_(table.c.status == literal_column("'discarded'"), tried),
    )
