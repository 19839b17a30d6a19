"""The retention pass's part of the outbox: which old webhooks are done with, deleted in
batches.

`orchestrator.services.cleanup` asks whether a dispatcher sends this store's webhooks
(`webhooks_were_sent`, read from the rows, not from the cleaning process's settings), keeps the
newest sent one as the store's record of it, and deletes delivered and discarded webhooks past
the retention, and never attempted ones only where nothing sends them.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection, and_, delete, exists, literal_column, or_, select

from orchestrator.store.outbox import SETTLED
from orchestrator.store.outbox_views import kind_was_sent, sent_lookups
from orchestrator.store.tables import outbox, unsettled

__all__ = ["delete_expired_webhooks", "newest_sent_webhook", "webhooks_were_sent"]


def webhooks_were_sent(conn: Connection) -> bool:
    """Whether a dispatcher ever sent this store's webhooks: one of them is delivered or dead,
    or pending or discarded and tried (not one discarded while pending, before any attempt).
    Then the fleet has an ORCH_WEBHOOK_URL, whatever the settings of the process asking (an
    operator's laptop); retention keeps the newest sent one (`newest_sent_webhook`), and never
    deletes a dead or retrying one, so the store goes on knowing it."""
    return kind_was_sent(conn, "webhook")


def newest_sent_webhook(conn: Connection) -> int | None:
    """The newest webhook delivered, or discarded after an attempt (a dead one is never
    deleted): retention keeps it, whatever its age, as the store's record that its webhooks
    are sent. Not one discarded before any attempt: kept in its place, the delivered one went,
    and the next pass found nothing sent."""
    *_, discarded_tried = sent_lookups(outbox)
    found = conn.execute(
        select(outbox.c.outbox_id)
        .where(outbox.c.kind == "webhook", or_(outbox.c.status == "delivered", discarded_tried))
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
        unsettled(tried),
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
        # `webhooks_were_sent` again, as lookups of an index each (one OR would not be).
        checks = []
        for number in range(len(sent_lookups(outbox))):
            sent = outbox.alias(f"sent_{number}")
            checks.append(
                ~exists().where(
                    sent.c.kind == literal_column("'webhook'"), sent_lookups(sent)[number]
                )
            )
        unsent = and_(unsent, *checks)
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
