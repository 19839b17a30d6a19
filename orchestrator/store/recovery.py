"""Receipts left `running` by an executor that is gone become `unknown`, with a fresh token.

In a fleet a worker's start must not touch the receipts of generations other workers are still
running, so "cold start" means: every `running` receipt except those of live generations. When
the sweeper declares one generation lost, that task's `running` receipts go the same way, in the
transaction that marks it lost. Nothing is ever replayed; an unknown write is verified first.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import Connection, and_, literal, select, update

from orchestrator.domain.outcomes import summary_for
from orchestrator.store.tables import executions, invocation_receipts
from orchestrator.store.types import utcnow

__all__ = ["lagging_generations", "orphan_running_receipts"]


def lagging_generations(conn: Connection, now: datetime) -> list[tuple[str, str | None]]:
    """Open, started generations whose mirrored lease expiry passed: (task, lease token).

    Live still if the lease back end holds the lease with that token (the mirror lags).
    """
    rows = conn.execute(
        select(executions.c.task_id, executions.c.lease_token).where(
            executions.c.outcome.is_(None),
            executions.c.started_at.is_not(None),
            executions.c.lease_expires_at <= now,
        )
    )
    return [(row.task_id, row.lease_token) for row in rows]


def orphan_running_receipts(
    conn: Connection,
    *,
    owner: str | None = None,
    keep: Sequence[str] = (),
    now: datetime | None = None,
) -> int:
    """Mark `running` receipts unknown: of `owner` only, or of every owner without a live run
    (a run whose mirror lags, as of `now`, is live when its owner is in `keep`)."""
    now = now or utcnow()
    condition = invocation_receipts.c.status == "running"
    if owner is not None:
        condition = and_(condition, invocation_receipts.c.owner == owner)
    else:
        if keep:
            condition = and_(condition, invocation_receipts.c.owner.not_in(list(keep)))
        live_owners = select(literal("task:") + executions.c.task_id).where(
            executions.c.outcome.is_(None),
            executions.c.started_at.is_not(None),
            executions.c.lease_expires_at > now,
        )
        condition = and_(condition, invocation_receipts.c.owner.not_in(live_owners))
    result = conn.execute(
        update(invocation_receipts)
        .where(condition)
        .values(
            status="unknown",
            summary=summary_for("recovered"),
            claim_token=f"cold-{secrets.token_hex(16)}",
            updated_at=now,
        )
    )
    return int(result.rowcount)
