"""The outbox's row: what one delivery to the business backend holds, and the words its
modules share.

Two kinds of row (DESIGN section 8, invariant 24): an approved action (one row per approval,
written by `orchestrator.store.action_notices`) and a webhook per reported task event (written
with the event by `orchestrator.store.task_events`). The body is frozen when the row is written,
so every retry sends the same bytes. A row is pending until delivered, or dead until an
operator retries it or discards it (settles it by hand: `discarded`, with who, when and why; it
no longer holds its task's later events back); a pending one no dispatcher has posted may be
discarded too (`discarded_from`); each retry records who made it (`retried_by`).

What is done with rows is in the modules beside this one: the dispatcher's claims, posts and
answers (`outbox_sending`), an operator's retries and discards (`outbox_operator`), what
operators and metrics read (`outbox_views`), and the retention pass's deletes
(`outbox_retention`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from sqlalchemy import Row

from orchestrator.store.tables import OUTBOX_SETTLED

__all__ = ["REFUSAL", "SENT_STATUSES", "SETTLED", "OutboxRow"]


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
SETTLED: Final = OUTBOX_SETTLED
#: A row in one of these was sent. A discarded one only when its row records an attempt: it
#: may have been discarded while pending, before any (`outbox_views.sent_lookups`).
SENT_STATUSES: Final = ("delivered", "dead")
