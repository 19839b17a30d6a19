"""The closed sets of names the records use. The store's CHECK constraints are built from these."""

from __future__ import annotations

from typing import Final

__all__ = [
    "ACTION_KINDS",
    "ACTION_STATUSES",
    "EVIDENCE_ORIGINS",
    "EXECUTION_OUTCOMES",
    "MESSAGE_ROLES",
    "NODE_ACTORS",
    "NODE_STATUSES",
    "OPEN_NODE_STATUSES",
    "OUTBOX_KINDS",
    "OUTBOX_STATUSES",
    "RECEIPT_STATUSES",
    "REPORT_OUTCOMES",
    "SESSION_PURPOSES",
    "TASK_ORIGINS",
    "TASK_STATUSES",
    "TERMINAL_TASK_STATUSES",
]

TASK_STATUSES: Final = ("queued", "running", "waiting", "completed", "failed", "cancelled")
TERMINAL_TASK_STATUSES: Final = ("completed", "failed", "cancelled")
TASK_ORIGINS: Final = ("live", "peripheral_sample")
EXECUTION_OUTCOMES: Final = (
    "completed",
    "waiting",
    "continue",
    "failed",
    "lost",
    "cancelled",
    "superseded",
)
SESSION_PURPOSES: Final = ("ordinary_chat", "task_execution", "task_collaboration")
NODE_ACTORS: Final = ("agent", "human")
NODE_STATUSES: Final = (
    "pending",
    "running",
    "waiting",
    "completed",
    "failed",
    "skipped",
    "cancelled",
)
#: A node in one of these is still to be done (by the agent, or by a person for a human one).
OPEN_NODE_STATUSES: Final = frozenset({"pending", "running", "waiting"})
REPORT_OUTCOMES: Final = ("completed", "waiting", "failed", "continue")
EVIDENCE_ORIGINS: Final = ("live", "synthetic", "peripheral_sample")
ACTION_KINDS: Final = ("work_order", "command")
ACTION_STATUSES: Final = ("pending_approval", "approved", "rejected", "superseded")
RECEIPT_STATUSES: Final = ("running", "succeeded", "failed", "pending", "unknown")
MESSAGE_ROLES: Final = ("user", "agent")
#: What an outbox row carries: an approved action's delivery, or a task event's webhook.
OUTBOX_KINDS: Final = ("action", "webhook")
#: `discarded`: a dead letter an operator settled by hand (`outbox discard`): never sent again,
#: and no longer holding its task's later events back.
OUTBOX_STATUSES: Final = ("pending", "delivered", "dead", "discarded")
