"""Recovery snapshots: saved when a round ends abnormally, read first by the next generation.

`save_round_snapshot` runs when a round ends by an exception, a cancel or a lost lease. The
generation is no longer live then, so the write is not fenced; it only touches the snapshot of
the round's own session. `snapshot_for` gives the next generation the previous one's snapshot,
or builds it from the durable transcript when the worker died before it could save one.

The plan a snapshot shows (`last_plan`) is read when it is shown, not when it was saved: a
person may close a human step of that plan after the round ended (until the next generation
publishes, the step goes into it: `services.human_steps`), and the agent must never be shown
the plan as it was before the step as if it were the plan its first publish keeps.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection

from orchestrator.domain.recovery import Snapshot
from orchestrator.store import plans as plan_store
from orchestrator.store import snapshots as snapshot_store
from orchestrator.store import task_plans
from orchestrator.store import transcripts as transcript_store
from orchestrator.store.db import Database
from orchestrator.store.records import ExecutionRecord

if TYPE_CHECKING:  # a worker's round passes its writer; the API and CLI read snapshots alone
    from orchestrator.agent.transcript import TranscriptWriter

__all__ = ["SNAPSHOT_WAIT_SECONDS", "save_round_snapshot", "snapshot_for"]

log = logging.getLogger(__name__)

#: How long a round on its way out waits for its last results to be written, and then for the
#: snapshot's own write (seed 000: 聊天快照保存采用有界等待). Past it the snapshot is given up
#: and logged; the next generation builds it from the durable transcript.
SNAPSHOT_WAIT_SECONDS = 5.0

#: Outcomes after which a generation may have left calls without a result.
_ABNORMAL = frozenset({None, "lost", "cancelled", "superseded", "failed"})


def save_round_snapshot(db: Database, writer: TranscriptWriter, reason: str) -> Snapshot | None:
    """Save what `writer`'s round did and what is unknown; never raises (it runs on the way out).

    A round that made no tool call leaves nothing to continue from, and no snapshot.
    """
    if not writer.calls:
        return None
    try:
        # Results still being written go in first, if the fence still takes them.
        writer.flush(timeout=SNAPSHOT_WAIT_SECONDS)
    except Exception as exc:
        log.info("the last results of the round were not written: %s", type(exc).__name__)
    try:
        with db.transaction() as conn:
            snapshot_store.bound_wait(conn, SNAPSHOT_WAIT_SECONDS)
            plan = plan_store.latest_revision(conn, writer.session_id)
            snapshot = writer.snapshot(reason, plan.to_dict() if plan else None)
            snapshot_store.save_snapshot(conn, writer.session_id, snapshot, replace=True)
        return snapshot
    except Exception as exc:
        log.warning(
            "could not save the recovery snapshot of generation %s of %s: %s",
            writer.fence.generation,
            writer.fence.task_id,
            type(exc).__name__,
        )
        return None


def snapshot_for(conn: Connection, before: ExecutionRecord) -> Snapshot | None:
    """The snapshot of the generation `before`, saved or built from its transcript, with the
    task's latest plan up to that generation as it stands now (the steps people closed in it
    since included: the same plan `read_task_context` gives as `previous_generation.plan`).

    None when it ended normally with every call answered.
    """
    saved = snapshot_store.get_snapshot(conn, before.session_id)
    if saved is not None:
        return replace(saved, last_plan=_plan_now(conn, before))
    if before.outcome not in _ABNORMAL:
        return None
    entries = transcript_store.entries_of(conn, session_id=before.session_id)
    if not entries:
        return None
    reason = before.reason or "the worker stopped before the round ended (no snapshot saved)"
    snapshot = Snapshot.from_transcript(
        [entry.to_dict() for entry in entries],
        reason=reason,
        generation=before.generation,
        last_plan=_plan_now(conn, before),
    )
    if not snapshot.unknown and before.outcome not in (None, "lost"):
        return None
    return snapshot


def _plan_now(conn: Connection, before: ExecutionRecord) -> dict[str, Any] | None:
    """The task's latest plan up to generation `before`: its own last revision, or an earlier
    generation's when it published none, with the steps people closed in it since."""
    plan = task_plans.task_latest_plan(conn, before.task_id, before.generation + 1)
    return plan.to_dict() if plan else None
