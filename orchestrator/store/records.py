"""Frozen records of tasks and executions, read from rows."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

from sqlalchemy import Row

__all__ = ["ExecutionRecord", "TaskRecord", "driver_row"]


@dataclass(frozen=True)
class TaskRecord:
    task_id: str
    task_type: str
    title: str
    context: dict[str, Any]
    sample_input: dict[str, Any] | None
    trigger_id: str
    origin: str
    status: str
    generation: int
    session_id: str | None
    failure_code: str | None
    last_error: str | None
    recoveries: int
    #: Losses in a row of generations handed back after an outage (not counted in
    #: `recoveries`): ORCH_MAX_HANDBACKS parks at it.
    handbacks: int
    rounds: int
    #: Bumped only by a trigger's or an operator's new request (requeue): writes of an earlier
    #: intent round may run again, recovered or continued generations share their round's.
    intent_round: int
    queued_at: datetime | None
    created_at: datetime
    updated_at: datetime

    @classmethod
    def from_row(cls, row: Row[Any] | SimpleNamespace) -> TaskRecord:
        return cls(**{name: getattr(row, name) for name in cls.__dataclass_fields__})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ExecutionRecord:
    task_id: str
    generation: int
    session_id: str
    celery_task_id: str | None
    worker: str | None
    lease_token: str | None
    lease_expires_at: datetime | None
    created_at: datetime
    started_at: datetime | None
    ended_at: datetime | None
    outcome: str | None
    failure_code: str | None
    reason: str | None
    handed_back_at: datetime | None

    @classmethod
    def from_row(cls, row: Row[Any]) -> ExecutionRecord:
        return cls(**{name: getattr(row, name) for name in cls.__dataclass_fields__})

    def to_dict(self) -> dict[str, Any]:
        """The explain view of one generation (the lease token is never shown)."""
        return {
            "generation": self.generation,
            "session_id": self.session_id,
            "outcome": self.outcome,
            "failure_code": self.failure_code,
            "reason": self.reason,
            "created_at": self.created_at,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "worker": self.worker,
            "handed_back_at": self.handed_back_at,
        }


def driver_row(columns: Sequence[str], values: Sequence[Any]) -> SimpleNamespace:
    """A row `store.driver` read, named as SQLAlchemy's rows are (for the records'
    `from_row`). Its timestamps come in the session's time zone; every record the store gives
    is in UTC, as `types.UTCDateTime` makes SQLAlchemy's."""
    return SimpleNamespace(
        **{name: _in_utc(value) for name, value in zip(columns, values, strict=True)}
    )


def _in_utc(value: Any) -> Any:
    return value.astimezone(UTC) if isinstance(value, datetime) else value
