"""Recovery: requeue generations whose lease ran out, republish queued tasks whose wake-up is lost.

A sweep reads the store's index of running executions by mirrored lease expiry, so its cost grows
with the number of expired leases, not with the number of tasks. Every requeue is a
compare-and-set on the task's generation: two sweepers never requeue one expiry twice. A lost
generation's pending_approval actions are superseded in the transaction that requeues or parks it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import update

from orchestrator.leases import LeaseBackend, LeaseBackendUnavailable
from orchestrator.services.dispatch import Dispatcher, safe_dispatch
from orchestrator.services.lease_keeper import lease_name
from orchestrator.settings import Settings
from orchestrator.store import tasks as task_store
from orchestrator.store.db import Database
from orchestrator.store.records import ExecutionRecord
from orchestrator.store.recovery import orphan_running_receipts
from orchestrator.store.tables import tasks
from orchestrator.store.types import utcnow

__all__ = ["SweepReport", "Sweeper"]

log = logging.getLogger(__name__)


@dataclass
class SweepReport:
    """What one sweep did, for the CLI and the logs."""

    requeued: list[tuple[str, int, int]] = field(default_factory=list)  # task, lost gen, new gen
    parked: list[tuple[str, int]] = field(default_factory=list)
    republished: list[tuple[str, int]] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [
            f"requeued task {t}: generation {g} lost, generation {n} queued"
            for t, g, n in self.requeued
        ]
        out += [
            f"parked task {t} as failed (recovery_limit) after generation {g} was lost"
            for t, g in self.parked
        ]
        out += [f"republished the wake-up of task {t} generation {g}" for t, g in self.republished]
        return out


class Sweeper:
    def __init__(
        self,
        settings: Settings,
        db: Database,
        leases: LeaseBackend,
        dispatcher: Dispatcher,
        batch: int = 500,
    ) -> None:
        self.settings = settings
        self.db = db
        self.leases = leases
        self.dispatcher = dispatcher
        self.batch = batch

    def sweep(self, now: datetime | None = None) -> SweepReport:
        now = now or utcnow()
        report = SweepReport()
        with self.db.transaction(readonly=True) as conn:
            expired = task_store.expired_executions(conn, now, self.batch)
        for execution in expired:
            self._recover(execution, report)
        self._republish_stale(now, report)
        for line in report.lines():
            log.info("%s", line)
        return report

    def _recover(self, execution: ExecutionRecord, report: SweepReport) -> None:
        name = lease_name(execution.task_id)
        try:
            info = self.leases.get(name)
        except LeaseBackendUnavailable:
            log.warning("lease back end unavailable; %s left for the next sweep", name)
            return
        if info is not None and info.token == execution.lease_token:
            # Still held: only the store's mirror is behind (a renewal's mirror write failed).
            with self.db.transaction() as conn:
                task_store.mirror_lease(
                    conn, execution.task_id, execution.generation, info.token, info.expires_at
                )
            return
        with self.db.transaction() as conn:
            task = task_store.get_task(conn, execution.task_id, lock=True)
            closed = task_store.end_generation(
                conn,
                execution.task_id,
                execution.generation,
                outcome="lost",
                reason="the lease expired without renewal (worker lost)",
            )
            if not closed or task is None:
                return  # another sweeper, or the generation itself, got there first
            if task.generation != execution.generation or task.status != "running":
                return
            orphan_running_receipts(conn, owner=f"task:{task.task_id}")
            # Like an operator requeue or cancel: the lost generation's proposals are not
            # approvable any more; the next generation proposes again if it still needs them.
            task_store.supersede_pending_actions(
                conn, task.task_id, f"generation {task.generation} lost its lease"
            )
            recoveries = task.recoveries + 1
            if recoveries >= self.settings.max_recoveries:
                conn.execute(
                    update(tasks)
                    .where(tasks.c.task_id == task.task_id, tasks.c.generation == task.generation)
                    .values(
                        status="failed",
                        failure_code="recovery_limit",
                        last_error=f"{recoveries} generations in a row lost their lease",
                        recoveries=recoveries,
                        updated_at=utcnow(),
                    )
                )
                report.parked.append((task.task_id, task.generation))
                return
            nxt = task_store.requeue_generation(
                conn,
                task.task_id,
                task.generation,
                title=task.title,
                from_statuses=("running",),
                recoveries=recoveries,
                rounds=task.rounds,
            )
        if nxt is not None:
            report.requeued.append((execution.task_id, execution.generation, nxt))
            from orchestrator import metrics  # on use: see orchestrator.metrics on prefork

            metrics.RECOVERIES.inc()
            if execution.lease_expires_at is not None:
                delay = (utcnow() - execution.lease_expires_at).total_seconds()
                metrics.RECOVERY_DELAY.observe(max(0.0, delay))
            safe_dispatch(self.dispatcher, execution.task_id, nxt)

    def _republish_stale(self, now: datetime, report: SweepReport) -> None:
        before = now - timedelta(seconds=self.settings.queued_stale_seconds)
        with self.db.transaction(readonly=True) as conn:
            stale = task_store.stale_queued(conn, before, self.batch)
        for task in stale:
            with self.db.transaction() as conn:
                claimed = task_store.touch_queued(conn, task)
            if claimed and safe_dispatch(self.dispatcher, task.task_id, task.generation):
                report.republished.append((task.task_id, task.generation))
