"""What an outbox row's state is, in the words every command that shows a delivery says it:
`outbox list` and `show`, `actions show` and `tasks show` (being sent now or waiting its turn in
a dispatcher's batch, failing and backing off, dead-lettered and why, delivered after its
discard), and an operator's ways out of a failing one.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from orchestrator.cli.common import time_text

__all__ = [
    "being_sent",
    "dead_label",
    "delivered_after_discard",
    "error_label",
    "holding",
    "hurriable",
    "posting",
    "ways_out",
]


def being_sent(row: dict[str, Any], now: datetime) -> bool:
    """A dispatcher holds the pending row to send it (its claim's hold not run out): posted
    (`posting`), or waiting its turn in the dispatcher's batch."""
    until = row.get("claimed_until")
    return row["status"] == "pending" and isinstance(until, datetime) and until > now


def posting(row: dict[str, Any], now: datetime) -> bool:
    """`being_sent`, and posted: its dispatcher waits for the backend's answer to it. A
    batch's rows are claimed together and posted one after another (`sending_since`)."""
    return being_sent(row, now) and row.get("sending_since") is not None


def holding(row: dict[str, Any]) -> str:
    """What a dispatcher's claim of the row is doing, for a line: `being sent now (attempt N,
    held until T, posted at S)` or that it waits its turn in the batch (attempt, hold)."""
    from orchestrator.store.types import utcnow

    claim = f"attempt {row['attempts']}, held until {time_text(row['claimed_until'])}"
    if posting(row, utcnow()):
        return f"being sent now ({claim}, posted at {time_text(row['sending_since'])})"
    return f"claimed by a dispatcher, waiting its turn in its batch ({claim})"


def delivered_after_discard(row: dict[str, Any]) -> bool:
    """Delivered, though an operator discarded it before: the send under way at the discard
    (its hold had run out) was answered 2xx, so the backend did act on it."""
    return row["status"] == "delivered" and row.get("discarded_at") is not None


def hurriable(row: dict[str, Any]) -> bool:
    """A pending delivery that failed and waits out its backoff (not being sent): `outbox
    retry N` makes it due now, `outbox discard N` settles it."""
    from orchestrator.store.types import utcnow

    at = row.get("next_attempt_at")
    now = utcnow()
    return (
        row["status"] == "pending"
        and bool(row["attempts"] or row["last_error"])
        and isinstance(at, datetime)
        and at > now
        and not being_sent(row, now)
    )


def ways_out(number: int) -> str:
    """The operator's ways out of a failing delivery, as `actions show` and `tasks show` say
    them: an action is retried until a 2xx, so waiting alone may never end."""
    return (
        f"`orchestrator outbox retry {number}` sends it now once the backend is mended, "
        f"or `outbox discard {number} --reason R` once dealt with by hand"
    )


def dead_label(row: dict[str, Any]) -> str:
    """Why the row was dead-lettered, when its error does not say it: a refusal's error does
    (`a permanent refusal, not retried`), the last of a webhook's attempts' did not (`HTTP 503`
    read as one more failure that the dispatcher would retry)."""
    if row.get("dead_reason") != "max_attempts":
        return ""
    counted = row["attempts"] - row["throttled"]
    return f"dead-lettered: out of attempts ({counted} failed, ORCH_WEBHOOK_MAX_ATTEMPTS)"


def error_label(row: dict[str, Any]) -> str:
    """A pending row with an error and no attempt was retried by an operator since: its error
    is from before (it read as the retry having failed, a 401's "then retry" most of all)."""
    if row["status"] == "pending" and not row["attempts"]:
        return "last error, before the retry"
    return "last error"
