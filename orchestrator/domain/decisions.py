"""The state decision at the end of a round, from the current generation's plan and report only,
and from what the host knows of the task's writes and the round's background commands.

Invariant 23: a generation never ends `completed` while a write of the task is `running`,
`unknown` or `pending`, or a background command of its round still runs. Then the generation
ends `waiting`, and the reason names what is open: the host cannot show that the work is done,
so it does not claim it, and another round would only see the same open write (a `pending` job
belongs to the system that runs it; an `unknown` write is verified read-only, not replayed).

A failed node stays failed (seed 004: 重试使用新节点): it holds the completion until a retry of
it is completed. A retry is a new node of the same actor with an edge from the failed node,
drawn at or after the failure (`domain.retries`: the host keeps which node retries which with
each revision; an edge drawn before the failure is a succession and retries nothing); a retry
that failed in turn is released by its own completed retry. A human step's retry is a human
node, which only a person completes, so the agent alone never turns a person's failure into a
completion (invariants 6 and 22). An agent's own failed node may also be marked skipped or
cancelled once it no longer applies; a person's failed node cannot (the agent never rewrites
what a person closed).

A human node a person failed is news the agent must answer (`unanswered_failed_human_nodes`):
with a retry drawn (a new human node with an edge from it, open or completed), or by reporting the
task failed. Until it is answered it queues the next round even while other human nodes are
open, whoever wrote the plan's latest revision: the person after the agent's last plan, or the
agent, publishing again (or, in the next generation, keeping the step a person failed in an
earlier generation's plan) without a retry. A call-back may take days; the retry should not
wait for it. What bounds an agent that never answers is the round limit: the task fails with
`round_limit`, the reason naming the failed step and how to retry it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.domain.retries import retries_of
from orchestrator.domain.vocabulary import OPEN_NODE_STATUSES

__all__ = [
    "Decision",
    "RoundFacts",
    "awaited_human_nodes",
    "decide",
    "open_human_nodes",
    "report_failure",
    "unanswered_failed_human_nodes",
    "unretried_failed_nodes",
    "waiting_reason",
]

_DONE = frozenset({"completed", "skipped", "cancelled"})
#: A human node in one of these no longer waits for a person: a person closed it, or it no
#: longer applies. A failed one still holds the completion until its retry is completed.
_HUMAN_CLOSED = _DONE | {"failed"}


def unretried_failed_nodes(
    nodes: Sequence[Mapping[str, Any]] | None, retries: Mapping[str, Sequence[str]]
) -> list[str]:
    """The ids of the failed nodes that have no completed retry, in plan order.

    `retries` is the revision's relation (`domain.retries`); `RoundFacts.relation` reads an
    older revision's from its edges."""
    return _failed_unreleased(nodes, retries, frozenset({"completed"}))


def unanswered_failed_human_nodes(
    nodes: Sequence[Mapping[str, Any]] | None, retries: Mapping[str, Sequence[str]]
) -> list[str]:
    """The ids of the human nodes a person failed that the plan does not answer, in plan order.

    A failed human node is answered by a retry drawn for it (`retries`, `domain.retries`): a
    human node that is completed, still open (waiting for its person), or failed and answered
    in turn. A retry a person failed or skipped, with nothing after it, answers nothing: the
    agent must act again. A human node that followed it before it failed answers nothing
    either: it was planned for its own reason.
    """
    answering = frozenset({"completed", *OPEN_NODE_STATUSES})
    return _failed_unreleased(nodes, retries, answering, actor="human")


def _failed_unreleased(
    nodes: Sequence[Mapping[str, Any]] | None,
    retries: Mapping[str, Sequence[str]],
    releasing: frozenset[str],
    *,
    actor: str | None = None,
) -> list[str]:
    """The failed nodes (of `actor`, or any) with no retry of their actor in a `releasing`
    status, in plan order; a retry that failed in turn passes the question on to its own."""
    by_id = {str(n["id"]): n for n in nodes or ()}
    released: dict[str, bool] = {}

    def is_released(node_id: str, seen: frozenset[str]) -> bool:
        if node_id not in released:
            own = by_id[node_id].get("actor")
            released[node_id] = any(
                (retry := by_id.get(target)) is not None
                and target not in seen  # a stored plan has no cycle; never loop on one
                and retry.get("actor") == own
                and (
                    retry.get("status") in releasing
                    or (retry.get("status") == "failed" and is_released(target, seen | {target}))
                )
                for target in retries.get(node_id, ())
            )
        return released[node_id]

    return [
        node_id
        for node_id, n in by_id.items()
        if n.get("status") == "failed"
        and (actor is None or n.get("actor") == actor)
        and not is_released(node_id, frozenset({node_id}))
    ]


def awaited_human_nodes(
    nodes: Sequence[Mapping[str, Any]] | None, retries: Mapping[str, Sequence[str]]
) -> list[str]:
    """The human nodes the task waits for: those a person has yet to close, unless a person
    failed a step the plan does not answer; then nothing is awaited (the agent must get a
    round to retry it, or fail the task, and not after the call-back of days later).

    The end of a round (`decide`) and a person's decision (`services.redecide`) share it.
    """
    if unanswered_failed_human_nodes(nodes, retries):
        return []
    return open_human_nodes(nodes)


def waiting_reason(pending_actions: int, awaited: Sequence[str]) -> str | None:
    """Why a task waits on people (pending actions, the human nodes `awaited_human_nodes`
    gives), in the words of its `waiting` event; None when nothing holds it.

    The end of a round and a person's decision that leaves the task waiting
    (`services.redecide`) say it alike. With an action pending the human nodes are named too:
    once the action is decided the task may still wait for them.
    """
    if pending_actions > 0:
        reason = f"{pending_actions} action(s) await approval"
        if awaited:
            reason += "; human node(s) not completed: " + ", ".join(awaited)
        return reason
    if awaited:
        return "human node(s) not completed: " + ", ".join(awaited)
    return None


def open_human_nodes(nodes: Sequence[Mapping[str, Any]] | None) -> list[str]:
    """The ids of the human nodes a person has yet to close."""
    return [
        str(n["id"])
        for n in nodes or ()
        if n.get("actor") == "human" and n.get("status") not in _HUMAN_CLOSED
    ]


@dataclass(frozen=True)
class RoundFacts:
    """What a round left in the store: only the current generation's latest plan and report."""

    plan_nodes: Sequence[Mapping[str, Any]] | None
    report_outcome: str | None
    pending_actions: int
    rounds_done: int  # rounds already ended `continue` before this one
    max_rounds: int
    #: The task's writes the host cannot show finished: "tool_name invocation_id (status)".
    open_writes: Sequence[str] = ()
    #: Background commands of this round still running when it ended (they are reaped after).
    running_commands: int = 0
    plan_edges: Sequence[Mapping[str, Any]] | None = ()
    #: A person wrote the latest revision (closed a human node after the agent's last plan):
    #: said in the reason of a round an unanswered failure queues, not a condition of it.
    person_revised_last: bool = False
    #: Nodes of the plan stored in a shape the rules cannot read (not an object, no id): the
    #: host cannot show them done, so the plan is not done (`domain.plans.readable_nodes`).
    unreadable_nodes: int = 0
    #: Which node retries which failed node, as stored with the revision (`domain.retries`);
    #: None for a revision stored before the relation was kept, read from its edges.
    plan_retries: Mapping[str, Sequence[str]] | None = None
    #: The summary of the same report: a report that declared the task failed says why there.
    report_summary: str | None = None

    @property
    def relation(self) -> Mapping[str, Sequence[str]]:
        """The retries the rules go by: the stored relation, or an older revision's edges."""
        return retries_of(self.plan_nodes, self.plan_edges, self.plan_retries)


@dataclass(frozen=True)
class Decision:
    """The task status to set, the outcome of the ending execution, and why."""

    task_status: str
    outcome: str
    reason: str
    failure_code: str | None = None

    @property
    def queues_next(self) -> bool:
        return self.outcome == "continue"


def _tally(nodes: Sequence[Mapping[str, Any]]) -> str:
    """How a done plan's nodes ended, e.g. `2 completed, 1 skipped`: a plan whose every node
    was skipped or cancelled is done too, and its completion should not read like work."""
    counts = Counter(str(n["status"]) for n in nodes)
    words = {"completed": "completed", "skipped": "skipped", "cancelled": "cancelled"}
    words["failed"] = "failed and retried"  # a done plan's failed nodes all have a retry
    parts = [f"{counts[status]} {word}" for status, word in words.items() if counts[status]]
    if not counts["completed"]:
        parts.insert(0, "none completed")
    # A person completes, fails or skips a human step, never cancels one: a cancelled human
    # node is the agent's call that the step no longer applies, which the operator should see.
    dropped = [
        str(n["id"]) for n in nodes if n.get("actor") == "human" and n["status"] == "cancelled"
    ]
    if dropped:
        parts.append("human step(s) the agent cancelled: " + ", ".join(dropped))
    return ", ".join(parts)


def decide(facts: RoundFacts) -> Decision:
    """The decision table of the executions issue; a round without a report never completes."""
    if facts.report_outcome == "failed":
        reason = report_failure(facts.report_summary, facts.plan_nodes)
        return Decision("failed", "failed", reason, "report_failed")
    nodes = list(facts.plan_nodes or [])
    # A skipped or cancelled human node no longer applies, a failed one was closed by a person;
    # any other is awaited, unless a person failed a step the plan does not answer (no retry
    # drawn): the agent must get a round to retry it (or fail the task), though it published
    # last (it kept the failure and drew nothing), and not after the call-back of days later.
    retries = facts.relation
    unretried = unretried_failed_nodes(nodes, retries)
    unanswered = unanswered_failed_human_nodes(nodes, retries)
    open_human = awaited_human_nodes(nodes, retries)
    waiting = waiting_reason(facts.pending_actions, open_human)
    if waiting is not None:
        return Decision("waiting", "waiting", waiting)
    # Only a report that declared `completed` (which cites recorded evidence) completes: one
    # that declared `waiting` or `continue` is never turned into a completion by the host;
    # with nothing to wait for (no approval, no open human node) the task continues.
    all_done = (
        bool(nodes)
        and not facts.unreadable_nodes
        and all(
            n["status"] in _DONE or (n["status"] == "failed" and str(n["id"]) not in unretried)
            for n in nodes
        )
    )
    declared_done = facts.report_outcome == "completed"
    if declared_done and all_done:
        unfinished = _unfinished_work(facts)
        if unfinished:
            return Decision("waiting", "waiting", "not completed: " + unfinished)
        return Decision(
            "completed",
            "completed",
            f"every plan node is done ({_tally(nodes)}) and a report was saved",
        )
    # Said in every reason below: the operator and the next round see what holds the task.
    retry = _retry_hint(nodes, unretried)
    if facts.rounds_done + 1 >= facts.max_rounds:
        return Decision(
            "failed",
            "failed",
            f"the task did not finish within {facts.max_rounds} rounds" + retry,
            "round_limit",
        )
    if unanswered:
        said = (
            "a person failed human node(s) after the agent's last plan: "
            if facts.person_revised_last
            else "human node(s) a person failed, with no retry in the agent's plan: "
        )
        return Decision("queued", "continue", said + ", ".join(unanswered) + retry)
    if facts.report_outcome is None:
        return Decision("queued", "continue", "the round saved no report" + retry)
    if facts.plan_nodes is None:
        # Invariant 10: the decision reads this generation's plan only, and it published none
        # (an agent that found the task's plan as it should be, after a crash or a requeue, may
        # only report). Said so, the next round's agent publishes it (`read_task_context` gives
        # it this reason), instead of reporting again round after round to the round limit.
        return Decision("queued", "continue", _NO_PLAN + retry)
    if facts.report_outcome == "waiting":
        return Decision(
            "queued", "continue", "the report declared waiting, but nothing is awaited" + retry
        )
    if facts.report_outcome == "continue" and all_done:
        return Decision("queued", "continue", "the report declared continue")
    return Decision("queued", "continue", "plan nodes remain open" + retry)


#: How a failure the report declared begins: the words that follow are the report's.
REPORT_FAILED = "the report declared the task failed"
#: How much of the report's summary the reason holds (the report keeps it whole).
_SUMMARY_SHOWN = 240


def report_failure(summary: str | None, nodes: Sequence[Mapping[str, Any]] | None) -> str:
    """Why the task failed, in the report's words: its summary on one line, cut between words
    after about 240 characters (`…`: the report shows it whole); for a blank summary, the
    reasons of the plan's failed nodes. The task's last error, the generation's reason and the
    `failed` event say it: "the report declared the task failed" alone told an operator that
    the agent gave up, not why."""
    said = " ".join((summary or "").split())
    if said:
        return f"{REPORT_FAILED}: {_shortened(said, _SUMMARY_SHOWN)}"
    failed = [
        f"failed node {n['id']}: {_shortened(' '.join(str(n.get('reason') or '').split()), 120)}"
        for n in nodes or ()
        if n.get("status") == "failed" and str(n.get("reason") or "").strip()
    ]
    return "; ".join([REPORT_FAILED, *failed[:3]])


def _shortened(text: str, limit: int) -> str:
    """`text` if it holds in `limit` characters, else cut at the last space before the limit
    (or at it, in a word longer than half of it) and ended with `…`."""
    if len(text) <= limit:
        return text
    cut = text[:limit]
    space = cut.rfind(" ")
    if space > limit // 2:
        cut = cut[:space]
    return cut.rstrip(" ,;:") + "…"


#: Why a round that published no plan of its own continues, and what the next one must do.
_NO_PLAN = (
    "the round published no plan of its own: the decision reads only this generation's plan, "
    "so publish the whole plan with publish_execution_plan (keeping every node of the task's "
    "last plan, as read_task_context gives it) before save_report"
)


def _retry_hint(nodes: Sequence[Mapping[str, Any]], unretried: Sequence[str]) -> str:
    """The failed nodes without a completed retry and how to go on; "" when there are none."""
    if not unretried:
        return ""
    actors = {str(n["id"]): n.get("actor") for n in nodes}
    named = ", ".join(f"{node_id} ({actors.get(node_id)})" for node_id in unretried)
    return (
        f"; failed node(s) with no completed retry: {named}. Retry each with a new node of the "
        "same actor and an edge from the failed node (a node already in the plan when it "
        "failed is no retry; a person closes a human one), or save the report with outcome "
        "failed"
    )


def _unfinished_work(facts: RoundFacts) -> str:
    """What the host knows is not finished, in words; "" when nothing is."""
    parts: list[str] = []
    if facts.open_writes:
        shown = ", ".join(facts.open_writes[:5])
        more = len(facts.open_writes) - 5
        parts.append(
            f"{len(facts.open_writes)} write(s) not finished: {shown}"
            + (f" and {more} more" if more > 0 else "")
        )
    if facts.running_commands:
        parts.append(f"{facts.running_commands} background command(s) still running")
    return "; ".join(parts)
