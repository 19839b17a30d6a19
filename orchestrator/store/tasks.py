"""Task rows: the task a trigger creates, its reads and lists, and the republish of a queued one.

A queued task's `queued_at` says when its generation's wake-up was last sent; NULL says the
broker did not take it (`record_unsent`), so the next sweep sends it first (`stale_queued`)
instead of waiting ORCH_QUEUED_STALE_SECONDS to take it for lost. Only the failure path writes
it: a trigger whose wake-up went out costs no statement more.

A task is created once per trigger id, queued at generation 1 with the session and execution row
of that generation (`orchestrator.store.generations` makes those rows, and every later change of
a generation's life but its claim, `orchestrator.store.generation_claims`). Every state change
here is a compare-and-set on the row. Functions take a `Connection`; the service that calls them
owns the transaction, so a check and the write it guards always commit together.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from functools import cache, lru_cache
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    Connection,
    Insert,
    Select,
    Table,
    bindparam,
    insert,
    null,
    or_,
    select,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite

from orchestrator.domain.task_filter import TaskFilter
from orchestrator.store import driver
from orchestrator.store.generations import GENERATION_COLUMNS, generation_rows, new_id
from orchestrator.store.keyset import past
from orchestrator.store.records import TaskRecord
from orchestrator.store.tables import executions, sessions, tasks
from orchestrator.store.types import utcnow

if TYPE_CHECKING:
    from sqlalchemy.engine import Dialect

    from orchestrator.store.db import Database

__all__ = [
    "NewTask",
    "get_task",
    "insert_task",
    "insert_task_alone",
    "list_tasks",
    "record_unsent",
    "stale_queued",
    "task_by_trigger",
    "touch_queued",
]


@dataclass(frozen=True)
class NewTask:
    task_type: str
    title: str
    context: dict[str, Any]
    trigger_id: str
    sample_input: dict[str, Any] | None = None


def get_task(conn: Connection, task_id: str, *, lock: bool = False) -> TaskRecord | None:
    query = select(tasks).where(tasks.c.task_id == task_id)
    if lock:
        query = query.with_for_update()
    row = conn.execute(query).one_or_none()
    return TaskRecord.from_row(row) if row is not None else None


def task_by_trigger(conn: Connection, trigger_id: str) -> TaskRecord | None:
    row = conn.execute(select(tasks).where(tasks.c.trigger_id == trigger_id)).one_or_none()
    return TaskRecord.from_row(row) if row is not None else None


def insert_task(conn: Connection, new: NewTask) -> TaskRecord | None:
    """A queued task at generation 1 with its session and execution row.

    None when a task with the same trigger id exists: the unique constraint decides, so two
    concurrent triggers with one id create one task.
    """
    task, session_row, execution_row = _new_task_rows(new)
    if conn.dialect.name == "postgresql":
        created = _insert_task_in_one_statement(conn, task, session_row, execution_row)
    else:
        created = (
            conn.execute(
                sqlite.insert(tasks)
                .values(task.to_dict())
                .on_conflict_do_nothing(index_elements=["trigger_id"])
                .returning(tasks.c.task_id)
            ).first()
            is not None
        )
        if created:
            conn.execute(insert(sessions).values(session_row))
            conn.execute(insert(executions).values(execution_row))
    return task if created else None


def insert_task_alone(db: Database, new: NewTask) -> TaskRecord | None:
    """`insert_task` as a unit of work of its own. On Postgres its one statement goes in
    autocommit on `store.driver`'s kept connections (`driver.rows`), as the worker's claim
    does: the same statement and round trip, without checking a pooled connection out,
    switching it to autocommit and back, and SQLAlchemy's execution of it (about 0.3 ms of the
    trigger's 0.9 ms of Python, on the caller's trigger -> agent start path). Elsewhere one
    transaction."""
    if db.dialect != "postgresql":
        with db.transaction() as conn:
            return insert_task(conn, new)
    task, session_row, execution_row = _new_task_rows(new)
    params = _one_statement_params(task, session_row, execution_row)
    return task if driver.rows(db.engine, _returning_trigger(), params) else None


def _new_task_rows(new: NewTask) -> tuple[TaskRecord, dict[str, Any], dict[str, Any]]:
    """The task row of `new`, queued at generation 1, with its session and execution rows."""
    now = utcnow()
    task = TaskRecord(
        task_id=new_id(),
        task_type=new.task_type,
        title=new.title,
        context=new.context,
        sample_input=new.sample_input,
        trigger_id=new.trigger_id,
        origin="peripheral_sample" if new.sample_input is not None else "live",
        status="queued",
        generation=1,
        session_id=new_id(),
        failure_code=None,
        last_error=None,
        recoveries=0,
        handbacks=0,
        rounds=0,
        intent_round=1,
        queued_at=now,
        created_at=now,
        updated_at=now,
    )
    assert task.session_id is not None
    session_row, execution_row = generation_rows(task.task_id, 1, task.title, task.session_id, now)
    return task, session_row, execution_row


def _insert_task_in_one_statement(
    conn: Connection,
    task: TaskRecord,
    session_row: dict[str, Any],
    execution_row: dict[str, Any],
) -> bool:
    """Postgres: the task, its session and execution in one statement (one round trip).

    Sent as the driver's SQL (compiled once per dialect) with its parameters as the driver
    takes them: the trigger is on the caller's latency path, and SQLAlchemy's execution of the
    compiled statement (cache lookup, bind processing of 30 parameters, the RETURNING row) cost
    it 0.12 ms more, measured in process with the two ways alternating."""
    params = _one_statement_params(task, session_row, execution_row)
    # No RETURNING: an execution row is inserted only for a new task (result rows would cost
    # more than the statement: their metadata is built from the cursor on every call).
    return conn.exec_driver_sql(_trigger_sql(conn.dialect), params).rowcount == 1


def _one_statement_params(
    task: TaskRecord, session_row: dict[str, Any], execution_row: dict[str, Any]
) -> dict[str, Any]:
    """The trigger statement's parameters, as the driver takes them."""
    # Field by field, not `asdict`: that deep-copies the context and every timestamp.
    params = {f"task_{name}": getattr(task, name) for name in TaskRecord.__dataclass_fields__}
    params.update({f"session_{k}": v for k, v in session_row.items()})
    params.update({f"execution_{k}": v for k, v in execution_row.items()})
    for name in _JSON_PARAMS:  # what the JSONB columns' bind processing would send
        if params[name] is not None:
            params[name] = json.dumps(params[name])
    return params


#: The trigger statement's JSONB parameters (the others go to the driver as they are: text,
#: integers, and aware UTC datetimes, which is what `UTCDateTime` would bind).
_JSON_PARAMS = ("task_context", "task_sample_input")


@lru_cache(maxsize=8)
def _trigger_sql(dialect: Dialect) -> str:
    return str(_one_statement_trigger().compile(dialect=dialect))


@cache
def _returning_trigger() -> Insert:
    """The trigger statement with the new execution row's task id: a row only for a new task
    (a raw cursor's one tuple costs nothing like SQLAlchemy's result)."""
    return _one_statement_trigger().returning(executions.c.task_id)


@cache
def _one_statement_trigger() -> Insert:
    """Built once: bound parameters `task_*`, `session_*` and `execution_*`.

    The session and execution rows are selected from the task insert's RETURNING, so they exist
    only when the task row was inserted (not on a duplicate trigger id).
    """

    def placeholders(table: Table, prefix: str, names: list[str]) -> list[Any]:
        return [bindparam(f"{prefix}_{name}", type_=table.c[name].type) for name in names]

    task_names = list(TaskRecord.__dataclass_fields__)
    new_task = (
        postgresql.insert(tasks)
        .values(dict(zip(task_names, placeholders(tasks, "task", task_names), strict=True)))
        .on_conflict_do_nothing(index_elements=["trigger_id"])
        .returning(tasks.c.task_id)
        .cte("new_task")
    )

    def one_row_per_new_task(table: Table, prefix: str) -> Insert:
        names = GENERATION_COLUMNS[prefix]
        values = select(*placeholders(table, prefix, names)).select_from(new_task)
        return insert(table).from_select(names, values)

    new_session = (
        one_row_per_new_task(sessions, "session")
        .returning(sessions.c.session_id)
        .cte("new_session")
    )
    return one_row_per_new_task(executions, "execution").add_cte(new_session)


def stale_queued(conn: Connection, before: datetime, limit: int) -> list[TaskRecord]:
    """Queued tasks whose wake-up was not sent (`record_unsent`: due at once), first, then
    those whose wake-up message may be gone (queued before `before`). One statement, as
    before the unsent ones: every sweep sends it, and sweeps are benchmarked."""
    rows = conn.execute(
        select(tasks)
        .where(
            tasks.c.status == "queued",
            or_(tasks.c.queued_at.is_(None), tasks.c.queued_at < before),
        )
        .order_by(tasks.c.queued_at.nulls_first())
        .limit(limit)
    )
    return [TaskRecord.from_row(row) for row in rows]


def record_unsent(conn: Connection, wakeups: list[tuple[str, int]]) -> int:
    """Say that these generations' wake-ups were not sent (`queued_at` NULL), for those still
    queued at that generation: one claimed meanwhile (a wake-up did arrive) needs none."""
    marked = 0
    for task_id, generation in wakeups:  # only on a broker's failure: rare, and few at once
        marked += conn.execute(
            update(tasks)
            .where(
                tasks.c.task_id == task_id,
                tasks.c.generation == generation,
                tasks.c.status == "queued",
            )
            .values(queued_at=None)
        ).rowcount
    return marked


def touch_queued(conn: Connection, task: TaskRecord) -> bool:
    """Claim one republish of a stale or unsent queued task (compare-and-set on `queued_at`,
    NULL for an unsent one): two sweepers never both send it."""
    return (
        conn.execute(
            update(tasks)
            .where(
                tasks.c.task_id == task.task_id,
                tasks.c.generation == task.generation,
                tasks.c.status == "queued",
                tasks.c.queued_at == task.queued_at,
            )
            .values(queued_at=utcnow())
        ).rowcount
        == 1
    )


def list_tasks(
    conn: Connection,
    *,
    where: TaskFilter,
    limit: int,
    after: tuple[datetime, str] | None = None,
) -> list[TaskRecord]:
    """Newest first, the rows `where` keeps; `after` is the (created_at, task_id) of the last
    row already seen, so a filtered list pages like an unfiltered one.

    A list never loads the contexts (they may be large): `context` and `sample_input` of the
    records are None here; `get_task` reads them.
    """
    light = [c for c in tasks.c if c.name not in ("context", "sample_input")]
    query: Select[Any] = select(*light, null().label("context"), null().label("sample_input"))
    if where.status is not None:
        query = query.where(tasks.c.status == where.status)
    if where.task_type is not None:
        query = query.where(tasks.c.task_type == where.task_type)
    if where.created_after is not None:
        query = query.where(tasks.c.created_at >= where.created_after)
    if where.created_before is not None:
        query = query.where(tasks.c.created_at < where.created_before)
    if after is not None:
        query = query.where(past(tasks.c.created_at, tasks.c.task_id, after))
    query = query.order_by(tasks.c.created_at.desc(), tasks.c.task_id.desc()).limit(limit)
    return [TaskRecord.from_row(row) for row in conn.execute(query)]
