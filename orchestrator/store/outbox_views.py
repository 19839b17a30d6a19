"""What operators and metrics read of the outbox: rows, one task's deliveries, what a held
task event waits behind, and the oldest delivery still to send.

Read by the API, the CLI and the console (through `orchestrator.services.outbox`,
`services.tasks` and `services.actions`) and by the metrics' oldest-pending gauge; nothing here
writes.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, and_, case, func, or_, select

from orchestrator.store.outbox import SENT_STATUSES, SETTLED, OutboxRow
from orchestrator.store.tables import attempted_pending, outbox

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
        if by_status.get("pending") and not kind_was_sent(conn, kind)
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


def kind_was_sent(conn: Connection, kind: str) -> bool:
    """Whether a dispatcher ever sent a row of `kind` in the store: one is delivered or
    dead-lettered (discarded ones were dead-lettered first), or one still pending was tried (a
    receiver failing every time, not yet dead). Two index lookups (the status index, and the
    partial one of tried pending rows): a store full of never-sent rows is not scanned."""
    for sent in (outbox.c.status.in_(SENT_STATUSES), attempted_pending):
        found = conn.execute(
            select(outbox.c.outbox_id).where(sent, outbox.c.kind == kind).limit(1)
        ).first()
        if found is not None:
            return True
    return False
