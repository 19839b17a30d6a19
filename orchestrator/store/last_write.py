"""The time and kind of a generation's last fenced write, for the explain view.

Derived from the rows the fenced writes leave (plan revisions, reports, evidence, actions), each
stamped with its generation, so no write path has to keep a separate column up to date. One
indexed MAX per table (each has an index on (task_id, generation)). A person's step is a plan
revision of the generation too, but not the agent's write: it is left out, or a stuck agent
whose steps people close would look like one at work (the view's purpose).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection, func, select

from orchestrator.domain.human_steps import PERSON_REQUEST_PREFIX
from orchestrator.store.tables import actions, evidence, plan_revisions, reports

__all__ = ["last_fenced_write"]

_SOURCES = (
    ("plan", plan_revisions, plan_revisions.c.updated_at),
    ("report", reports, reports.c.created_at),
    ("evidence", evidence, evidence.c.created_at),
    ("action", actions, actions.c.created_at),
)


def last_fenced_write(
    conn: Connection, task_id: str, generation: int
) -> tuple[datetime, str] | None:
    """(time, kind) of the newest write of `generation`, or None before its first."""
    newest: tuple[datetime, str] | None = None
    for kind, table, stamp in _SOURCES:
        query = select(func.max(stamp)).where(
            table.c.task_id == task_id, table.c.generation == generation
        )
        if table is plan_revisions:
            query = query.where(~plan_revisions.c.request_id.startswith(PERSON_REQUEST_PREFIX))
        at = conn.execute(query).scalar_one_or_none()
        if at is not None and (newest is None or at > newest[0]):
            newest = (at, kind)
    return newest
