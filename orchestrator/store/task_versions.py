"""What a task's view is built from, read in one statement: the version behind its ETag.

The console reads a task's view every 3 s per open tab, and the view takes about eighteen
statements (generations, plan, report, approvals, receipts, usage, recovery, deliveries,
events, the last write). Nearly always nothing changed. Each table the view reads is summed up
here by what any write to it changes (a count, the newest stamp, a status tally), so that one
statement tells whether the view a client holds is still the view; only when it is not is the
view built again.

A write the view shows must change one of these values; a new source in the view needs its
term here too (`tests/integration/test_task_etags.py` walks the writes a task goes through).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    Connection,
    Row,
    and_,
    bindparam,
    case,
    exists,
    func,
    literal_column,
    select,
    true,
)

from orchestrator.domain.vocabulary import OUTBOX_KINDS
from orchestrator.store.tables import (
    OUTBOX_SETTLED,
    PENDING_ACTION,
    actions,
    evidence,
    executions,
    invocation_receipts,
    outbox,
    plan_revisions,
    recovery_snapshots,
    reports,
    sessions,
    settled,
    task_events,
    tasks,
    transcript_entries,
    unresolved_receipt,
    unsettled,
)

__all__ = ["view_version"]

_TASK: Any = bindparam("task_id")


def _tally(condition: Any) -> Any:
    """How many of the rows summed up meet `condition`."""
    return func.sum(case((condition, 1), else_=0))


def _summary(table: Any, *terms: Any, where: Any = None, counted: bool = True) -> Any:
    """One row of aggregates over the task's rows of `table` (their count unless not
    `counted`: a table only ever appended to is summed up by its newest key, one index entry)."""
    condition = table.c.task_id == _TASK if where is None else where
    return select(*([func.count()] if counted else []), *terms).where(condition).subquery()


_SESSIONS = select(sessions.c.session_id).where(sessions.c.task_id == _TASK)
_RECEIPTS = invocation_receipts.c


# A task's deliveries, in two parts. Delivered and discarded rows (`unsettled` is the rest)
# are shown only as counts per kind and status, and a settled row never changes but for its
# status (a row discarded while its send was under way, then delivered) and its deletion
# (retention): their counts are their whole term, read from the partial index that holds them
# (`ix_outbox_settled`: index-only, no row read). Each count is its own range of the index
# (literals: the planner proves the index's predicate from them), with no expression to
# evaluate per entry: a third of the time of one scan summing a CASE per kind and status, at
# 10,000 entries. The rows still to send or dead, a few per task however busy it is, are shown
# one by one: summed up from theirs. Before, every poll read each row of the task: a busy task
# keeps thousands of delivered webhooks ORCH_RETENTION_DAYS.
_OUTBOX = [
    *(
        _summary(
            outbox,
            where=and_(
                outbox.c.task_id == _TASK,
                # The index's predicate as it is written: SQLite uses a partial index only for
                # a query that repeats it (Postgres proves it from the status alone).
                settled(outbox),
                outbox.c.kind == literal_column(f"'{kind}'"),
                outbox.c.status == literal_column(f"'{status}'"),
            ),
        )
        for kind in OUTBOX_KINDS
        for status in OUTBOX_SETTLED
    ),
    _summary(
        outbox,
        # A row written (or settled) and another written between two polls: the newest id.
        func.max(outbox.c.outbox_id),
        func.sum(outbox.c.attempts),
        func.sum(outbox.c.throttled),
        func.max(outbox.c.next_attempt_at),
        # An operator's retry of a pending row (due now: the newest next attempt may be another
        # row's), and a claim's answer (a failure backs off below another row's next attempt):
        # the console drew Retry, or "being sent now", beside a view that had moved on.
        func.max(outbox.c.retried_at),
        func.max(outbox.c.claimed_until),
        func.count(outbox.c.claimed_until),
        func.max(outbox.c.sending_since),
        func.max(outbox.c.released_at),
        *(
            _tally(and_(outbox.c.kind == kind, outbox.c.status == status))
            for kind in OUTBOX_KINDS
            for status in ("pending", "dead")
        ),
        where=and_(outbox.c.task_id == _TASK, unsettled(outbox)),
    ),
]

# No statement changes an action that is not pending: a new one is the task's newest (the last
# entry of its index on (task_id, created_at, action_id)), and every other change is a pending
# one decided or superseded (their count, from the partial index of pending ones). Before,
# each poll read every action of the task.
_ACTIONS = [
    _summary(actions, func.max(actions.c.created_at), counted=False),
    _summary(actions, where=and_(actions.c.task_id == _TASK, PENDING_ACTION)),
]

# What each term stands for: a row added (a count, a newest stamp or key), a row changed (the
# stamps and tallies its change sets). Appended-only tables are summed up from their indexes;
# the few rows a task has of the others are read.
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
    # Revisions (never changed) of every session of the task: the recovery shows the plan as
    # it stands now, whichever session a person's step went to.
    _summary(
        plan_revisions,
        func.max(plan_revisions.c.revision),
        where=plan_revisions.c.session_id.in_(_SESSIONS),
    ),
    _summary(reports, func.max(reports.c.created_at)),
    # Records never change, and go only with their task: the newest is enough (`last_write`).
    _summary(evidence, func.max(evidence.c.created_at), counted=False),
    *_ACTIONS,
    # Appended, and deleted by retention: counted (from the index) for the token usage.
    _summary(transcript_entries),
    _summary(
        recovery_snapshots,
        func.max(recovery_snapshots.c.updated_at),
        where=recovery_snapshots.c.session_id.in_(_SESSIONS),
    ),
    *_OUTBOX,
    # Appended in order under the task's lock: the newest seq is every event.
    _summary(task_events, func.max(task_events.c.seq), counted=False),
    # Only the running and unknown ones are shown (from the partial index that holds them).
    _summary(
        invocation_receipts,
        func.max(_RECEIPTS.updated_at),
        _tally(_RECEIPTS.status == "unknown"),
        where=and_(_RECEIPTS.owner == bindparam("owner"), unresolved_receipt),
    ),
]

#: The view's `never_sent`: whether any task's delivery of a kind ever went out, asked (as the
#: view asks it) only of a kind the task has pending: a store of many deliveries of one kind
#: and none of the other is not read at every poll.
_EVER_SENT = [
    case(
        (
            # From the index of the task's unsettled rows: the kind's index entries of a busy
            # task are mostly delivered ones.
            exists().where(
                outbox.c.task_id == _TASK,
                unsettled(outbox),
                outbox.c.kind == kind,
                outbox.c.status == "pending",
            ),
            exists().where(
                outbox.c.status.in_(("delivered", "dead", "discarded")), outbox.c.kind == kind
            ),
        ),
        else_=None,
    ).label(f"{kind}_ever_sent")
    for kind in ("action", "webhook")
]

_LIGHT = [c for c in tasks.c if c.name not in ("context", "sample_input")]


def _statement(parts: list[Any], ever_sent: list[Any]) -> Any:
    """The task's row with each part's row beside it (joined on true: each part is one row)."""
    joined: Any = tasks
    for part in parts:
        joined = joined.join(part, true())
    columns = (column for part in parts for column in part.c)
    return select(*_LIGHT, *columns, *ever_sent).select_from(joined).where(tasks.c.task_id == _TASK)


# Built once: sent for every poll of every open task page.
_VERSION = _statement(_PARTS, _EVER_SENT)


def view_version(conn: Connection, task_id: str) -> Row[Any] | None:
    """The values the task's view is built from, summed up (the task's own columns by name);
    None when there is no such task. Equal values: the same view, but for a running task's
    lease, which lives in the lease back end (the caller adds it)."""
    params = {"task_id": task_id, "owner": f"task:{task_id}"}
    return conn.execute(_VERSION, params).one_or_none()
