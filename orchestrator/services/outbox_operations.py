"""What operators see and do with the outbox's deliveries: list them or show one (what a held
webhook waits behind, why one is dead, who discarded it), retry a dead-lettered one or hurry a
failing one, discard one dealt with by hand. The CLI's `outbox` commands and the API's
`/api/v1/outbox` routes call it; sending is the dispatcher's (`services.outbox`).
"""

from __future__ import annotations

import builtins
import logging
from typing import Any, Final

from sqlalchemy import Connection

from orchestrator.errors import ConflictError, InvalidTransition, NotFound, echoed
from orchestrator.store import outbox_operator, outbox_views
from orchestrator.store import tasks as task_store
from orchestrator.store.db import Database
from orchestrator.store.outbox import OutboxRow
from orchestrator.store.types import utcnow

__all__ = ["MAX_OUTBOX_ID", "OutboxService"]

log = logging.getLogger(__name__)

#: The largest outbox id the store can hold (a BIGINT on Postgres, SQLite's 64-bit rowid).
MAX_OUTBOX_ID: Final = 2**63 - 1


class OutboxService:
    """What operators see and do: list deliveries or show one, retry or discard a dead-lettered
    one, hurry a failing one (a retry of a pending row)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def list(
        self,
        *,
        task_id: str | None = None,
        status: str | None = None,
        kind: str | None = None,
        after_id: int | None = None,
        limit: int = 50,
    ) -> list[OutboxRow]:
        with self.db.transaction(readonly=True) as conn:
            return outbox_views.list_rows(
                conn, task_id=task_id, status=status, kind=kind, after_id=after_id, limit=limit
            )

    def listed(
        self,
        *,
        task_id: str | None = None,
        status: str | None = None,
        kind: str | None = None,
        after_id: int | None = None,
        limit: int = 50,
    ) -> builtins.list[dict[str, Any]]:
        """`list` as operators read it: each row's public view, and a pending webhook held back
        in order says by what, its task's dead letter (`waits_behind`) or an earlier event
        failing and being retried (`waits_behind_retried`), read in the same transaction.
        NotFound for a `task_id` that names no task."""
        with self.db.transaction(readonly=True) as conn:
            rows = outbox_views.list_rows(
                conn, task_id=task_id, status=status, kind=kind, after_id=after_id, limit=limit
            )
            if not rows and task_id is not None:
                _require_task(conn, task_id)
            return outbox_views.held_views(conn, rows)

    def shown(self, outbox_id: int) -> dict[str, Any]:
        """One row as `listed` shows it (what it waits behind, why it is dead, who discarded
        it); NotFound for an id that names no row."""
        if outbox_id > MAX_OUTBOX_ID:
            raise NotFound(f"outbox row {outbox_id} does not exist")
        with self.db.transaction(readonly=True) as conn:
            row = outbox_views.get_row(conn, outbox_id)
            if row is None:
                raise NotFound(f"outbox row {outbox_id} does not exist")
            [view] = outbox_views.held_views(conn, [row])
        return view

    def retry(self, outbox_id: int, *, by: str, note: str | None = None) -> OutboxRow:
        """An operator's retry. A dead row is due again now with fresh counts; a pending one
        (failing, backing off) is due now, its counts kept: once the backend is mended it need
        not wait out its backoff. Refused (409) for a pending row a dispatcher is sending
        (`being_sent`: made due, a second dispatcher would send it at the same time) and for
        one held in order behind an earlier event of its task (`waits_behind`: that one is the
        one to retry); NotFound for an id that names no row. The row records who retried it,
        when, and `note` (`retried_by`, `retried_at`, `retry_note`), as a discard does."""
        if outbox_id > MAX_OUTBOX_ID:  # the column holds no larger id: none such exists
            raise NotFound(f"outbox row {outbox_id} does not exist")
        with self.db.transaction() as conn:
            row = outbox_views.get_row(conn, outbox_id)
            if row is None:
                raise NotFound(f"outbox row {outbox_id} does not exist")
            if row.status == "pending":
                _hurry(conn, row, by=by, note=note)
            elif not outbox_operator.retry_dead(conn, outbox_id, by=by, note=note):
                raise InvalidTransition(
                    f"outbox row {outbox_id} is {row.status}; only a dead or pending one can be "
                    "retried"
                )
            retried = outbox_views.get_row(conn, outbox_id)
        assert retried is not None
        log.info(
            "outbox %s (%s of task %s) retried by %r",  # typed text: quoted
            outbox_id,
            retried.kind,
            retried.task_id,
            by,
        )
        return retried

    def retry_all(
        self,
        *,
        by: str,
        note: str | None = None,
        kind: str | None = None,
        task_id: str | None = None,
    ) -> int:
        """Every dead-lettered delivery (of `kind`, of `task_id`) due again now, with fresh
        counts, each recording who retried it: how many. Once the backend (or a secret) is
        mended after it refused them all."""
        with self.db.transaction() as conn:
            count = outbox_operator.retry_all_dead(
                conn, kind=kind, task_id=task_id, by=by, note=note
            )
            if not count and task_id is not None:
                _require_task(conn, task_id)  # not "0 retried" for a mistyped task id
        if count:
            log.info("%d dead-lettered outbox row(s) are due again (retried by %r)", count, by)
        return count

    def retry_failing(
        self,
        *,
        by: str,
        note: str | None = None,
        kind: str | None = None,
        task_id: str | None = None,
    ) -> tuple[int, int]:
        """Every pending delivery (of `kind`, of `task_id`) that failed and waits out its
        backoff, due now with its counts kept, each recording who retried it: once the backend
        is mended after an outage. Those a dispatcher is sending are left to it: (made due,
        being sent)."""
        with self.db.transaction() as conn:
            hurried, sending = outbox_operator.hurry_all_pending(
                conn, kind=kind, task_id=task_id, by=by, note=note
            )
            if not (hurried or sending) and task_id is not None:
                _require_task(conn, task_id)  # not "0 due now" for a mistyped task id
        if hurried:
            log.info("%d failing outbox row(s) are due now (retried by %r)", hurried, by)
        return hurried, sending

    def discard(self, outbox_id: int, *, reason: str, by: str) -> OutboxRow:
        """Settle a delivery an operator dealt with by hand: never sent again, and its task's
        later events go on. A dead one, or a pending one no dispatcher has posted (one claimed
        in a dispatcher's batch, waiting its turn, too: the dispatcher re-checks it as its turn
        comes and does not post it): an action is retried until a 2xx, and one the backend
        answers 500 for every time (a bug on its side for that payload) was sent for ever.
        Refused (409 `being_sent`) once a dispatcher has posted it: its answer may yet deliver
        it. The row stays (who, when, why, and whether it
        was dead or pending) until retention deletes it; an approved action's row for good,
        saying its delivery was discarded, never delivered."""
        if outbox_id > MAX_OUTBOX_ID:
            raise NotFound(f"outbox row {outbox_id} does not exist")
        with self.db.transaction() as conn:
            row = outbox_views.get_row(conn, outbox_id)
            if row is None:
                raise NotFound(f"outbox row {outbox_id} does not exist")
            if not outbox_operator.discard(conn, outbox_id, by=by, reason=reason):
                # Read again: on Postgres the discard waited for a claim being written.
                current = outbox_views.get_row(conn, outbox_id) or row
                if current.being_sent(utcnow()):
                    raise _being_sent(current, "discard it then if it failed")
                raise InvalidTransition(
                    f"outbox row {outbox_id} is {current.status}; only a dead or pending one "
                    "can be discarded"
                )
            discarded = outbox_views.get_row(conn, outbox_id)
        assert discarded is not None
        log.info(
            "outbox %s (%s of task %s, %s) discarded by %r: %r",  # typed text: one line, quoted
            outbox_id,
            discarded.kind,
            discarded.task_id,
            discarded.discarded_from,
            by,
            reason,
        )
        return discarded

    def summary(self, task_id: str) -> dict[str, Any]:
        with self.db.transaction(readonly=True) as conn:
            return outbox_views.delivery_summary(conn, task_id)


def _hurry(conn: Connection, row: OutboxRow, *, by: str, note: str | None) -> None:
    """Make the pending `row` due now, or say why not: a dispatcher is sending it, or it waits
    in order behind an earlier event of its task (made due, it would still wait)."""
    held = outbox_views.waits_behind(conn, [row]).get(row.outbox_id)
    if held is not None:
        status, head = held
        what, action = (
            ("a dead letter", "retry or discard")
            if status == "dead"
            else ("an earlier event being retried", "retry")
        )
        raise ConflictError(
            f"outbox row {row.outbox_id} waits behind outbox {head}, {what} of its task "
            f"(events go in order): {action} that one, and this one follows it",
            code="waits_behind",
        )
    if outbox_operator.hurry_pending(conn, row.outbox_id, by=by, note=note):
        return
    # Claimed as it was read or meanwhile (a retry waits for a claim being written): read
    # again for what the claim holds.
    current = outbox_views.get_row(conn, row.outbox_id)
    if current is None:  # the cleanup deleted it meanwhile (never attempted, nothing sends it)
        raise NotFound(f"outbox row {row.outbox_id} does not exist")
    if current.status == "dead" and outbox_operator.retry_dead(
        conn, row.outbox_id, by=by, note=note
    ):
        return  # its attempt ended meanwhile, dead-lettered: retried as a dead one is
    if current.status != "pending":
        raise InvalidTransition(
            f"outbox row {row.outbox_id} is {current.status}; only a dead or pending one can "
            "be retried"
        )
    raise _being_sent(current, "retry it then if it failed")


def _being_sent(row: OutboxRow, then: str) -> ConflictError:
    """409 `being_sent` for an operator's retry or discard of a row a dispatcher holds: posted
    or waiting its turn in the dispatcher's batch, until when, and what to do once its answer
    is recorded."""
    until = f", held until {row.claimed_until:%Y-%m-%dT%H:%M:%S}Z" if row.claimed_until else ""
    what = (
        "is being sent now"
        if row.posting(utcnow())
        else "is claimed by a dispatcher and waits its turn in the batch it sends"
    )
    # Only a retry is refused for a row waiting its turn (a discard settles it): made due, a
    # second dispatcher would post it beside the first, and it is about to be posted anyway.
    soon = (
        ""
        if row.posting(utcnow())
        else "; it is posted when its turn comes: a retry would not send it sooner"
    )
    return ConflictError(
        f"outbox row {row.outbox_id} {what} (attempt {row.attempts}{until}){soon}; "
        f"its answer is recorded when the attempt ends: {then}",
        code="being_sent",
    )


def _require_task(conn: Connection, task_id: str) -> None:
    """NotFound unless the task exists: an empty answer for a mistyped (or cut short) task id
    read as a task with nothing to deliver (`outbox list --task`, `GET /api/v1/outbox?task_id`,
    `retry-dead` with a `task_id`), not as the mistake it is."""
    if task_store.get_task(conn, task_id) is None:
        raise NotFound(f"task {echoed(task_id)} does not exist")
