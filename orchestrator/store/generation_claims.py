"""How a worker claims a queued generation: queued → running, with its lease token.

The claim is a compare-and-set on the task and execution rows: the task moves queued → running
only for exactly the generation the wake-up named, and only while that generation's execution
row is open; the open row then takes the lease token, the worker, where the claim runs (so a
restart on that host can recover it without the lease) and `started_at`. A generation already
claimed, superseded or finished claims nothing, so of two claimers the second does nothing. On
Postgres both halves are one statement (the execution half runs only if the task half matched);
`claim_generation_alone` sends it in autocommit on `store.driver`'s kept connections, as a unit
of work of its own; elsewhere the two halves are one transaction. `task_state_alone` reads the
task's generation and status the same way, before a wake-up takes the lease.

The rest of a generation's life (opened, kept, handed back, ended, requeued) is in
`orchestrator.store.generations`.
"""

from __future__ import annotations

from datetime import datetime
from functools import cache
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Select, Update, and_, bindparam, exists, select, true, update

from orchestrator.store import driver
from orchestrator.store.records import TaskRecord, driver_row
from orchestrator.store.row_checks import on_the_row
from orchestrator.store.tables import executions, tasks
from orchestrator.store.types import utcnow

if TYPE_CHECKING:
    from orchestrator.domain.processes import ProcessIdentity
    from orchestrator.store.db import Database

__all__ = [
    "claim_generation",
    "claim_generation_alone",
    "task_state_alone",
]


def claim_generation(
    conn: Connection,
    task_id: str,
    generation: int,
    *,
    lease_token: str,
    worker: str,
    celery_task_id: str | None,
    lease_expires_at: datetime,
    process: ProcessIdentity | None = None,
) -> tuple[TaskRecord, str] | None:
    """queued → running for exactly this generation: the task and the generation's session id.

    None when the generation is not the task's queued one (claimed, superseded, finished), or
    its execution row is already closed. On Postgres one statement: send it in autocommit
    (`claim_generation_alone` does). `process` (where the claim runs) lets a restart on that
    host recover it without the lease.
    """
    params = _claim_params(
        task_id, generation, lease_token, worker, celery_task_id, lease_expires_at, process
    )
    return _claim(conn, params)


def claim_generation_alone(
    db: Database,
    task_id: str,
    generation: int,
    *,
    lease_token: str,
    worker: str,
    celery_task_id: str | None,
    lease_expires_at: datetime,
    process: ProcessIdentity | None = None,
) -> tuple[TaskRecord, str] | None:
    """`claim_generation` as a unit of work of its own. On Postgres its one statement goes in
    autocommit on `store.driver`'s kept connections (`driver.rows`): the same statement and
    round trip, without checking a pooled connection out, switching it to autocommit and back
    (about as much Python as the claim itself). Elsewhere one transaction."""
    params = _claim_params(
        task_id, generation, lease_token, worker, celery_task_id, lease_expires_at, process
    )
    if db.dialect != "postgresql":
        with db.transaction() as conn:
            return _claim(conn, params)
    return _claimed(driver.rows(db.engine, _one_statement_claim(), params))


def _claim(conn: Connection, params: dict[str, Any]) -> tuple[TaskRecord, str] | None:
    """The claim of `params` (`_claim_params`) in `conn`'s transaction."""
    if conn.dialect.name == "postgresql":
        return _claimed(driver.fetch(conn, _one_statement_claim(), params))
    task_row = conn.execute(_claim_task(), params).one_or_none()
    if task_row is None:
        return None
    session_id = conn.execute(_claim_execution(), params).scalar_one()
    return TaskRecord.from_row(task_row), str(session_id)


def task_state_alone(db: Database, task_id: str) -> tuple[int, str] | None:
    """The task's generation and status (None: no such task), read as a unit of work of its
    own: on Postgres one statement in autocommit on `driver.rows`'s kept connections, as the
    claim is; elsewhere one transaction."""
    params = {"state_task_id": task_id}
    if db.dialect != "postgresql":
        with db.transaction(readonly=True) as conn:
            rows = [tuple(row) for row in conn.execute(_task_state(), params)]
    else:
        rows = driver.rows(db.engine, _task_state(), params)
    if not rows:
        return None
    generation, status = rows[0]
    return int(generation), str(status)


@cache
def _task_state() -> Select[Any]:
    return select(tasks.c.generation, tasks.c.status).where(
        tasks.c.task_id == bindparam("state_task_id")
    )


def _claim_params(
    task_id: str,
    generation: int,
    lease_token: str,
    worker: str,
    celery_task_id: str | None,
    lease_expires_at: datetime,
    process: ProcessIdentity | None,
) -> dict[str, Any]:
    return {
        "claim_worker_host": process.host if process else None,
        "claim_worker_pid": process.pid if process else None,
        "claim_worker_started": process.started if process else None,
        "claim_task_id": task_id,
        "claim_generation": generation,
        "claim_now": utcnow(),
        "claim_lease_token": lease_token,
        "claim_worker": worker,
        "claim_celery_task_id": celery_task_id,
        "claim_lease_expires_at": lease_expires_at,
    }


def _claimed(rows: list[tuple[Any, ...]]) -> tuple[TaskRecord, str] | None:
    """The task and session id the one-statement claim returned, if it claimed."""
    if not rows:
        return None
    (*task_values, session_id), *_ = rows
    return TaskRecord.from_row(driver_row(_TASK_COLUMNS, task_values)), str(session_id)


def _open_execution() -> Any:
    return and_(
        executions.c.task_id == bindparam("claim_task_id"),
        executions.c.generation == bindparam("claim_generation"),
        executions.c.outcome.is_(None),
    )


@cache
def _claim_task() -> Update:
    """The task half of a claim: queued → running, only while its execution row is open."""
    return (
        update(tasks)
        .where(
            tasks.c.task_id == bindparam("claim_task_id"),
            tasks.c.generation == bindparam("claim_generation"),
            on_the_row(tasks.c.status == "queued"),
            exists().where(_open_execution()),
        )
        .values(status="running", updated_at=bindparam("claim_now", type_=tasks.c.updated_at.type))
        .returning(*tasks.c)
    )


def _claim_execution(after: Any = None) -> Update:
    """The execution half: the lease token, the worker and `started_at` go on the open row."""
    where = [_open_execution()] if after is None else [_open_execution(), after]
    return (
        update(executions)
        .where(*where)
        .values(
            lease_token=bindparam("claim_lease_token"),
            worker=bindparam("claim_worker"),
            celery_task_id=bindparam("claim_celery_task_id"),
            worker_host=bindparam("claim_worker_host"),
            worker_pid=bindparam("claim_worker_pid"),
            worker_started=bindparam("claim_worker_started"),
            started_at=bindparam("claim_now", type_=executions.c.started_at.type),
            lease_expires_at=bindparam(
                "claim_lease_expires_at", type_=executions.c.lease_expires_at.type
            ),
        )
        .returning(executions.c.session_id)
    )


_TASK_COLUMNS = tuple(column.name for column in tasks.c)  # as `_claim_task` returns them


@cache
def _one_statement_claim() -> Select[Any]:
    """Postgres: both halves in one statement; the execution half runs only if the task half
    matched. Every writer that closes an execution row locks the task row first, so between
    the two halves nothing can close the row the task half saw open."""
    claimed_task = _claim_task().cte("claimed_task")
    claimed_execution = _claim_execution(exists(select(claimed_task.c.task_id))).cte(
        "claimed_execution"
    )
    return select(
        claimed_task, claimed_execution.c.session_id.label("claimed_session_id")
    ).select_from(claimed_task.join(claimed_execution, true()))
