"""What a task's view is built from, read in one statement: the version behind its ETag.

The console reads a task's view every 3 s per open tab, and the view takes about eighteen
statements (generations, plan, report, approvals, receipts, usage, recovery, deliveries,
events, the last write). Nearly always nothing changed. Each table the view reads is summed up
here by what any write to it changes (a count, the newest stamp, a status tally), so that one
statement tells whether the view a client holds is still the view; only when it is not is the
view built again.

A write the view shows must change one of these values; a new source in the view needs its
term here too (`tests/integration/test_task_etags.py` walks the writes a task goes through).
Evidence is summed up by its count and newest key (its records never change).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, Row, bindparam, case, exists, func, select, true

from orchestrator.store.tables import (
    actions,
    evidence,
    executions,
    invocation_receipts,
    outbox,
    plan_revisions,
    recovery_snapshots,
    reports,
    sessions,
    task_events,
    tasks,
    transcript_entries,
)

__all__ = ["view_version"]

_TASK: Any = bindparam("task_id")


def _tally(column: Any, value: str) -> Any:
    return func.sum(case((column == value, 1), else_=0))


def _summary(table: Any, *terms: Any, where: Any = None) -> Any:
    """One row of aggregates over the task's rows of `table`."""
    condition = table.c.task_id == _TASK if where is None else where
    return select(func.count(), *terms).where(condition).subquery()


_SESSIONS = select(sessions.c.session_id).where(sessions.c.task_id == _TASK)
_RECEIPTS = invocation_receipts.c

_PARTS = [
    _summary(
        executions,
        func.count(executions.c.outcome),
        func.count(executions.c.worker),
        func.max(executions.c.created_at),
        func.max(executions.c.started_at),
        func.max(executions.c.ended_at),
        func.max(executions.c.handed_back_at),
        func.max(executions.c.lease_expires_at),
    ),
    # Revisions of every session of the task: the recovery shows the plan as it stands now.
    _summary(
        plan_revisions,
        func.max(plan_revisions.c.revision),
        func.max(plan_revisions.c.updated_at),
        where=plan_revisions.c.session_id.in_(_SESSIONS),
    ),
    _summary(reports, func.max(reports.c.created_at)),
    _summary(evidence, func.max(evidence.c.created_at), func.max(evidence.c.evidence_id)),
    _summary(
        actions,
        func.max(actions.c.created_at),
        func.max(actions.c.decided_at),
        _tally(actions.c.status, "pending_approval"),
        _tally(actions.c.status, "superseded"),
    ),
    _summary(
        transcript_entries,
        func.max(transcript_entries.c.created_at),
        func.sum(transcript_entries.c.prompt_tokens),
    ),
    _summary(
        recovery_snapshots,
        func.max(recovery_snapshots.c.updated_at),
        where=recovery_snapshots.c.session_id.in_(_SESSIONS),
    ),
    _summary(
        outbox,
        func.sum(outbox.c.attempts),
        func.sum(outbox.c.throttled),
        func.max(outbox.c.next_attempt_at),
        func.max(outbox.c.delivered_at),
        func.max(outbox.c.discarded_at),
        *(_tally(outbox.c.status, status) for status in ("pending", "dead", "discarded")),
    ),
    _summary(task_events, func.max(task_events.c.seq)),
    _summary(
        invocation_receipts,
        func.max(_RECEIPTS.updated_at),
        _tally(_RECEIPTS.status, "unknown"),
        _tally(_RECEIPTS.status, "running"),
        where=_RECEIPTS.owner == bindparam("owner"),
    ),
]

#: The view's `never_sent` says whether any task's delivery of a kind ever went out.
_EVER_SENT = [
    exists()
    .where(outbox.c.status.in_(("delivered", "dead")), outbox.c.kind == kind)
    .label(f"{kind}_ever_sent")
    for kind in ("action", "webhook")
]

_LIGHT = [c for c in tasks.c if c.name not in ("context", "sample_input")]

# Built once: sent for every poll of every open task page. Each part is one row: joined on
# true, the task's row comes back with every summary beside it.
_VERSION = select(*_LIGHT, *(column for part in _PARTS for column in part.c), *_EVER_SENT)
_FROM: Any = tasks
for _part in _PARTS:
    _FROM = _FROM.join(_part, true())
_VERSION = _VERSION.select_from(_FROM).where(tasks.c.task_id == _TASK)


def view_version(conn: Connection, task_id: str) -> Row[Any] | None:
    """The values the task's view is built from, summed up (the task's own columns by name);
    None when there is no such task. Equal values: the same view, but for a running task's
    lease, which lives in the lease back end (the caller adds it)."""
    params = {"task_id": task_id, "owner": f"task:{task_id}"}
    return conn.execute(_VERSION, params).one_or_none()
