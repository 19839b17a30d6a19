"""What happened to a call → the status the model sees and the status its receipt keeps.

Seed 000: a validation error before the call and an explicit rejection are `failed`; a transport
break after sending, a timeout or an unreadable response are `unknown`; a confirmed asynchronous
submission is `pending`, which is not done. Receipts keep one of the fixed host texts below, never
tool output, so nothing a backend or a model wrote can reach the ledger.
"""

from __future__ import annotations

from typing import Final, Literal

__all__ = [
    "OUTCOMES",
    "SUMMARIES",
    "UNRESOLVED",
    "Outcome",
    "ReceiptStatus",
    "Status",
    "default_outcome",
    "model_message",
    "receipt_status",
    "summary_for",
    "tool_status",
]

Status = Literal["succeeded", "failed", "pending", "unknown"]
ReceiptStatus = Literal["running", "succeeded", "failed", "pending", "unknown"]
Outcome = Literal[
    "succeeded",  # the tool confirmed the effect
    "submitted",  # an asynchronous job was confirmed submitted; it is not finished
    "invalid_arguments",  # refused by validation before anything was sent
    "not_sent",  # the request provably never left (connection refused, pool exhausted)
    "rejected",  # an explicit refusal by the target (HTTP 4xx, a business "no")
    "transport_broken",  # the connection broke after the request may have been sent
    "timed_out",  # no answer in time after sending
    "unreadable_response",  # an answer came but cannot be read
    "server_error",  # the target answered 5xx: it may have applied part of the write
    "raised",  # the tool raised while executing
    "indeterminate",  # the tool itself could not confirm how it ended
    "command_failed",  # a command exited non-zero, or was stopped at its timeout (confirmed)
    "cancelled",  # the round was cancelled while the call ran
    "time_limit",  # the host stopped waiting at the per-call deadline (ORCH_TOOL_TIMEOUT_SECONDS)
    "not_started",  # claimed, but the round stopped or gave it up before it ran: never sent
    "record_failed",  # the effect ran but its outcome could not be recorded
    "verified",  # a read-only read-back matched the intended value
    "recovered",  # a cold start found the call still running
]

OUTCOMES: Final[tuple[Outcome, ...]] = (
    "succeeded",
    "submitted",
    "invalid_arguments",
    "not_sent",
    "rejected",
    "transport_broken",
    "timed_out",
    "unreadable_response",
    "server_error",
    "raised",
    "indeterminate",
    "command_failed",
    "cancelled",
    "time_limit",
    "not_started",
    "record_failed",
    "verified",
    "recovered",
)

#: Receipt states from which a write must be verified, never replayed (seed: 运行中或未知).
UNRESOLVED: Final[tuple[ReceiptStatus, ...]] = ("running", "unknown")

_RECEIPT: Final[dict[Outcome, ReceiptStatus]] = {
    "succeeded": "succeeded",
    "verified": "succeeded",
    "submitted": "pending",
    "invalid_arguments": "failed",
    "not_sent": "failed",
    "rejected": "failed",
    "transport_broken": "unknown",
    "timed_out": "unknown",
    "unreadable_response": "unknown",
    "server_error": "unknown",
    "raised": "unknown",
    "indeterminate": "unknown",
    "command_failed": "failed",
    "cancelled": "unknown",
    "time_limit": "unknown",
    # The host holds the call between its claim and its run: it knows the call never ran.
    "not_started": "failed",
    "recovered": "unknown",
    # The ledger could not be written: the row stays as it was (`running`) and the next cold
    # start turns it into `unknown`; the model is told `unknown` now.
    "record_failed": "running",
}

#: The fixed host texts a receipt's `summary` may hold. Nothing else is ever stored there.
SUMMARIES: Final[dict[str, str]] = {
    "claimed": "Claimed by the host; the call is running.",
    "succeeded": "The call succeeded.",
    "verified": "A read-only read-back matched the intended value; not sent again.",
    "submitted": "An asynchronous job was submitted; it is not finished.",
    "invalid_arguments": "Refused before sending: the arguments are invalid.",
    "not_sent": "Failed before sending: the target could not be reached.",
    "rejected": "The target explicitly rejected the call.",
    "transport_broken": "The connection broke after sending; the outcome is unknown.",
    "timed_out": "No answer in time after sending; the outcome is unknown.",
    "unreadable_response": "The answer could not be read; the outcome is unknown.",
    "server_error": "The target reported a server error; the outcome is unknown.",
    "raised": "The tool raised an error while running; the outcome is unknown.",
    "indeterminate": "The tool could not confirm how the call ended; the outcome is unknown.",
    "command_failed": "The command exited non-zero or was stopped at its timeout.",
    "cancelled": "Cancelled while running; the outcome is unknown.",
    "time_limit": "No result within the host's time limit for a call; the outcome is unknown.",
    "not_started": "Not run: the round stopped or gave the call up before it started.",
    "recovered": "Still running at a cold start; the outcome is unknown.",
    "record_failed": "The outcome could not be recorded; it is unknown.",
    # Host states, not outcomes of a call: its generation ended, or its round reaped it.
    "generation_ended": "Still running when its generation ended; the outcome is unknown.",
    "reaped": "A background command still running at round end was stopped; outcome unknown.",
    # An operator settled an unknown or pending write; who and why are in the task's events.
    "resolved_succeeded": "An operator resolved it as succeeded (see the task's events).",
    "resolved_failed": "An operator resolved it as failed (see the task's events).",
}

_MESSAGES: Final[dict[Outcome, str]] = {
    "succeeded": "The call succeeded.",
    "verified": (
        "An identical earlier write was left unresolved; a read-only read-back shows the "
        "intended value is in place, so it was not sent again."
    ),
    "submitted": (
        "The asynchronous job was submitted and is not finished; do not submit it again, "
        "check its progress with a read-only query."
    ),
    "invalid_arguments": "The arguments are invalid; nothing was sent. Fix them and call again.",
    "not_sent": "The target could not be reached; nothing was sent.",
    "rejected": "The target rejected the call; nothing was changed by it.",
    "transport_broken": (
        "The connection broke after the request was sent: the outcome is unknown. Verify with "
        "a read-only query or get_tool_execution before any retry."
    ),
    "timed_out": (
        "No answer in time after the request was sent: the outcome is unknown. Verify with a "
        "read-only query or get_tool_execution before any retry."
    ),
    "unreadable_response": (
        "The answer could not be read: the outcome is unknown. Verify with a read-only query "
        "before any retry."
    ),
    "server_error": (
        "The target reported a server error: the write may be partly applied and the outcome "
        "is unknown. Verify with a read-only query before any retry."
    ),
    "raised": (
        "The tool failed while running: the outcome is unknown. Verify with a read-only query "
        "before any retry."
    ),
    "indeterminate": (
        "The tool could not confirm how the call ended: the outcome is unknown. Verify with a "
        "read-only query before any retry."
    ),
    "command_failed": (
        "The command failed (non-zero exit, or stopped at its timeout); what it already did "
        "is not undone."
    ),
    "cancelled": "The call was cancelled while running: the outcome is unknown.",
    "time_limit": (
        "The call gave no result within the host's time limit (ORCH_TOOL_TIMEOUT_SECONDS) and "
        "the host stopped waiting for it: the outcome is unknown and it may still take effect. "
        "Verify with a read-only query or get_tool_execution before any retry."
    ),
    "not_started": (
        "The round stopped (or the host gave the call up) before the write started: it was "
        "not run and nothing was sent."
    ),
    "record_failed": (
        "The outcome could not be recorded, so it is unknown. Verify with a read-only query "
        "before any retry."
    ),
    "recovered": (
        "The call was still running when the host restarted: the outcome is unknown. Verify "
        "with a read-only query or get_tool_execution before any retry."
    ),
}

_UNKNOWN_FOR_READS: Final = frozenset(
    {
        "transport_broken",
        "timed_out",
        "unreadable_response",
        "server_error",
        "raised",
        "indeterminate",
        "time_limit",
        "record_failed",
        "recovered",
    }
)

_DEFAULT: Final[dict[Status, Outcome]] = {
    "succeeded": "succeeded",
    "failed": "rejected",
    "pending": "submitted",
    "unknown": "indeterminate",
}


def receipt_status(outcome: Outcome) -> ReceiptStatus:
    """The status a write's receipt records for `outcome`."""
    return _RECEIPT[outcome]


def tool_status(outcome: Outcome, *, writes: bool = True) -> Status:
    """The status the model sees for `outcome`.

    A read has no side effect to be unsure about, so what would be `unknown` for a write is a
    plain `failed` for a read; a cancelled read is `failed` too (nothing can have happened).
    """
    if not writes and (outcome in _UNKNOWN_FOR_READS or outcome == "cancelled"):
        return "failed"
    status = _RECEIPT[outcome]
    return "unknown" if status == "running" else status


def summary_for(
    outcome: Outcome
    | Literal["claimed", "generation_ended", "reaped", "resolved_succeeded", "resolved_failed"],
) -> str:
    """The fixed host text for a receipt in this state."""
    return SUMMARIES[outcome]


def model_message(outcome: Outcome) -> str:
    """The fixed host text the model reads beside the status."""
    return _MESSAGES[outcome]


def default_outcome(status: Status) -> Outcome:
    """The outcome to record when a tool gave a status but no (consistent) outcome."""
    return _DEFAULT[status]
