"""Lost generations, many at once: close them, then requeue or park their tasks, in one transaction.

The sweeper (expired leases) and the dead-process check (a worker of this host that is gone)
both end here. The statements are the same compare-and-sets as for one generation, sent as a
few set-wise statements for the whole batch (six on Postgres, however many generations) instead
of a transaction per generation:

- the task rows are locked first, in task-id order (every writer that closes an execution row
  locks its task row first, so no deadlock and no claim can slip in between);
- the execution rows close only while still open (`outcome IS NULL`): of two sweepers racing
  over one expiry, the second finds it closed and does nothing for it;
- only a task still `running` at that generation moves, to generation n+1 `queued`, or to
  `failed` (`recovery_limit`) after too many losses in a row: `recoveries` counts those of a
  worker that died or stalled (ORCH_MAX_RECOVERIES), `handbacks` those its worker handed back
  after an outage (`executions.handed_back_at`, ORCH_MAX_HANDBACKS).

On Postgres the transaction plans with the cost model of cached tables (`_KEYED_READS`), so
the batch and the events recorded after it in the same transaction read the tasks by key.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import (
    ARRAY,
    ColumnElement,
    Connection,
    String,
    and_,
    any_,
    case,
    cast,
    func,
    insert,
    literal,
    select,
    text,
    tuple_,
    update,
)

from orchestrator.domain.outcomes import summary_for
from orchestrator.domain.processes import ProcessIdentity
from orchestrator.store.actions import ActionRecord, superseded_from_rows
from orchestrator.store.generations import generation_rows, new_id
from orchestrator.store.tables import actions, executions, invocation_receipts, sessions, tasks
from orchestrator.store.types import utcnow

__all__ = ["HANDED_BACK", "Held", "Limits", "LostBatch", "held_on_host", "requeue_lost"]

_K = TypeVar("_K")

#: Why a generation its worker handed back was lost (the execution's reason, the task event's).
HANDED_BACK = (
    "handed back by its worker after an outage (the store or Redis failed under its round)"
)


@dataclass
class LostBatch:
    """What one batch did: (task, lost generation, new generation) and (task, lost generation).

    `at` is when the batch closed them; `lease_expiries` the mirrored lease expiry of each
    generation this batch closed (None if the store never had one), for the recovery delay;
    `superseded` the pending actions of those generations that it superseded; `handed_back`
    the closed generations their workers had handed back (`HANDED_BACK`).
    """

    requeued: list[tuple[str, int, int]] = field(default_factory=list)
    parked: list[tuple[str, int]] = field(default_factory=list)
    at: datetime | None = None
    lease_expiries: dict[tuple[str, int], datetime | None] = field(default_factory=dict)
    superseded: list[ActionRecord] = field(default_factory=list)
    handed_back: set[tuple[str, int]] = field(default_factory=set)
    #: Of `handed_back`, why each was handed back, as its execution says (a rate-limited
    #: model server's reason, or `HANDED_BACK` after an outage).
    handed_back_why: dict[tuple[str, int], str] = field(default_factory=dict)

    def reason(self, task_id: str, generation: int, reason: str) -> str:
        """Why this generation was lost: `reason`, unless its worker handed it back."""
        if (task_id, generation) in self.handed_back:
            return self.handed_back_why.get((task_id, generation)) or HANDED_BACK
        return reason


@dataclass(frozen=True)
class Limits:
    """Losses in a row before a task is parked: `recoveries` of a worker that died or stalled,
    `handbacks` handed back by their workers after an outage."""

    recoveries: int
    handbacks: int


@dataclass(frozen=True)
class Held:
    """An open, started generation and the process that claimed it."""

    task_id: str
    generation: int
    lease_token: str | None
    process: ProcessIdentity


def held_on_host(conn: Connection, host: str) -> list[Held]:
    """Open generations claimed by processes of `host` (index on `worker_host, outcome`) that
    their workers still hold. One its worker handed back is no longer held: its mirrored lease
    says when it is requeued (a model server's Retry-After), whether or not that process is
    still there; requeued at once after a worker's restart, it met the same 429 again."""
    rows = conn.execute(
        select(
            executions.c.task_id,
            executions.c.generation,
            executions.c.lease_token,
            executions.c.worker_pid,
            executions.c.worker_started,
        ).where(
            executions.c.worker_host == host,
            executions.c.outcome.is_(None),
            executions.c.worker_pid.is_not(None),
            executions.c.handed_back_at.is_(None),
        )
    )
    return [
        Held(
            row.task_id,
            row.generation,
            row.lease_token,
            ProcessIdentity(host, row.worker_pid, row.worker_started),
        )
        for row in rows
    ]


def requeue_lost(
    conn: Connection,
    lost: Sequence[tuple[str, int]],
    *,
    reason: str,
    limits: Limits,
    expired_before: datetime | None = None,
) -> LostBatch:
    """Close each open (task, generation) of `lost` as `lost`; requeue or park its task.

    `expired_before` (the sweeper's expiries): only while the mirrored lease is still expired
    at that time. A worker that took its free lease back mirrors it before it goes on; if that
    mirror committed after the sweeper read the expiry, the store said the generation is live,
    and it stays so.
    """
    batch = LostBatch()
    wanted = dict(sorted(set(lost)))  # one generation per task: a task runs one at a time
    if not wanted:
        return batch
    now = batch.at = utcnow()
    if conn.dialect.name == "postgresql":
        conn.execute(_KEYED_READS)
    locked = {
        row.task_id: row
        for row in conn.execute(
            select(
                tasks.c.task_id,
                tasks.c.generation,
                tasks.c.status,
                tasks.c.recoveries,
                tasks.c.handbacks,
                tasks.c.title,
            )
            .where(_among(conn, tasks.c.task_id, list(wanted)))
            .order_by(tasks.c.task_id)
            .with_for_update()
        )
    }
    closed = conn.execute(
        update(executions)
        .where(
            _pairs(conn, wanted),
            executions.c.outcome.is_(None),
            *([] if expired_before is None else [executions.c.lease_expires_at < expired_before]),
        )
        .values(
            outcome="lost",
            # A hand-back that said why (a rate-limited model server) keeps its reason.
            reason=case(
                (
                    executions.c.handed_back_at.is_not(None),
                    func.coalesce(executions.c.reason, literal(HANDED_BACK)),
                ),
                else_=reason,
            ),
            ended_at=now,
        )
        .returning(
            executions.c.task_id,
            executions.c.generation,
            executions.c.lease_expires_at,
            executions.c.handed_back_at,
            executions.c.reason,
        )
    ).all()
    batch.lease_expiries = {(row.task_id, row.generation): row.lease_expires_at for row in closed}
    batch.handed_back = {
        (row.task_id, row.generation) for row in closed if row.handed_back_at is not None
    }
    batch.handed_back_why = {
        (row.task_id, row.generation): str(row.reason)
        for row in closed
        if row.handed_back_at is not None and row.reason
    }
    moving = [
        locked[row.task_id]
        for row in closed
        if row.task_id in locked
        and locked[row.task_id].generation == row.generation
        and locked[row.task_id].status == "running"
    ]
    if not moving:
        return batch
    owners = [f"task:{task.task_id}" for task in moving]
    # As in a cold start: their running writes become unknown, with a token no finisher holds.
    conn.execute(
        update(invocation_receipts)
        .where(
            invocation_receipts.c.status == "running",
            _among(conn, invocation_receipts.c.owner, owners),
        )
        .values(
            status="unknown",
            summary=summary_for("recovered"),
            claim_token=f"cold-{secrets.token_hex(16)}",
            updated_at=now,
        )
    )
    # Like an operator requeue or cancel: the lost generations' proposals are not approvable
    # any more; the next generation proposes again if it still needs them.
    # The actions come back for their `action_superseded` notices (the caller records them).
    for generation, ids in _grouped(moving, lambda task: task.generation).items():
        batch.superseded += superseded_from_rows(
            conn.execute(
                update(actions)
                .where(_among(conn, actions.c.task_id, ids), actions.c.status == "pending_approval")
                .values(status="superseded", note=f"generation {generation} lost its lease")
                .returning(*actions.c)
            )
        )
    counts = {task.task_id: _counted(task, batch.handed_back, limits) for task in moving}
    parking = [task for task in moving if counts[task.task_id].parks]
    requeuing = [task for task in moving if not counts[task.task_id].parks]
    for count, ids in _grouped(parking, lambda task: counts[task.task_id]).items():
        conn.execute(
            update(tasks)
            .where(_among(conn, tasks.c.task_id, ids), tasks.c.status == "running")
            .values(
                status="failed",
                failure_code="recovery_limit",
                last_error=count.why(),
                recoveries=count.recoveries,
                handbacks=count.handbacks,
                updated_at=now,
            )
        )
    batch.parked = [(task.task_id, task.generation) for task in parking]
    if not requeuing:
        return batch
    rows = [
        generation_rows(task.task_id, task.generation + 1, task.title, new_id(), now)
        for task in requeuing
    ]
    if conn.dialect.name == "postgresql":
        conn.execute(
            _PG_REQUEUE,
            {
                "task_ids": [s["task_id"] for s, _ in rows],
                "generations": [s["generation"] for s, _ in rows],
                "session_ids": [s["session_id"] for s, _ in rows],
                "titles": [s["title"] for s, _ in rows],
                "recoveries": [counts[t.task_id].recoveries for t in requeuing],
                "handbacks": [counts[t.task_id].handbacks for t in requeuing],
                "now": now,
            },
        )
        batch.requeued = [(t.task_id, t.generation, t.generation + 1) for t in requeuing]
        return batch
    conn.execute(insert(sessions), [session for session, _ in rows])
    conn.execute(insert(executions), [execution for _, execution in rows])
    # Set-wise: every expression reads the row as it was, so `generation + 1` is the new one.
    next_session = (
        select(sessions.c.session_id)
        .where(
            sessions.c.task_id == tasks.c.task_id,
            sessions.c.generation == tasks.c.generation + 1,
            sessions.c.purpose == "task_execution",
        )
        .scalar_subquery()
    )
    for count, ids in _grouped(requeuing, lambda task: counts[task.task_id]).items():
        conn.execute(
            update(tasks)
            .where(_among(conn, tasks.c.task_id, ids), tasks.c.status == "running")
            .values(
                generation=tasks.c.generation + 1,
                status="queued",
                queued_at=now,
                updated_at=now,
                recoveries=count.recoveries,
                handbacks=count.handbacks,
                failure_code=None,
                session_id=next_session,
            )
        )
    batch.requeued = [(t.task_id, t.generation, t.generation + 1) for t in requeuing]
    return batch


# Postgres, for the rest of this transaction: the cost model of cached tables and SSDs. With the
# default (4, for spinning disks) a batch of 100 keys among 10,000 tasks is planned as three
# scans of the whole tasks table (the locks, the move, the events), and a sweep grows with the
# table instead of its expiries (tests/integration/test_sweep_plans.py).
_KEYED_READS = text("SELECT set_config('random_page_cost', '1.1', true)")

# Postgres: the new generations' sessions and executions and the tasks' move to them, in one
# statement over arrays (the rows `generation_rows` makes, column by column).
_PG_REQUEUE = text(
    """
    WITH new AS (
        SELECT * FROM unnest(
            CAST(:task_ids AS text[]), CAST(:generations AS integer[]),
            CAST(:session_ids AS text[]), CAST(:titles AS text[]),
            CAST(:recoveries AS integer[]), CAST(:handbacks AS integer[])
        ) AS n (task_id, generation, session_id, title, recoveries, handbacks)
    ), new_sessions AS (
        INSERT INTO sessions
            (session_id, purpose, task_id, generation, owner, title, created_at, updated_at)
        SELECT session_id, 'task_execution', task_id, generation, 'task:' || task_id, title,
               :now, :now
        FROM new
    ), new_executions AS (
        INSERT INTO executions (task_id, generation, session_id, created_at)
        SELECT task_id, generation, session_id, :now FROM new
    )
    UPDATE tasks
    SET generation = new.generation, status = 'queued', queued_at = :now, updated_at = :now,
        recoveries = new.recoveries, handbacks = new.handbacks, failure_code = NULL,
        session_id = new.session_id
    FROM new
    WHERE tasks.task_id = new.task_id AND tasks.status = 'running'
      AND tasks.generation = new.generation - 1
    """
)


@dataclass(frozen=True)
class _Count:
    """A task's losses in a row once this one is counted, and whether they park it."""

    recoveries: int
    handbacks: int
    handed_back: bool
    parks: bool

    def why(self) -> str:
        if self.handed_back:
            return (
                f"{self.handbacks} generations in a row were handed back by their workers (the "
                "store, Redis or the model server was away; each execution says which)"
            )
        return f"{self.recoveries} generations in a row lost their lease"


def _counted(task: Any, handed_back: set[tuple[str, int]], limits: Limits) -> _Count:
    if (task.task_id, task.generation) in handed_back:
        handbacks = task.handbacks + 1
        return _Count(task.recoveries, handbacks, True, handbacks >= limits.handbacks)
    recoveries = task.recoveries + 1
    return _Count(recoveries, task.handbacks, False, recoveries >= limits.recoveries)


def _grouped(rows: Sequence[Any], key: Callable[[Any], _K]) -> dict[_K, list[str]]:
    groups: dict[_K, list[str]] = {}
    for task in rows:
        groups.setdefault(key(task), []).append(task.task_id)
    return groups


def _among(conn: Connection, column: ColumnElement[Any], values: list[Any]) -> ColumnElement[bool]:
    """`column IN values`; on Postgres `= ANY(array)`: one parameter, one cached statement."""
    if conn.dialect.name == "postgresql":
        # A plain text[] for strings: `varchar(n)[]` would cut longer values to n characters.
        element = String() if isinstance(column.type, String) else column.type
        return column == any_(literal(values, ARRAY(element)))
    return column.in_(values)


def _pairs(conn: Connection, wanted: dict[str, int]) -> ColumnElement[bool]:
    """The execution rows of exactly these (task, generation) pairs."""
    if conn.dialect.name != "postgresql":
        return tuple_(executions.c.task_id, executions.c.generation).in_(list(wanted.items()))
    keys = [f"{task_id}:{generation}" for task_id, generation in wanted.items()]
    key = executions.c.task_id + ":" + cast(executions.c.generation, String)
    return and_(_among(conn, executions.c.task_id, list(wanted)), _among(conn, key, keys))
