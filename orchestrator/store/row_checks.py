"""A condition checked on the row a key found, kept out of the planner's choice of index.

A statement that finds one task by its key and checks its status (`status = 'queued'` at a
claim, `status = 'running'` in a fence) reads one row through the primary key. But when the
table's statistics were taken while no task had that status (queued and running tasks come and
go, and a large table is analysed again only once a tenth of it changed), the planner reckons a
status index finds about one row as well, and may take it: it then reads every task of that
status (the whole queue, every running task of the fleet) to find the one. Written
`(condition) IS TRUE`, the check is the same on a NOT NULL column, but no index serves it, so
the key's does.
"""

from __future__ import annotations

from sqlalchemy import ColumnElement, true

__all__ = ["STATUS_RUNNING_ON_T", "on_the_row"]

#: `on_the_row(status == 'running')` for SQL written as text, its task table aliased `t`.
STATUS_RUNNING_ON_T = "(t.status = 'running') IS TRUE"


def on_the_row(condition: ColumnElement[bool]) -> ColumnElement[bool]:
    """`condition`, checked on the row the statement's key found rather than used to find it."""
    return condition.is_(true())
