"""The composition root: settings in, services out. Every process builds one.

A service is built, and its module imported, when a process first asks for it: an operator's
`orchestrator tasks list` imports the task service alone, not the sweeper, the actions, the
human steps, the plans, nor the agent and its tools (`executions`), each paid at every start.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

from orchestrator.events import PlanNotifier, RedisNotifier, make_notifier
from orchestrator.leases import LeaseBackend, LeaseBackendUnavailable, make_lease_backend
from orchestrator.leases.keys import task_lease
from orchestrator.store.db import Database

if TYPE_CHECKING:
    from orchestrator.services.actions import ActionService
    from orchestrator.services.dispatch import Dispatcher
    from orchestrator.services.executions import ExecutionService
    from orchestrator.services.human_steps import HumanStepService
    from orchestrator.services.plans import PlanService
    from orchestrator.services.sweeper import Sweeper
    from orchestrator.services.tasks import TaskService
    from orchestrator.settings import Settings
    from orchestrator.store.receipts import ReceiptLedger

__all__ = ["Runtime", "build_runtime", "celery_dispatcher"]


@dataclass
class Runtime:
    settings: Settings
    db: Database
    leases: LeaseBackend
    dispatcher: Dispatcher
    #: Wake-ups for streams in API processes: plan revisions and committed task events.
    notifier: PlanNotifier

    @cached_property
    def plans(self) -> PlanService:
        from orchestrator.services.plans import PlanService

        return PlanService(self.db, self.notifier)

    @cached_property
    def actions(self) -> ActionService:
        from orchestrator.services.actions import ActionService

        return ActionService(self.db, self.plans, self.dispatcher)

    @cached_property
    def human_steps(self) -> HumanStepService:
        from orchestrator.services.human_steps import HumanStepService

        return HumanStepService(self.db, self.plans, self.dispatcher)

    @cached_property
    def ledger(self) -> ReceiptLedger:
        from orchestrator.store.receipts import ReceiptLedger

        return ReceiptLedger(self.db)

    @cached_property
    def tasks(self) -> TaskService:
        from orchestrator.services.tasks import TaskService

        return TaskService(self.db, self.dispatcher, self.leases, receipts=True)

    @cached_property
    def executions(self) -> ExecutionService:
        from orchestrator.services.executions import ExecutionService

        return ExecutionService(
            self.settings, self.db, self.leases, self.plans, self.dispatcher, self.ledger
        )

    @cached_property
    def sweeper(self) -> Sweeper:
        from orchestrator.services.sweeper import Sweeper

        return Sweeper(self.settings, self.db, self.leases, self.dispatcher)

    def cold_start(self) -> int:
        """Receipts left `running` by generations that are no longer live become `unknown`.

        A generation whose mirrored expiry passed is live while the lease back end still holds
        its lease with its token (the mirror lags), as the sweeper finds it.
        """
        from orchestrator.store.recovery import lagging_generations, orphan_running_receipts
        from orchestrator.store.types import utcnow

        now = utcnow()
        with self.db.transaction(readonly=True) as conn:
            lagging = lagging_generations(conn, now)
        keep = self._still_held(lagging)
        with self.db.transaction() as conn:
            return orphan_running_receipts(conn, keep=keep, now=now)

    def _still_held(self, lagging: list[tuple[str, str | None]]) -> list[str]:
        """The owners of `lagging` generations whose lease is held (all of them, if the back
        end cannot tell: the sweeper orphans their receipts when it declares them lost)."""
        owners = [f"task:{task_id}" for task_id, _ in lagging]
        try:
            infos = self.leases.get_many([task_lease(task_id) for task_id, _ in lagging])
        except LeaseBackendUnavailable:
            return owners
        return [
            owner
            for owner, (_, token), info in zip(owners, lagging, infos, strict=True)
            if info is not None and info.token == token
        ]

    def close(self) -> None:
        # The hand-back retries first: none runs on against the store closed below. Built on
        # first use, the execution service is not built here to be closed.
        executions: ExecutionService | None = self.__dict__.get("executions")
        if executions is not None:
            executions.handback.close()
        self.leases.close()
        self.db.dispose()
        if isinstance(self.notifier, RedisNotifier):
            self.notifier.close()


def celery_dispatcher(settings: Settings) -> Dispatcher:
    """The production dispatcher (imports Celery only when asked for)."""
    from workers.celery_app import CeleryDispatcher, make_celery

    return CeleryDispatcher(make_celery(settings))


def build_runtime(settings: Settings, *, dispatcher: Dispatcher | None = None) -> Runtime:
    db = Database.from_url(
        settings.store_url, pool_size=settings.db_pool_size, max_overflow=settings.db_max_overflow
    )
    notifier = make_notifier(settings)
    # Task streams in API processes wake when this process commits a task event.
    db.after_commit = notifier.wake_keys
    return Runtime(
        settings=settings,
        db=db,
        notifier=notifier,
        leases=make_lease_backend(settings, db),
        dispatcher=dispatcher or celery_dispatcher(settings),
    )
