"""One execution generation: lease, claim, agent round, state decision, all fenced.

Celery delivery is a wake-up, not an order: a message for a generation that is not the task's
queued one, or whose lease someone else holds, returns without starting an agent.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import timedelta
from functools import partial

from redis.exceptions import RedisError
from sqlalchemy.exc import DBAPIError

from orchestrator.agent.host import ToolHost
from orchestrator.agent.loop import LeaseLost, run_round
from orchestrator.agent.model import ModelError, load_model
from orchestrator.domain.decisions import Decision, RoundFacts, decide
from orchestrator.errors import StaleGeneration
from orchestrator.leases import LeaseBackend, LeaseBackendUnavailable
from orchestrator.logs import bind_log_context
from orchestrator.services.actions import ActionService
from orchestrator.services.dispatch import Dispatcher, safe_dispatch
from orchestrator.services.lease_keeper import LeaseKeeper, lease_name
from orchestrator.services.plans import PlanService
from orchestrator.settings import Settings
from orchestrator.store import reports as report_store
from orchestrator.store import tasks as task_store
from orchestrator.store.db import Database
from orchestrator.store.fencing import check_fence
from orchestrator.store.receipts import ReceiptLedger
from orchestrator.store.records import TaskRecord
from orchestrator.store.types import utcnow
from orchestrator.tools.actions import ProposeAction
from orchestrator.tools.base import Fence, Tool, ToolCancelled, ToolContext
from orchestrator.tools.command import ExecuteCommand
from orchestrator.tools.plans import PublishExecutionPlan
from orchestrator.tools.results import ResultCache
from orchestrator.tools.tasks import ReadTaskContext, SaveReport
from orchestrator.tools.toolsets import receipt_tools

__all__ = [
    "DecisionRule",
    "ExecutionService",
    "RunResult",
    "decide_round",
    "finish_generation",
    "fixed",
]

log = logging.getLogger(__name__)

#: Errors of the store or the lease back end: the generation stops and recovery takes over.
_INFRASTRUCTURE = (DBAPIError, RedisError, LeaseBackendUnavailable)


@dataclass(frozen=True)
class RunResult:
    """What one delivery did: `ran` is False when it started no agent."""

    ran: bool
    detail: str
    outcome: str | None = None
    retry_after: float | None = None  # wake again later: a superseded holder is still stopping


class ExecutionService:
    def __init__(
        self,
        settings: Settings,
        db: Database,
        leases: LeaseBackend,
        plans: PlanService,
        dispatcher: Dispatcher,
        ledger: ReceiptLedger | None = None,
    ) -> None:
        self.settings = settings
        self.db = db
        self.leases = leases
        self.plans = plans
        self.dispatcher = dispatcher
        self.ledger = ledger or ReceiptLedger(db)
        # One large-result cache per process; results are kept per session graph inside it.
        self.results = ResultCache()
        # The business-backend gateway, the command tool (when enabled) and the receipt readers.
        self.receipt_tools = receipt_tools(settings, self.ledger, self.results)

    def run(
        self, task_id: str, generation: int, *, worker: str, celery_task_id: str | None = None
    ) -> RunResult:
        """Run `generation` of `task_id` if, and only if, it is the task's queued generation."""
        ttl = self.settings.lease_seconds
        # The lease first, then the compare-and-set claim: a wake-up for a generation that is
        # not queued any more takes the lease for a moment and gives it back unused.
        token = self.leases.acquire(lease_name(task_id), worker, ttl)
        if token is None:
            return self._not_acquired(task_id, generation)
        with self.db.single_statement() as conn:  # one statement on Postgres
            claimed = task_store.claim_generation(
                conn,
                task_id,
                generation,
                lease_token=token,
                worker=worker,
                celery_task_id=celery_task_id,
                lease_expires_at=utcnow() + timedelta(seconds=ttl),
            )
        if claimed is None:
            self.leases.release(lease_name(task_id), token)
            return RunResult(False, self._why_not_queued(task_id, generation))
        task, session_id = claimed
        bind_log_context(session_id=session_id)  # the worker's log lines name the session
        fence = Fence(task_id, generation, token)
        keeper = LeaseKeeper(
            self.leases, self.db, fence, ttl=ttl, renew_every=self.settings.lease_renew_seconds
        )
        keeper.start()
        try:
            return self._round(task, session_id, fence, keeper)
        finally:
            keeper.close()
            self._end_of_round(session_id)

    def _end_of_round(self, session_id: str) -> None:
        """Nothing of the round outlives it: its paged results and its background commands."""
        self.results.drop_graph(session_id)
        for tool in self.receipt_tools:
            if isinstance(tool, ExecuteCommand):
                tool.reap(session_id)

    def _not_acquired(self, task_id: str, generation: int) -> RunResult:
        with self.db.transaction(readonly=True) as conn:
            task = task_store.get_task(conn, task_id)
        if task is None or task.generation != generation or task.status != "queued":
            return RunResult(False, self._describe(task))
        # The previous generation's worker holds it until it notices it was superseded
        # (at its next renewal or write); this wake-up comes back later.
        return RunResult(
            False,
            "another worker holds the task's lease",
            retry_after=self.settings.lease_renew_seconds,
        )

    def _why_not_queued(self, task_id: str, generation: int) -> str:
        with self.db.transaction(readonly=True) as conn:
            task = task_store.get_task(conn, task_id)
        if task is not None and task.generation == generation and task.status == "queued":
            return "the generation's execution was closed first"
        return self._describe(task)

    @staticmethod
    def _describe(task: TaskRecord | None) -> str:
        if task is None:
            return "no such task"
        return f"task is at generation {task.generation} ({task.status})"

    def _round(
        self, task: TaskRecord, session_id: str, fence: Fence, keeper: LeaseKeeper
    ) -> RunResult:
        ctx = ToolContext(
            owner=f"task:{task.task_id}",
            session_id=session_id,
            # Identical writes share one identity per intent round, across the generations
            # that recovery or continuation start in it (seed 000: only a new request repeats).
            round_id=f"intent:{task.intent_round}",
            task_id=task.task_id,
            generation=fence.generation,
            fence=fence,
            # Lease lost, generation fenced (requeue, cancel): long-running tools stop too.
            cancel=keeper.lost,
        )
        host = ToolHost(self._tools(keeper), ledger=self.ledger, results=self.results)
        try:
            model = load_model(self.settings.model, task.task_type)
            model.check_tools(list(host.tools))
            end = run_round(
                model,
                host,
                ctx,
                brief=f"Condition task {task.task_id} ({task.task_type}): {task.title}",
                max_turns=self.settings.max_turns,
                stop=keeper.lost,
            )
        except (LeaseLost, StaleGeneration, ToolCancelled) as exc:
            log.warning("generation %s of %s stopped: %s", fence.generation, task.task_id, exc)
            return RunResult(True, f"stopped without writing: {exc}")
        except ModelError as exc:
            return self._finish(
                task, fence, keeper, fixed(Decision("failed", "failed", str(exc), "model_error"))
            )
        except _INFRASTRUCTURE as exc:
            # Not the task's fault: leave the generation open; its lease runs out and the
            # sweeper requeues it as the next generation.
            log.warning("generation %s of %s stopped: %s", fence.generation, task.task_id, exc)
            return RunResult(True, f"stopped on an infrastructure error: {type(exc).__name__}")
        except Exception as exc:
            log.exception("round of task %s failed", task.task_id)
            decision = Decision("failed", "failed", f"agent error: {exc}", "agent_error")
            return self._finish(task, fence, keeper, fixed(decision))
        return self._finish(
            task,
            fence,
            keeper,
            partial(
                decide_round,
                max_rounds=self.settings.max_rounds,
                turn_budget_spent=end.why == "turn_budget",
            ),
        )

    def _finish(
        self, task: TaskRecord, fence: Fence, keeper: LeaseKeeper, rule: DecisionRule
    ) -> RunResult:
        try:
            keeper.check()
            decision, next_generation = finish_generation(self.db, fence, rule)
        except (LeaseLost, StaleGeneration) as exc:
            return RunResult(True, f"stopped before its decision: {exc}")
        except _INFRASTRUCTURE as exc:
            log.warning("generation %s of %s stopped: %s", fence.generation, task.task_id, exc)
            return RunResult(True, f"stopped before its decision: {type(exc).__name__}")
        if next_generation is not None:
            safe_dispatch(self.dispatcher, task.task_id, next_generation)
        return RunResult(True, decision.reason, decision.outcome)

    def _tools(self, keeper: LeaseKeeper) -> list[Tool]:
        return [
            ReadTaskContext(self.db),
            PublishExecutionPlan(self.plans, keeper),
            ProposeAction(ActionService(self.db, self.plans), keeper),
            SaveReport(self.db, keeper),
            *self.receipt_tools,
        ]


#: Decides the round from what the generation left in the store.
DecisionRule = Callable[[RoundFacts], Decision]


def fixed(decision: Decision) -> DecisionRule:
    """A rule that ignores the facts (the round failed before it could be judged)."""
    return lambda _facts: decision


def decide_round(facts: RoundFacts, *, max_rounds: int, turn_budget_spent: bool) -> Decision:
    """The decision table, and a round whose turn budget ran out continues rather than fails."""
    decision = decide(replace(facts, max_rounds=max_rounds))
    if decision.queues_next and turn_budget_spent:
        return Decision("queued", "continue", "the turn budget of the round ran out")
    return decision


def finish_generation(
    db: Database, fence: Fence, rule: DecisionRule
) -> tuple[Decision, int | None]:
    """End the fenced generation as `rule` decides from its latest plan and report.

    The facts are read in the transaction that applies the decision, with the task row locked,
    so an approval or a requeue cannot slip in between. Returns the decision and the next
    generation when one is queued.
    """
    with db.transaction() as conn:
        live = check_fence(conn, fence)
        facts = report_store.generation_facts(
            conn, fence.task_id, fence.generation, live.session_id
        )
        decision = rule(
            RoundFacts(
                plan_nodes=facts.plan_nodes,
                report_outcome=facts.report_outcome,
                pending_actions=facts.pending_actions,
                rounds_done=live.rounds,
                max_rounds=0,
            )
        )
        if decision.queues_next:
            task_store.end_generation(
                conn,
                fence.task_id,
                fence.generation,
                outcome=decision.outcome,
                reason=decision.reason,
                failure_code=decision.failure_code,
            )
            nxt = task_store.requeue_generation(
                conn,
                fence.task_id,
                fence.generation,
                title=live.title,
                from_statuses=("running",),
                recoveries=0,
                rounds=live.rounds + 1,
            )
            return decision, nxt
        task_store.end_and_settle(
            conn,
            fence.task_id,
            fence.generation,
            outcome=decision.outcome,
            reason=decision.reason,
            failure_code=decision.failure_code,
            status=decision.task_status,
            last_error=decision.reason if decision.task_status == "failed" else None,
            rounds=live.rounds + 1,
        )
    return decision, None
