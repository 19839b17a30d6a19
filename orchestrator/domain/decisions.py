"""The state decision at the end of a round, from the current generation's plan and report only,
and from what the host knows of the task's writes and the round's background commands.

Invariant 23: a generation never ends `completed` while a write of the task is `running`,
`unknown` or `pending`, or a background command of its round still runs. Then the generation
ends `waiting`, and the reason names what is open: the host cannot show that the work is done,
so it does not claim it, and another round would only see the same open write (a `pending` job
belongs to the system that runs it; an `unknown` write is verified read-only, not replayed).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Decision", "RoundFacts", "decide", "open_human_nodes"]

_DONE = frozenset({"completed", "skipped", "cancelled"})
#: A human node in one of these no longer holds the task: a person closed it (a failed one
#: too: what follows is the agent's to decide), or it no longer applies.
_HUMAN_CLOSED = _DONE | {"failed"}


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


def decide(facts: RoundFacts) -> Decision:
    """The decision table of the executions issue; a round without a report never completes."""
    if facts.report_outcome == "failed":
        return Decision("failed", "failed", "the report declared the task failed", "report_failed")
    nodes = list(facts.plan_nodes or [])
    if facts.pending_actions > 0:
        return Decision("waiting", "waiting", f"{facts.pending_actions} action(s) await approval")
    # A skipped or cancelled human node no longer applies, a failed one was closed by a person;
    # any other is awaited.
    open_human = open_human_nodes(nodes)
    if open_human:
        return Decision(
            "waiting", "waiting", "human node(s) not completed: " + ", ".join(open_human)
        )
    # Only a report that declared `completed` (which cites recorded evidence) completes: one
    # that declared `waiting` or `continue` is never turned into a completion by the host;
    # with nothing to wait for (no approval, no open human node) the task continues.
    declared_done = facts.report_outcome == "completed"
    if declared_done and nodes and all(n["status"] in _DONE for n in nodes):
        unfinished = _unfinished_work(facts)
        if unfinished:
            return Decision("waiting", "waiting", "not completed: " + unfinished)
        return Decision("completed", "completed", "every plan node is done and a report was saved")
    if facts.rounds_done + 1 >= facts.max_rounds:
        return Decision(
            "failed",
            "failed",
            f"the task did not finish within {facts.max_rounds} rounds",
            "round_limit",
        )
    if facts.report_outcome is None:
        return Decision("queued", "continue", "the round saved no report")
    if facts.report_outcome == "waiting":
        return Decision("queued", "continue", "the report declared waiting, but nothing is awaited")
    if facts.report_outcome == "continue" and nodes and all(n["status"] in _DONE for n in nodes):
        return Decision("queued", "continue", "the report declared continue")
    return Decision("queued", "continue", "plan nodes remain open")


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
