"""How a generation's round ends: the decision rule applied to what the round left in the store
(its latest plan and report, pending actions, open writes), and the fenced transaction that
applies it: the generation ended and either the next one queued or the task settled.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from orchestrator.agent.repeats import SAME_FAILURE_LIMIT
from orchestrator.domain.decisions import Decision, RoundFacts, decide
from orchestrator.domain.fences import Fence
from orchestrator.domain.human_steps import is_person_revision
from orchestrator.domain.vocabulary import TERMINAL_TASK_STATUSES
from orchestrator.store import generations as generation_store
from orchestrator.store import open_work
from orchestrator.store import reports as report_store
from orchestrator.store import task_events as event_store
from orchestrator.store.db import Database
from orchestrator.store.fencing import check_fence

__all__ = ["DecisionRule", "decide_round", "finish_generation", "fixed"]


#: Decides the round from what the generation left in the store.
DecisionRule = Callable[[RoundFacts], Decision]


def fixed(decision: Decision) -> DecisionRule:
    """A rule that ignores the facts (the round failed before it could be judged)."""
    return lambda _facts: decision


def decide_round(
    facts: RoundFacts,
    *,
    max_rounds: int,
    turn_budget_spent: bool,
    max_turns: int | None = None,
    running_commands: int = 0,
    empty_answer_turn: int | None = None,
    earlier_reasons: Sequence[str | None] = (),
) -> Decision:
    """The decision table, and a round whose turn budget ran out continues rather than fails
    (the round limit's reason says the last round's ran out, naming ORCH_MAX_TURNS).

    A round that ended on an empty reply (`empty_answer_turn`: no text and no tool call) and
    saved no report says so: "the round saved no report" alone, round after round, hid a model
    or server that returns nothing. When the generations before it ended for that same reason
    having made the same calls (`earlier_reasons`, newest first), `SAME_FAILURE_LIMIT` rounds
    in a row, the task fails `model_error` rather than running round after round to
    ORCH_MAX_ROUNDS: the next round would be asked the same and answer the same."""
    decision = decide(replace(facts, max_rounds=max_rounds, running_commands=running_commands))
    if turn_budget_spent:
        # The setting named: a model looping on calls that fail spends every round's budget.
        spent = "the turn budget of the round ran out" + (
            f" (ORCH_MAX_TURNS={max_turns})" if max_turns is not None else ""
        )
        if decision.queues_next:
            return Decision("queued", "continue", spent)
        if decision.failure_code == "round_limit":
            return replace(decision, reason=f"{decision.reason}; in the last round {spent}")
    if empty_answer_turn is None or facts.report_outcome is not None:
        return decision
    said = f"the model returned an empty answer (no text and no tool call) {_at(empty_answer_turn)}"
    if not decision.reason.startswith(_NO_REPORT):
        return replace(decision, reason=f"{decision.reason}; in the last round {said}")
    decision = replace(decision, reason=f"{_NO_REPORT}: {said}{decision.reason[len(_NO_REPORT) :]}")
    same = list(earlier_reasons[: SAME_FAILURE_LIMIT - 1])
    if not decision.queues_next or len(same) < SAME_FAILURE_LIMIT - 1:
        return decision
    if any(reason != decision.reason for reason in same):
        return decision  # another end between: the model did something else
    return Decision(
        "failed",
        "failed",
        f"{said} in {SAME_FAILURE_LIMIT} rounds in a row, saving no report: the next round "
        "would be asked the same; look at the model server (its log, the model's chat "
        "template, the output limit) rather than run it again",
        "model_error",
    )


#: How the decision table says a round saved no report (`decide`).
_NO_REPORT = "the round saved no report"


def _at(turn: int) -> str:
    """Where in the round the empty answer came: at once, or after turns of tool calls."""
    if turn == 1:
        return "to the round's first request"
    return f"at turn {turn} of the round, after {turn - 1} turn(s) of tool calls"


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
                open_writes=open_work.open_writes(conn, fence.task_id),
                plan_edges=facts.plan_edges,
                person_revised_last=is_person_revision(facts.plan_request_id),
                unreadable_nodes=facts.unreadable_nodes,
                plan_retries=facts.plan_retries,
                report_summary=facts.report_summary,
            )
        )
        if decision.queues_next:
            generation_store.end_generation(
                conn,
                fence.task_id,
                fence.generation,
                outcome=decision.outcome,
                reason=decision.reason,
                failure_code=decision.failure_code,
            )
            nxt = generation_store.requeue_generation(
                conn,
                fence.task_id,
                fence.generation,
                title=live.title,
                from_statuses=("running",),
                recoveries=0,
                rounds=live.rounds + 1,
            )
            if nxt is not None:
                event_store.record_event(
                    conn,
                    fence.task_id,
                    "queued",
                    generation=nxt,
                    reason=decision.reason,
                    task_locked=True,  # the fence check holds the task row
                )
            return decision, nxt
        generation_store.end_and_settle(
            conn,
            fence.task_id,
            fence.generation,
            outcome=decision.outcome,
            reason=decision.reason,
            failure_code=decision.failure_code,
            status=decision.task_status,
            last_error=decision.reason if decision.task_status == "failed" else None,
            rounds=live.rounds + 1,
            # Nothing carries a finished task's proposals forward: as a cancel does, its pending
            # actions are superseded (in the same statement), so no approval can deliver one.
            supersede_note=(
                f"the task {decision.task_status}: {decision.reason}"
                if decision.task_status in TERMINAL_TASK_STATUSES
                else None
            ),
        )
        event_store.record_event(
            conn,
            fence.task_id,
            decision.task_status,
            reason=decision.reason,
            task_locked=True,  # the fence check holds the task row: no second lock statement
        )
    return decision, None
