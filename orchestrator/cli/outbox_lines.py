"""How a delivery reads to an operator: its line in `outbox list` (what it is, when it is tried
next, why it failed or waits) and its page in `outbox show` (its whole state, a fact a line, and
what an operator can do about it).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from orchestrator.cli.common import printable, time_text
from orchestrator.cli.delivery_states import (
    being_sent,
    dead_label,
    delivered_after_discard,
    error_label,
    posting,
)

__all__ = ["list_line", "show_lines"]


def list_line(row: dict[str, Any], now: datetime) -> str:
    what = row["action_id"] if row["kind"] == "action" else f"event {row['event_id']}"
    what += _next_attempt(row, now)
    error = f"  {error_label(row)}: {row['last_error']}" if row["last_error"] else ""
    if dead_label(row):
        error += f"  {dead_label(row)}"
    if row["status"] == "discarded":
        # Typed by a person: a newline or a bidi control must not forge or reorder a line.
        error += (
            f"  discarded by {printable(row['discarded_by'])}: {printable(row['discard_reason'])}"
        )
    elif delivered_after_discard(row):
        error += (
            f"  delivered after its discard by {printable(row['discarded_by'])}: "
            f"{printable(row['discard_reason'])}"
        )
    if row["waits_behind"]:
        # Due and never attempted, it read as a stuck dispatcher: it is held back in order.
        error += (
            f"  waits behind dead letter outbox {row['waits_behind']} (outbox retry or discard it)"
        )
    elif row.get("waits_behind_retried"):
        # Behind an earlier event failing, not dead yet: the one to look at is that one.
        error += f"  waits behind outbox {row['waits_behind_retried']}, being retried"
    return (
        f"{row['outbox_id']:>6}  {row['kind']:7}  {row['status']:9}  "
        f"attempts {row['attempts']:<3}  throttled {row['throttled']:<3}  "
        f"task {row['task_id']}  {what}{error}"
    )


def _next_attempt(row: dict[str, Any], now: datetime) -> str:
    """When a pending row is tried next, from now (`  next attempt in 4m10s`): an operator
    watching a failing receiver sees when it is tried again, and one due long ago (`due 12m
    ago`) is no dispatcher sending. One a dispatcher is sending says so (its time is the
    claim's hold, not a next attempt). Nothing for a row held behind another (its own time
    means nothing until that one goes) nor for a row that is not pending."""
    at = row.get("next_attempt_at")
    if row["status"] != "pending" or not isinstance(at, datetime):
        return ""
    if row.get("waits_behind") or row.get("waits_behind_retried"):
        return ""
    if posting(row, now):
        return "  being sent now"
    if being_sent(row, now):  # claimed with the rows before it in the batch, not posted yet
        return "  claimed by a dispatcher: waits its turn in its batch"
    seconds = (at - now).total_seconds()
    if seconds >= 1:
        return f"  next attempt in {_span(seconds)}"
    return f"  next attempt due {_span(-seconds)} ago" if seconds <= -1 else "  next attempt due"


def _span(seconds: float) -> str:
    """A duration in its two largest units: 45s, 4m10s, 2h05m, 3d04h."""
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"


def show_lines(row: dict[str, Any]) -> list[str]:
    """The row's whole state, a fact a line, and what an operator can do about it."""
    from orchestrator.store.types import utcnow

    number, status = row["outbox_id"], row["status"]
    what = (
        f"approved action {row['action_id']}"
        if row["kind"] == "action"
        else (f"task event {row['event_id']}")
    )
    lines = [f"outbox {number}  {status}  {what}  task {row['task_id']}"]
    lines.append(f"  written {time_text(row['created_at'])}")
    lines.append(f"  attempts {row['attempts']} (throttled {row['throttled']})")
    if row["last_error"]:
        lines.append(f"  {error_label(row)}: {printable(row['last_error'])}")
    if dead_label(row):
        lines.append(f"  {dead_label(row)}")
    if row.get("retried_at") is not None:
        # Who made it due again (or hurried it), as a discard says who settled it.
        note = f": {printable(row['retry_note'])}" if row.get("retry_note") else ""
        lines.append(f"  retried by {_retrier(row)} at {time_text(row['retried_at'])}{note}")
    released = row.get("released_at")
    if isinstance(released, datetime) and released > row["created_at"]:
        # The gauge times its wait from then: written three days ago and retried a minute ago,
        # it has not waited three days for a dispatcher.
        lines.append(
            f"  due again from {time_text(released)}, {_released_by(row)}: "
            "orchestrator_outbox_oldest_pending_seconds times its wait from then, not from "
            "when it was written"
        )
    if posting(row, utcnow()):
        lines.append(
            f"  being sent now (attempt {row['attempts']}, held until "
            f"{time_text(row['claimed_until'])}, posted at {time_text(row['sending_since'])}): "
            "a retry or discard waits until its answer is recorded"
        )
    elif being_sent(row, utcnow()):
        lines.append(
            "  claimed by a dispatcher, not sent yet: it waits its turn in the batch the "
            f"dispatcher sends (attempt {row['attempts']}, held until "
            f"{time_text(row['claimed_until'])}); a retry waits until its answer is recorded, a "
            "discard settles it now (the dispatcher then skips it)"
        )
    elif status == "pending" and not (row["waits_behind"] or row["waits_behind_retried"]):
        lines.append(f"  next attempt {time_text(row['next_attempt_at'])}")
    if row["waits_behind"]:  # its own next attempt is past, and means nothing until then
        lines.append(
            f"  waits behind dead letter outbox {row['waits_behind']} (outbox retry or discard it)"
        )
    elif row["waits_behind_retried"]:
        lines.append(f"  waits behind outbox {row['waits_behind_retried']}, being retried")
    if status == "delivered":
        after = (
            ", after its discard: the send under way then was answered 2xx (the backend did act "
            "on it)"
            if delivered_after_discard(row)
            else ""
        )
        lines.append(f"  delivered {time_text(row['delivered_at'])}{after}")
    if status == "discarded" or delivered_after_discard(row):
        # One discarded while pending was never dead-lettered: it failed, and a person settled it.
        was = (
            " (it was pending, not dead-lettered)" if row.get("discarded_from") == "pending" else ""
        )
        lines.append(
            f"  discarded by {printable(row['discarded_by'])} at {time_text(row['discarded_at'])}"
            f"{was}: {printable(row['discard_reason'])}"
        )
    held = row["waits_behind"] or row["waits_behind_retried"]
    if status == "pending" and row["last_error"] and not (held or being_sent(row, utcnow())):
        # Failing, not dead: an action is retried until a 2xx, so one the backend always
        # refuses with a 500 is settled by a person or sent for ever. A retry hurries only one
        # that backs off (one due now is due already).
        at = row["next_attempt_at"]
        hurry = (
            f"`orchestrator outbox retry {number}` sends it now once the backend is mended, or "
            if isinstance(at, datetime) and at > utcnow()
            else ""
        )
        lines.append(
            f"  {hurry}`orchestrator outbox discard {number} --reason R` once dealt with by hand"
        )
    if status == "dead":
        lines.append(
            f"  `orchestrator outbox retry {number}` once the backend is mended, or "
            f"`orchestrator outbox discard {number} --reason R` once dealt with by hand"
        )
    return lines


def _released_by(row: dict[str, Any]) -> str:
    """What made the row deliverable again at its `released_at`, as far as the row tells: its
    own retry out of the dead letters (the retry's time is the release's), or, for a task
    event, a retry or discard of an earlier event of its task that held it back."""
    own = row.get("retried_at") == row["released_at"] or row["kind"] == "action"
    if own:
        return "when an operator's retry took it out of the dead letters (fresh counts)"
    earlier = (
        "when an operator retried or discarded an earlier event of its task that held it back "
        "(a task's events go in order)"
    )
    if row.get("retried_at") is None:
        return earlier
    # Retried since (hurried while pending): its own retry out of the dead letters before that,
    # or an earlier event's; the row does not keep which.
    return f"{earlier}, or retried it out of the dead letters"


def _retrier(row: dict[str, Any]) -> str:
    """Who retried the row; a retry stored without a name read `retried by  at T`."""
    return printable(row["retried_by"]) if row.get("retried_by") else "an unrecorded name"
