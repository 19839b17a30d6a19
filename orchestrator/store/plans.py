"""Plan revisions: one row per accepted publish, in their own table (never in message history)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import Connection, Row, Select, and_, bindparam, exists, func, insert, or_, select

from orchestrator.domain.decisions import open_human_nodes
from orchestrator.domain.fences import Fence
from orchestrator.domain.plans import readable_edges, readable_nodes, status_counts
from orchestrator.domain.retries import Retries, readable_retries, retries_of
from orchestrator.domain.times import wire_time
from orchestrator.domain.vocabulary import TERMINAL_TASK_STATUSES
from orchestrator.store import driver
from orchestrator.store.records import driver_row
from orchestrator.store.sessions import SessionRecord
from orchestrator.store.tables import plan_revisions, reports, sessions, tasks
from orchestrator.store.types import stored_list

__all__ = [
    "LockedForPublish",
    "PlanRecord",
    "PublishContext",
    "SessionStanding",
    "get_by_request_id",
    "get_revision",
    "insert_revision",
    "latest_revision",
    "latest_revision_number",
    "list_summaries",
    "lock_for_fenced_publish",
    "publish_context",
    "revisions_after",
    "session_standing",
]

_SUMMARY = (
    plan_revisions.c.revision,
    plan_revisions.c.updated_at,
    plan_revisions.c.title,
    plan_revisions.c.reason,
    plan_revisions.c.nodes,
)


@dataclass(frozen=True)
class PlanRecord:
    """One stored revision of a session's execution plan."""

    session_id: str
    revision: int
    request_id: str
    schema_version: str
    title: str
    reason: str
    nodes: list[dict[str, Any]]
    edges: list[dict[str, Any]]
    content_digest: str
    task_id: str | None
    generation: int | None
    updated_at: datetime
    #: Which node retries which failed node (`domain.retries`); None on a revision stored
    #: before it was kept (`to_dict` then shows what its edges say, as the rules read it).
    retries: Retries | None = None

    @classmethod
    def from_row(cls, row: Row[Any]) -> PlanRecord:
        return cls(
            session_id=row.session_id,
            revision=row.revision,
            request_id=row.request_id,
            schema_version=row.schema_version,
            title=row.title,
            reason=row.reason,
            nodes=stored_list(row.nodes),
            edges=stored_list(row.edges),
            content_digest=row.content_digest,
            task_id=row.task_id,
            generation=row.generation,
            updated_at=row.updated_at,
            retries=readable_retries(row.retries),
        )

    def to_dict(self) -> dict[str, Any]:
        """The revision as the API, the stream and the agent tool show it."""
        return {
            "schema_version": self.schema_version,
            "session_id": self.session_id,
            "revision": self.revision,
            "request_id": self.request_id,
            "title": self.title,
            "reason": self.reason,
            "nodes": self.nodes,
            "edges": self.edges,
            "status_counts": status_counts(self.nodes),
            "task_id": self.task_id,
            "generation": self.generation,
            "updated_at": wire_time(self.updated_at),
            # The host's own word on which failed node each new node retries: the console
            # and the agent show what the completion rule goes by, not a guess from the edges.
            "retries": {
                failed: list(retries)
                for failed, retries in retries_of(
                    readable_nodes(self.nodes), readable_edges(self.edges), self.retries
                ).items()
            },
        }


@dataclass(frozen=True)
class PublishContext:
    """What a publish needs from the store, read in one query."""

    latest_revision: int  # 0 when the session has no plan yet
    latest_nodes: list[dict[str, Any]] | None
    same_request: tuple[int, str] | None  # (revision, content_digest) stored under request_id
    #: The latest revision's edges: a new edge into a closed node is refused (retry_not_new).
    latest_edges: list[dict[str, Any]] | None = None
    #: The latest revision's relation of retries, carried into the next (`domain.retries`).
    latest_retries: Retries | None = None


def _wanted_revisions(by_request_id: bool) -> Any:
    """The session's latest revision and, when asked, the one stored under `request_id`."""
    t = plan_revisions
    latest = (
        select(func.max(t.c.revision))
        .where(t.c.session_id == bindparam("session_id"))
        .scalar_subquery()
    )
    wanted = t.c.revision == latest
    if by_request_id:
        wanted = or_(wanted, t.c.request_id == bindparam("request_id"))
    return and_(t.c.session_id == bindparam("session_id"), wanted)


_CONTEXT_COLUMNS = (
    plan_revisions.c.revision,
    plan_revisions.c.request_id,
    plan_revisions.c.content_digest,
    plan_revisions.c.nodes,
    plan_revisions.c.edges,
    plan_revisions.c.retries,
)


def _fenced_publish_query(by_request_id: bool) -> Select[Any]:
    report_saved = (
        exists()
        .where(
            reports.c.task_id == bindparam("task_id"),
            reports.c.generation == bindparam("generation"),
        )
        .label("report_saved")
    )
    return (
        select(sessions, report_saved, *_CONTEXT_COLUMNS)
        .select_from(sessions.outerjoin(plan_revisions, _wanted_revisions(by_request_id)))
        .where(sessions.c.session_id == bindparam("session_id"))
        .with_for_update(of=sessions)
    )


# Built once each: a publish reads one of them under the session's row lock.
_PUBLISH_CONTEXT = {
    flag: select(*_CONTEXT_COLUMNS).where(_wanted_revisions(flag)) for flag in (False, True)
}
_FENCED_PUBLISH = {flag: _fenced_publish_query(flag) for flag in (False, True)}
#: Its columns by name, as a driver row reads them (the names are distinct).
_FENCED_PUBLISH_COLUMNS = (
    *(column.name for column in sessions.c),
    "report_saved",
    *(column.name for column in _CONTEXT_COLUMNS),
)
_INSERT_REVISION = insert(plan_revisions).values(
    {column.name: bindparam(column.name) for column in plan_revisions.c}
)


def publish_context(conn: Connection, session_id: str, request_id: str | None) -> PublishContext:
    """The latest revision's nodes and any revision stored under `request_id`, in one round trip."""
    rows = conn.execute(
        _PUBLISH_CONTEXT[request_id is not None],
        {"session_id": session_id, "request_id": request_id},
    ).all()
    return _context(rows, request_id)


class LockedForPublish(NamedTuple):
    session: SessionRecord
    report_saved: bool  # by the fence's generation
    context: PublishContext


def lock_for_fenced_publish(
    conn: Connection, session_id: str, fence: Fence, request_id: str | None
) -> LockedForPublish | None:
    """The locked session, whether `fence`'s generation saved its report, and the publish
    context, in one statement; None when there is no such session.

    Only after `check_fence`, in a later statement. The fence holds the task row's lock, and
    what this statement reads of an execution's session (its revisions, the generation's
    report) is only written under that lock, so nothing it reads can commit while it waits for
    the session's lock: its snapshot is current. Another kind of session may be locked by an
    unfenced publish meanwhile, but a fenced publish refuses such a session before it uses
    what it read.
    """
    params = {
        "session_id": session_id,
        "request_id": request_id,
        "task_id": fence.task_id,
        "generation": fence.generation,
    }
    found = driver.fetch(conn, _FENCED_PUBLISH[request_id is not None], params)
    if not found:
        return None
    rows = [driver_row(_FENCED_PUBLISH_COLUMNS, row) for row in found]
    revisions = [row for row in rows if row.revision is not None]  # not the outer join's miss
    return LockedForPublish(
        SessionRecord.from_row(rows[0]), bool(rows[0].report_saved), _context(revisions, request_id)
    )


def _context(rows: Sequence[Any], request_id: str | None) -> PublishContext:
    top = max(rows, key=lambda row: row.revision, default=None)
    same = next((row for row in rows if row.request_id == request_id), None)
    return PublishContext(
        latest_revision=top.revision if top is not None else 0,
        latest_nodes=list(top.nodes) if top is not None else None,
        same_request=(same.revision, same.content_digest) if same is not None else None,
        latest_edges=list(top.edges) if top is not None else None,
        latest_retries=readable_retries(top.retries) if top is not None else None,
    )


def insert_revision(conn: Connection, record: PlanRecord) -> None:
    postgres = conn.dialect.name == "postgresql"
    driver.fetch(
        conn,
        _INSERT_REVISION,
        {
            "session_id": record.session_id,
            "revision": record.revision,
            "request_id": record.request_id,
            "schema_version": record.schema_version,
            "title": record.title,
            "reason": record.reason,
            # Postgres: store.driver sends them, as JSON text (SQLAlchemy serialises elsewhere).
            "nodes": json.dumps(record.nodes) if postgres else record.nodes,
            "edges": json.dumps(record.edges) if postgres else record.edges,
            # None (SQL NULL) only from a caller that kept no relation: read as an older row.
            "retries": json.dumps(record.retries)
            if postgres and record.retries is not None
            else record.retries,
            "content_digest": record.content_digest,
            "task_id": record.task_id,
            "generation": record.generation,
            "updated_at": record.updated_at,
        },
    )


def latest_revision(conn: Connection, session_id: str) -> PlanRecord | None:
    row = conn.execute(
        select(plan_revisions)
        .where(plan_revisions.c.session_id == session_id)
        .order_by(plan_revisions.c.revision.desc())
        .limit(1)
    ).one_or_none()
    return PlanRecord.from_row(row) if row is not None else None


def latest_revision_number(conn: Connection, session_id: str) -> int:
    """The highest revision of the session, 0 when it has none (cheap: the primary key)."""
    value = conn.execute(
        select(func.max(plan_revisions.c.revision)).where(plan_revisions.c.session_id == session_id)
    ).scalar_one_or_none()
    return int(value or 0)


def get_revision(conn: Connection, session_id: str, revision: int) -> PlanRecord | None:
    row = conn.execute(
        select(plan_revisions).where(
            plan_revisions.c.session_id == session_id, plan_revisions.c.revision == revision
        )
    ).one_or_none()
    return PlanRecord.from_row(row) if row is not None else None


def get_by_request_id(conn: Connection, session_id: str, request_id: str) -> PlanRecord | None:
    row = conn.execute(
        select(plan_revisions).where(
            plan_revisions.c.session_id == session_id, plan_revisions.c.request_id == request_id
        )
    ).one_or_none()
    return PlanRecord.from_row(row) if row is not None else None


def revisions_after(
    conn: Connection, session_id: str, after: int, limit: int = 100
) -> list[PlanRecord]:
    """Revisions above `after`, oldest first: what a stream has not sent yet."""
    rows = conn.execute(
        select(plan_revisions)
        .where(plan_revisions.c.session_id == session_id, plan_revisions.c.revision > after)
        .order_by(plan_revisions.c.revision)
        .limit(limit)
    )
    return [PlanRecord.from_row(row) for row in rows]


def list_summaries(conn: Connection, session_id: str) -> list[dict[str, Any]]:
    """Every revision of the session, oldest first, without nodes and edges (only their counts)."""
    rows = conn.execute(
        select(*_SUMMARY)
        .where(plan_revisions.c.session_id == session_id)
        .order_by(plan_revisions.c.revision)
    )
    return [
        {
            "revision": row.revision,
            "updated_at": wire_time(row.updated_at),
            "title": row.title,
            "reason": row.reason,
            "status_counts": status_counts(stored_list(row.nodes)),
        }
        for row in rows
    ]


class SessionStanding(NamedTuple):
    """What a plan stream needs to know of its session's writers."""

    running: bool  # the session is its task's current one, and the task runs
    finished: bool  # nothing more can be written to its plan, ever


# Built once: a stream reads it when it opens and once per keep-alive.
_STANDING = (
    select(
        sessions.c.purpose,
        sessions.c.generation,
        sessions.c.task_id,
        tasks.c.status.label("task_status"),
        tasks.c.generation.label("task_generation"),
        tasks.c.session_id.label("task_session_id"),
    )
    .select_from(sessions.outerjoin(tasks, tasks.c.task_id == sessions.c.task_id))
    .where(sessions.c.session_id == bindparam("session_id"))
)


def session_standing(conn: Connection, session_id: str) -> SessionStanding | None:
    """The session's standing; None when there is no such session.

    Only an execution's session ever finishes. Its writes are fenced by its task's row, which
    they lock: an agent's publish or proposal carries its generation (and the session must be
    that generation's), a person's step goes to the session of the task's latest plan (the
    current one's, or an earlier generation's until the current one publishes), and neither is
    taken once the task is final. A generation is never current again once a newer one was
    opened (a requeue, even of a finished task, opens a new session), and an earlier session
    stops holding the latest plan once a newer generation publishes; so once this reads the
    session as finished, every write it will ever hold has committed (but for a requeue of a
    final task, whose last plan takes steps again until the new generation publishes: the
    plan stream's client learns of it from the task, docs/business-backend.md "A requeue of a
    finished task").
    Chats and collaborations take unfenced publishes at any time: they never finish (a
    deleted one is gone, which is None).
    """
    row = conn.execute(_STANDING, {"session_id": session_id}).one_or_none()
    if row is None:
        return None
    current = row.task_session_id == session_id or (
        row.generation is not None and row.generation == row.task_generation
    )
    live = row.task_status is not None and row.task_status not in TERMINAL_TASK_STATUSES
    if live and not current and row.purpose == "task_execution":
        # An earlier generation's session still takes a person's step while its plan is the
        # task's latest and has a human node open (`services.human_steps`): its stream must
        # not end, nor answer 204 to a client that will then miss the step.
        # Imported here: `task_plans` reads this module's `PlanRecord`.
        from orchestrator.store.task_plans import task_latest_plan

        latest = task_latest_plan(conn, row.task_id)
        current = (
            latest is not None
            and latest.session_id == session_id
            and bool(open_human_nodes(readable_nodes(latest.nodes)))
        )
    return SessionStanding(
        running=row.task_status == "running" and row.task_session_id == session_id,
        finished=row.purpose == "task_execution" and not (current and live),
    )
