"""One execution generation: lease, claim, agent round, state decision, all fenced.

Celery delivery is a wake-up, not an order: a message for a generation that is not the task's
queued one, or whose lease someone else holds, returns without starting an agent.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from datetime import timedelta
from functools import partial

from redis.exceptions import RedisError
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

from orchestrator.agent.brief import task_brief, task_topic
from orchestrator.agent.budget import ContextBudget, ContextOverflow, TokenCounter
from orchestrator.agent.catalogue import SearchTools
from orchestrator.agent.evidence import EvidenceRecorder
from orchestrator.agent.host import ToolHost
from orchestrator.agent.loop import LeaseLost, run_round
from orchestrator.agent.model import Model, ModelBusy, ModelError, load_model
from orchestrator.agent.repeats import SAME_FAILURE_LIMIT, calls_made
from orchestrator.agent.request import AgentContext
from orchestrator.agent.sensitive import hide_configured
from orchestrator.agent.subagents import SUBAGENTS, Delegate, SubAgentRegistry, SubAgentRun
from orchestrator.agent.text_calls import answer_text
from orchestrator.agent.transcript import TranscriptWriter
from orchestrator.domain.decisions import Decision
from orchestrator.domain.fences import Fence
from orchestrator.errors import StaleGeneration
from orchestrator.leases import LeaseBackend, LeaseBackendUnavailable
from orchestrator.leases.keys import task_lease
from orchestrator.leases.process import current_process
from orchestrator.logs import bind_log_context, secrets_of
from orchestrator.services.actions import ActionService
from orchestrator.services.dispatch import Dispatcher, wake
from orchestrator.services.generation_watch import watch_for
from orchestrator.services.handback import HandBack
from orchestrator.services.lease_keeper import LeaseKeeper
from orchestrator.services.plans import PlanService
from orchestrator.services.recovery import save_round_snapshot
from orchestrator.services.round_end import DecisionRule, decide_round, finish_generation, fixed
from orchestrator.settings import Settings
from orchestrator.store import executions as execution_store
from orchestrator.store import generation_claims as claim_store
from orchestrator.store import open_work
from orchestrator.store import tasks as task_store
from orchestrator.store import transcripts as transcript_store
from orchestrator.store.db import Database, cause_line
from orchestrator.store.receipts import ReceiptLedger
from orchestrator.store.records import TaskRecord
from orchestrator.store.types import utcnow
from orchestrator.tools.actions import ProposeAction
from orchestrator.tools.base import Tool, ToolCancelled, ToolContext
from orchestrator.tools.command import ExecuteCommand
from orchestrator.tools.data_sources import QueryDataSource
from orchestrator.tools.plans import PublishExecutionPlan
from orchestrator.tools.results import ResultCache
from orchestrator.tools.source_declarations import load_sources
from orchestrator.tools.tasks import ReadTaskContext, SaveReport
from orchestrator.tools.toolsets import receipt_tools

__all__ = [
    "ExecutionService",
    "RunResult",
]

log = logging.getLogger(__name__)

#: Errors of the store or the lease back end: the generation stops and recovery takes over.
_INFRASTRUCTURE = (DBAPIError, RedisError, LeaseBackendUnavailable)
#: Those of them that say the store or Redis was away (a lost connection, a timeout, a restart):
#: an outage, counted in `handbacks`. A statement the store answered and refused (a constraint,
#: a value, a column the schema lacks) meets the same round again: counted in `recoveries`.
_OUTAGES = (OperationalError, InterfaceError, RedisError, LeaseBackendUnavailable)
#: How long a wake-up whose generation is queued but whose lease is held waits in its worker for
#: the holder to let go, and how often it tries the lease meanwhile (see `_await_release`).
RELEASE_WAIT_SECONDS = 0.5
RELEASE_POLL_SECONDS = 0.01
#: Every this many tries, the wait reads the store again: a generation claimed meanwhile (by
#: the wake-up that holds the lease: a duplicate) ends it.
RELEASE_RECHECK_POLLS = 5
#: The longest a rate-limited round waits to be requeued, whatever Retry-After says.
MAX_RATE_LIMIT_WAIT = 900.0
#: A round the model server could not serve waits at least this long before it is requeued
#: (longer when its Retry-After says so), doubled for each hand-back in a row before it (up to
#: MAX_RATE_LIMIT_WAIT): a server down or rate-limiting for an hour is asked a few times, not
#: at every sweep, before ORCH_MAX_HANDBACKS parks the task.
MODEL_AWAY_BACKOFF = 30.0


@dataclass(frozen=True)
class RunResult:
    """What one delivery did: `ran` is False when it started no agent."""

    ran: bool
    detail: str
    outcome: str | None = None
    retry_after: float | None = None  # wake again later: a superseded holder is still stopping
    #: The round stopped itself and left its generation open: hand it back once its lease is
    #: released (services/handback.py), rather than leave it to the mirrored lease running out.
    give_back: bool = False
    #: With `give_back`: the store or Redis failed under the round (counted in `handbacks`).
    #: False when it was the round's own doing: its lease ran out while the lease back end
    #: answered (the worker stalled), or the store refused a statement (`recoveries`).
    outage: bool = True
    #: With `give_back`: not requeued before this many seconds (the model server's
    #: Retry-After), and why the generation was handed back, shown on its execution.
    hand_back_after: float = 0.0
    hand_back_reason: str | None = None


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
        # The context budget of every conversation (issue 12) and its calibrated counter.
        self.context = AgentContext(
            ContextBudget(
                settings.llm_context_window,
                settings.llm_max_output_tokens,
                settings.llm_max_tools,
            ),
            TokenCounter(),
            # Masked in an unknown tool's arguments, in the transcript and a summary request.
            secrets=tuple(secrets_of(settings)),
        )
        self.subagents = SubAgentRegistry()
        self.handback = HandBack(db, settings.lease_seconds)
        # Declared data sources (a bad file raises `DataSourceError` here, at start).
        self.data_sources = load_sources(
            settings.data_sources, tool_timeout_seconds=settings.tool_timeout_seconds
        )
        self.evidence = EvidenceRecorder(db)

    def run(
        self,
        task_id: str,
        generation: int,
        *,
        worker: str,
        celery_task_id: str | None = None,
        first_delivery: bool = False,
    ) -> RunResult:
        """Run `generation` of `task_id` if, and only if, it is the task's queued generation.

        `first_delivery`: the wake-up is the one its generation was queued with, delivered for
        the first time (not a retry, not delivered again, not republished by the sweeper), so
        no other wake-up of the generation can have claimed it yet: the lease is taken first,
        without the store read that keeps a duplicate away from a running round's lease.
        """
        ttl = self.settings.lease_seconds
        # The store first: a wake-up for a generation that is not queued (delivered twice,
        # republished while it was claimed) returns without touching the lease. Its lease is
        # free while its round runs if Redis lost its data, until the round's heartbeat takes it
        # back; a wake-up that took it, even for the moment its claim took, had that heartbeat
        # refused, and the round stopped and was handed back for nothing. A first delivery
        # skips it (0.6 ms of its start): only a wake-up sent again can be such a duplicate.
        if not first_delivery:
            try:
                state = claim_store.task_state_alone(self.db, task_id)
            except _INFRASTRUCTURE as exc:
                return self._store_away(task_id, exc)
            if state != (generation, "queued"):
                return RunResult(False, _describe_state(state))
        # Then the lease, then the compare-and-set claim: a wake-up whose generation was claimed
        # since takes the lease for a moment and gives it back unused.
        try:
            token = self.leases.acquire(task_lease(task_id), worker, ttl) or self._await_release(
                task_id, generation, worker, ttl
            )
        except LeaseBackendUnavailable as exc:
            return self._leases_away(task_id, exc)
        if token is None:
            return self._not_acquired(task_id, generation)
        try:
            claimed = claim_store.claim_generation_alone(  # one statement on Postgres
                self.db,
                task_id,
                generation,
                lease_token=token,
                worker=worker,
                celery_task_id=celery_task_id,
                lease_expires_at=utcnow() + timedelta(seconds=ttl),
                process=current_process(),
            )
        except _INFRASTRUCTURE as exc:
            return self._claim_failed(task_id, generation, token, exc)
        if claimed is None:
            try:
                self.leases.release(task_lease(task_id), token)
            except LeaseBackendUnavailable:
                log.warning("task %s: its lease could not be given back; it runs out", task_id)
            return RunResult(False, self._why_not_queued(task_id, generation))
        task, session_id = claimed
        bind_log_context(session_id=session_id)  # the worker's log lines name the session
        from orchestrator import metrics  # on use: see orchestrator.metrics on prefork

        # Counted when the agent starts, not when its round ends: a round that runs for
        # minutes, or whose worker dies in it, has started.
        metrics.EXECUTIONS_STARTED.inc()
        fence = Fence(task_id, generation, token)
        keeper = LeaseKeeper(
            self.leases,
            self.db,
            fence,
            holder=worker,
            ttl=ttl,
            renew_every=self.settings.lease_renew_seconds,
        )
        keeper.start()
        # A cancel, a requeue or a sweep elsewhere stops this round at once, not at the next
        # renewal (services/generation_watch.py).
        watch = watch_for(self.settings.redis_url)
        if watch is not None:
            watch.follow(task_id)
        result: RunResult | None = None
        try:
            result = self._round(task, session_id, fence, keeper)
            return result
        finally:
            if watch is not None:
                watch.unfollow(task_id)
            keeper.close()  # the lease released first: the sweep then finds it gone
            self._end_of_round(session_id)
            # Last, once nothing of the round runs on (its background commands reaped): the
            # next sweep may requeue the generation at once.
            if result is not None and result.give_back:
                self.handback.give_back(
                    fence,
                    outage=result.outage,
                    after=result.hand_back_after,
                    reason=result.hand_back_reason,
                )

    def _end_of_round(self, session_id: str) -> None:
        """Nothing of the round outlives it: its paged results and its background commands,
        whose receipts take the end they showed, or `unknown` when still running (reaped)."""
        self.results.drop_graph(session_id)
        # An execution's session has one round: its sub-agents end and it takes no more.
        self.subagents.close_session(session_id)
        for tool in self.receipt_tools:
            if isinstance(tool, ExecuteCommand):
                ended, running = tool.background(session_id)
                tool.reap(session_id)
                self._settle_background(ended, running)

    def _background_still_running(self, session_id: str) -> int:
        """Settle the receipts of the round's ended background commands; count the others."""
        count = 0
        for tool in self.receipt_tools:
            if isinstance(tool, ExecuteCommand):
                ended, running = tool.background(session_id)
                self._settle_background(ended, [])
                count += len(running)
        return count

    def _settle_background(self, ended: list[tuple[str, str]], reaped: list[str]) -> None:
        if not ended and not reaped:
            return
        try:
            with self.db.transaction() as conn:
                open_work.settle_background(conn, ended, reaped)
        except _INFRASTRUCTURE:
            # Left `pending`: the decision already counted it as open, so nothing is claimed.
            log.warning("background command receipts could not be settled", exc_info=True)

    def _claim_failed(
        self, task_id: str, generation: int, token: str, exc: BaseException
    ) -> RunResult:
        """The store could not be reached to claim: give the lease back and come back after a
        renewal period, rather than leave the generation queued until the sweeper re-sends
        stale wake-ups. Should the claim have committed with its answer lost, the generation
        holds a token no lease backs: it is handed back (fenced by that token, so a claim that
        did not commit changes nothing) and the next sweep requeues it, not a lease later."""
        log.warning(
            "task %s: the generation could not be claimed (%s); trying again",
            task_id,
            cause_line(exc),
        )
        try:
            self.leases.release(task_lease(task_id), token)
        except _INFRASTRUCTURE:
            log.warning("task %s: its lease could not be given back; it runs out", task_id)
        self.handback.give_back(Fence(task_id, generation, token))
        return RunResult(
            False,
            f"the store could not be reached to claim the generation ({type(exc).__name__})",
            retry_after=self.settings.lease_renew_seconds,
        )

    def _store_away(self, task_id: str, exc: BaseException) -> RunResult:
        """The store could not be read before the lease was taken: nothing to give back; come
        back as a claim that met the store away does."""
        log.warning(
            "task %s: the generation could not be claimed (%s); trying again",
            task_id,
            cause_line(exc),
        )
        return RunResult(
            False,
            f"the store could not be reached to claim the generation ({type(exc).__name__})",
            retry_after=self.settings.lease_renew_seconds,
        )

    def _leases_away(self, task_id: str, exc: LeaseBackendUnavailable) -> RunResult:
        """Redis did not answer when the lease was asked for: nothing was taken; come back as a
        claim that met the store away does. Before, the error escaped to Celery, which logged
        it with a traceback and acknowledged the wake-up: the generation waited for the
        sweeper to take its wake-up for lost."""
        log.warning("task %s: the lease could not be taken (%s); trying again", task_id, exc)
        return RunResult(
            False,
            "the lease back end could not be reached to take the task's lease",
            retry_after=self.settings.lease_renew_seconds,
        )

    def _await_release(self, task_id: str, generation: int, worker: str, ttl: float) -> str | None:
        """The lease of a queued generation, once its holder lets go (None after
        `RELEASE_WAIT_SECONDS`). Its holder is most often about to: another wake-up of the
        generation between its lease and its claim, or the previous generation's worker,
        stopping. (A worker that stalled while its generation was requeued no longer takes the
        lease back: the store is asked first, services/lease_keeper.py.) Before, the wake-up
        came back after Celery's first retry (a second), then every ORCH_LEASE_RENEW_SECONDS,
        for a lease let go a few milliseconds after it was asked.

        Most often of all, though, the holder is a wake-up of the same generation (delivered
        twice, or republished after Redis lost its data) that claims it and keeps the lease
        for its round: the store is read again every `RELEASE_RECHECK_POLLS` tries, and a
        generation no longer queued ends the wait. Before, each such duplicate held a worker
        thread for the whole wait, a lease try every 10 ms, which a sweep's thousand
        republished wake-ups made minutes of a threads pool's time."""
        deadline = time.monotonic() + RELEASE_WAIT_SECONDS
        tries = 0
        while time.monotonic() < deadline:
            time.sleep(RELEASE_POLL_SECONDS)  # the release is a store answer away: no event
            token = self.leases.acquire(task_lease(task_id), worker, ttl)
            if token is not None:
                return token
            tries += 1
            if tries % RELEASE_RECHECK_POLLS == 0:
                try:
                    state = claim_store.task_state_alone(self.db, task_id)
                except _INFRASTRUCTURE:
                    continue  # the store away: the lease is tried on; the claim meets it
                if state != (generation, "queued"):
                    return None  # claimed (or ended) meanwhile: `_not_acquired` says so
        return None

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
        return _describe_state(None if task is None else (task.generation, task.status))

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
        host = ToolHost(
            self._tools(keeper),
            ledger=self.ledger,
            results=self.results,
            evidence=self.evidence,
            call_timeout=self.settings.tool_timeout_seconds,
            # What the model copies of them into a write is kept as `***` (`agent.host`).
            secrets=self.context.secrets,
        )
        # The durable transcript (fenced) and the memory of the round's recovery snapshot.
        transcript = TranscriptWriter(
            self.db, fence, session_id, host.tools, stop=keeper.lost, secrets=self.context.secrets
        )
        delegations = self.subagents.open_round(
            session_id,
            SubAgentRun(
                model=partial(self._subagent_model, task.task_type),
                host=host,
                max_turns=self.settings.max_turns,
                stop=keeper.lost,
                context=self.context,
            ),
        )
        ctx = replace(ctx, extras={**ctx.extras, SUBAGENTS: delegations})
        try:
            model = load_model(
                self.settings.model,
                task.task_type,
                settings=self.settings,
                deadline=keeper.vouched_until,
            )
            model.check_tools(list(host.tools))
            end = run_round(
                model,
                host,
                ctx,
                # Seed 004: the task's context comes first, in the brief of every request;
                # a configured secret in it reaches the model as `***`, as in a tool's answer.
                brief=task_brief(
                    task.task_id,
                    task.task_type,
                    hide_configured(task.title, self.context.secrets),
                    fence.generation,
                    hide_configured(task.context, self.context.secrets),
                ),
                topic=task_topic(
                    task.task_id, task.task_type, hide_configured(task.title, self.context.secrets)
                ),
                max_turns=self.settings.max_turns,
                stop=keeper.lost,
                recorder=transcript,
                context=self.context,
                transcript=transcript,
            )
            transcript.flush()  # the last results are in before the generation ends
        except (LeaseLost, StaleGeneration, ToolCancelled) as exc:
            if isinstance(exc, StaleGeneration):
                keeper.hear_why_over()
            stopped = _stop_line(keeper, exc)
            log.warning("generation %s of %s stopped: %s", fence.generation, task.task_id, stopped)
            save_round_snapshot(self.db, transcript, f"stopped: {stopped}")
            # A generation ended elsewhere (a cancel, a requeue) is left as it is by the hand-back;
            # one whose lease another holder took, or that went overdue, is requeued at the next
            # sweep. (A lease that merely vanished with Redis's data is taken back instead.)
            return RunResult(
                True,
                f"stopped without writing: {stopped}",
                give_back=True,
                outage=not keeper.lapsed,
            )
        except ModelBusy as exc:
            # A rate limit or a server away is neither the task's fault nor lasting: handed
            # back like an outage (counted in `handbacks`, parked at ORCH_MAX_HANDBACKS),
            # requeued once the back-off, and the server's Retry-After, have passed.
            why = f"handed back: {exc}"
            log.warning("generation %s of %s %s", fence.generation, task.task_id, why)
            save_round_snapshot(self.db, transcript, why)
            # The later of the server's Retry-After and the back-off: a short Retry-After the
            # round's retries already waited out (a burst against a tokens-per-minute limit)
            # would requeue it at every sweep and park it at ORCH_MAX_HANDBACKS in minutes.
            backoff = MODEL_AWAY_BACKOFF * 2 ** min(task.handbacks, 10)
            after = min(max(exc.retry_after or 0.0, backoff), MAX_RATE_LIMIT_WAIT)
            return RunResult(
                True,
                f"{why}; requeued in {after:g}s",
                give_back=True,
                hand_back_after=after,
                hand_back_reason=f"{why}; requeued in {after:g}s",
            )
        except ModelError as exc:
            # It may repeat what the model wrote (a tool's name): served as the task's error.
            why = hide_configured(str(exc), self.context.secrets)
            save_round_snapshot(self.db, transcript, f"model_error: {why}")
            return self._finish(
                task, fence, keeper, fixed(Decision("failed", "failed", why, "model_error"))
            )
        except ContextOverflow as exc:
            save_round_snapshot(self.db, transcript, f"context_overflow: {exc}")
            decision = Decision("failed", "failed", str(exc), "context_overflow")
            return self._finish(task, fence, keeper, fixed(decision))
        except _INFRASTRUCTURE as exc:
            # Not the task's fault: leave the generation open and hand it back (its mirrored
            # lease ends now, or once the store answers again); the sweeper requeues it.
            log.warning(
                "generation %s of %s stopped: %s", fence.generation, task.task_id, cause_line(exc)
            )
            save_round_snapshot(self.db, transcript, f"infrastructure error: {type(exc).__name__}")
            return RunResult(
                True,
                f"stopped on an infrastructure error: {type(exc).__name__}",
                give_back=True,
                outage=isinstance(exc, _OUTAGES),
            )
        except Exception as exc:
            log.exception("round of task %s failed", task.task_id)
            save_round_snapshot(self.db, transcript, f"agent error: {type(exc).__name__}")
            decision = Decision("failed", "failed", f"agent error: {exc}", "agent_error")
            return self._finish(task, fence, keeper, fixed(decision))
        try:
            still_running = self._background_still_running(session_id)
        except Exception:
            log.exception("background commands of task %s could not be read", task.task_id)
            still_running = 1  # cannot tell: never complete on it
        empty = end.why == "final_answer" and not answer_text(end.final_text)
        return self._finish(
            task,
            fence,
            keeper,
            partial(
                decide_round,
                max_rounds=self.settings.max_rounds,
                turn_budget_spent=end.why == "turn_budget",
                max_turns=self.settings.max_turns,
                running_commands=still_running,
                empty_answer_turn=end.turns if empty else None,
                earlier_reasons=self._earlier_reasons(fence) if empty else (),
            ),
        )

    def _earlier_reasons(self, fence: Fence) -> tuple[str | None, ...]:
        """Why each of the generations before `fence`'s ended, newest first, as many as a run
        of the same empty answer needs (`SAME_FAILURE_LIMIT`); None for one whose model made
        other calls than this generation's (`calls_made`: it read something else, published
        another plan; the rounds made progress); () when they cannot be read."""
        earlier = range(fence.generation - 1, fence.generation - SAME_FAILURE_LIMIT, -1)
        try:
            with self.db.transaction(readonly=True) as conn:
                calls = partial(transcript_store.entries_of, conn, task_id=fence.task_id)
                these = calls_made(calls(generation=fence.generation))
                found = [
                    (
                        execution_store.get_execution(conn, fence.task_id, generation),
                        calls_made(calls(generation=generation)),
                    )
                    for generation in earlier
                    if generation >= 1
                ]
        except Exception:  # judged on this round alone, as before
            log.warning("the earlier generations of %s could not be read", fence.task_id)
            return ()
        return tuple(None if row is None or calls != these else row.reason for row, calls in found)

    def _finish(
        self, task: TaskRecord, fence: Fence, keeper: LeaseKeeper, rule: DecisionRule
    ) -> RunResult:
        try:
            keeper.check()
            decision, next_generation = finish_generation(self.db, fence, rule)
        except (LeaseLost, StaleGeneration) as exc:
            if isinstance(exc, StaleGeneration):
                keeper.hear_why_over()
            return RunResult(
                True,
                f"stopped before its decision: {_stop_line(keeper, exc)}",
                give_back=True,
                outage=not keeper.lapsed,
            )
        except _INFRASTRUCTURE as exc:
            # Should the decision have committed with its answer lost, the hand-back finds the
            # execution closed and leaves it.
            log.warning(
                "generation %s of %s stopped: %s", fence.generation, task.task_id, cause_line(exc)
            )
            return RunResult(
                True,
                f"stopped before its decision: {type(exc).__name__}",
                give_back=True,
                outage=isinstance(exc, _OUTAGES),
            )
        if next_generation is not None:
            wake(self.db, self.dispatcher, task.task_id, next_generation)
        return RunResult(True, decision.reason, decision.outcome)

    def _tools(self, keeper: LeaseKeeper) -> list[Tool]:
        return [
            ReadTaskContext(self.db),
            PublishExecutionPlan(self.plans, keeper),
            ProposeAction(ActionService(self.db, self.plans), keeper),
            SaveReport(self.db, keeper),
            QueryDataSource(self.db, self.data_sources),
            *self.receipt_tools,
            *([SearchTools()] if self.settings.llm_max_tools > 0 else []),
            Delegate(),
        ]

    def _subagent_model(self, task_type: str) -> Model:
        """A sub-agent's model: the round's model in a new conversation. A scripted model plays
        `DIR/<task type>.subagent.json`."""
        return load_model(self.settings.model, f"{task_type}.subagent", settings=self.settings)


def _describe_state(state: tuple[int, str] | None) -> str:
    """Why a wake-up starts nothing: the task's generation and status, as the store has them."""
    if state is None:
        return "no such task"
    generation, status = state
    return f"task is at generation {generation} ({status})"


def _stop_line(keeper: LeaseKeeper, exc: BaseException) -> str:
    """Why a round stopped: what stopped it (a cancel and its reason, a requeue, a lease in
    doubt) first, as every stop says it, then what the round met (a fenced write)."""
    why, text = keeper.lost.why, str(exc)
    return f"{why}; {text}" if why and why not in text else text
