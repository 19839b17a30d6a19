"""The closed vocabularies as enums for the OpenAPI schema (values from domain.vocabulary).

tests/unit/test_api_contract.py checks each enum against its tuple, so the two cannot drift.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = [
    "ActionKind",
    "ActionStatus",
    "EvidenceOrigin",
    "ExecutionOutcome",
    "NodeActor",
    "NodeStatus",
    "ReceiptStatus",
    "ReportOutcome",
    "SessionPurpose",
    "TaskOrigin",
    "TaskStatus",
]


class TaskStatus(StrEnum):
    queued = "queued"
    running = "running"
    waiting = "waiting"
    completed = "completed"
    failed = "failed"
    cancelled = "cancelled"


class TaskOrigin(StrEnum):
    live = "live"
    peripheral_sample = "peripheral_sample"


class ExecutionOutcome(StrEnum):
    completed = "completed"
    waiting = "waiting"
    continue_ = "continue"
    failed = "failed"
    lost = "lost"
    cancelled = "cancelled"
    superseded = "superseded"


class SessionPurpose(StrEnum):
    ordinary_chat = "ordinary_chat"
    task_execution = "task_execution"
    task_collaboration = "task_collaboration"


class ReportOutcome(StrEnum):
    completed = "completed"
    waiting = "waiting"
    failed = "failed"
    continue_ = "continue"


class ActionKind(StrEnum):
    work_order = "work_order"
    command = "command"


class ActionStatus(StrEnum):
    pending_approval = "pending_approval"
    approved = "approved"
    rejected = "rejected"
    superseded = "superseded"


class ReceiptStatus(StrEnum):
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    pending = "pending"
    unknown = "unknown"


class NodeActor(StrEnum):
    agent = "agent"
    human = "human"


class NodeStatus(StrEnum):
    pending = "pending"
    running = "running"
    waiting = "waiting"
    completed = "completed"
    failed = "failed"
    skipped = "skipped"
    cancelled = "cancelled"


class EvidenceOrigin(StrEnum):
    live = "live"
    synthetic = "synthetic"
    peripheral_sample = "peripheral_sample"
