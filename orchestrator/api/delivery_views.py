"""An outbox row as the API sends it (`Delivery`): in the outbox's own routes and in a task's
explain view. Pydantic only: `tasks show` prints the explain view with these models, and
`api.outbox`, which re-exports them, imports FastAPI.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from orchestrator.api.wire_types import IsoTime

__all__ = ["Delivery", "DeliveryKind", "DeliveryStatus"]

#: An approved action's delivery or a task event's webhook (`store.tables.OUTBOX_KINDS`).
DeliveryKind = Literal["action", "webhook"]
#: `store.tables.OUTBOX_STATUSES`.
DeliveryStatus = Literal["pending", "delivered", "dead", "discarded"]


class Delivery(BaseModel):
    """One outbox row: an approved action's delivery or a task event's webhook."""

    outbox_id: int
    kind: DeliveryKind
    task_id: str
    event_id: str | None = Field(description="`TASK_ID:SEQ` of a webhook's event")
    event_seq: int | None
    action_id: str | None
    status: DeliveryStatus
    attempts: int = Field(description="sends so far (a dispatcher's claim counts one)")
    throttled: int = Field(
        description="of the attempts, those the backend answered 429 Too Many Requests: not "
        "counted toward ORCH_WEBHOOK_MAX_ATTEMPTS"
    )
    next_attempt_at: IsoTime | None = Field(
        description="when a pending delivery is next tried (or was claimed until); null for "
        "one that has no next attempt: delivered, discarded, or dead (until an operator "
        "retries it)"
    )
    last_error: str | None
    dead_reason: Literal["refused", "max_attempts"] | None = Field(
        description="why a dead (or discarded) delivery was dead-lettered: `refused`, the "
        "backend refused it for good (a permanent 4xx) and it is never retried, or "
        "`max_attempts`, a webhook out of ORCH_WEBHOOK_MAX_ATTEMPTS attempts; null otherwise, "
        "and for one discarded while pending (`discarded_from`: never dead-lettered)"
    )
    created_at: IsoTime
    delivered_at: IsoTime | None
    discarded_at: IsoTime | None = Field(
        description="when an operator discarded it (settled it by hand); also on a `delivered` "
        "one when a send under way at the discard (its claim's hold had run out) was answered "
        "2xx: delivered after its discard, the backend did act on it"
    )
    discarded_by: str | None = Field(description="who discarded it")
    discard_reason: str | None = Field(description="why it was discarded")
    discarded_from: Literal["dead", "pending"] | None = Field(
        default=None,
        description="what a discarded delivery was when discarded: `dead`, or `pending` "
        "(failing, never dead-lettered: an action the backend answers 500 for every time); "
        "null for one discarded before migration 0026 (dead) or not discarded",
    )
    released_at: IsoTime | None = Field(
        default=None,
        description="when an operator's retry or discard last made it deliverable again: a "
        "retry of this dead letter, or of (or a discard of) the dead letter of its task it "
        "waited behind; `orchestrator_outbox_oldest_pending_seconds` counts its wait from then",
    )
    retried_at: IsoTime | None = Field(
        default=None, description="when an operator last retried it (or hurried it, pending)"
    )
    retried_by: str | None = Field(default=None, description="who last retried it")
    retry_note: str | None = Field(default=None, description="their note with that retry")
    claimed_until: IsoTime | None = Field(
        default=None,
        description="while a dispatcher is sending it: until when its claim holds the row "
        "(renewed while the send lasts); a retry is refused then (`409 being_sent`). A time "
        "past is a dispatcher that stopped mid-send: the row is due again",
    )
    sending_since: IsoTime | None = Field(
        default=None,
        description="while a dispatcher holds it (`claimed_until` ahead): when it posted it, "
        "the row being sent now; null for a row claimed with others in the dispatcher's batch "
        "that waits its turn (the batch is posted one row after another), and for one not "
        "held (migration 0027)",
    )
