"""A model that repeats a refused call: the same refusal, turn after turn, ends the round.

A model that calls a tool with arguments its schema refuses (or an unknown tool, or a call the
host's rules refuse) and, shown why, sends the same again gets the same answer every turn: the
round spent ORCH_MAX_TURNS turns on it and ended "the turn budget of the round ran out", and the
task did the same in each of its ORCH_MAX_ROUNDS rounds before it failed `round_limit`. The same
turn `SAME_FAILURE_LIMIT` times in a row (the same refusals, in the same order) ends the round
`model_error`, naming the refusal.

A model that makes progress is not stopped: a turn with no refusal, with a failure outside the
model's call (a source down, a time limit: the same call may work later), with another refusal
(a different message, another tool), or with another call that ran (other arguments), starts
the count again. A call that ran with the same arguments as in the turn before (the task's
context read again before the same refused report) does not: the turn is the same again.

A read left for a later turn because the context window holds no more of the turn's results
(`no_room`, `agent.turn_room`) is the model's doing: it counts as a refusal. A model that sends
the same calls in the same order every turn never has the later ones run (the first runs, and
is the same call again), and is stopped; one that makes the rest in later turns runs a call it
had not run each turn, which starts the count again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from orchestrator.domain.fingerprints import NonCanonical, canonical_json
from orchestrator.tools.base import ToolCall, ToolResult

__all__ = ["SAME_FAILURE_LIMIT", "RepeatedRefusals"]

#: Turns in a row with the same refusals that end the round: the first, then two more after the
#: model was shown why (a model that can correct a call does so at once or at the next turn).
SAME_FAILURE_LIMIT: Final = 3
#: Failures that say something outside the model's call failed (a tool, a source, the store, a
#: sub-agent's model, an earlier write): the same call may succeed later, and the model is not
#: at fault for asking again.
_NOT_THE_CALL: Final = frozenset(
    {
        "tool_error",
        "tool_timeout",
        "source_error",
        "source_timeout",
        "record_failed",
        "receipt_unavailable",
        "subagent_unavailable",
        "model_error",
        "not_started",
        "already_claimed",
        "verify_first",
        "verified",
    }
)
#: The most of a refusal's message the round's reason repeats.
_MESSAGE_CHARS: Final = 300


class RepeatedRefusals:
    """Counts the turns in a row that were the same turn again, refused the same way."""

    def __init__(self, limit: int = SAME_FAILURE_LIMIT) -> None:
        self.limit = limit
        self._last: _Turn | None = None
        self._count = 0

    def observe(self, calls: Sequence[ToolCall], results: Sequence[ToolResult]) -> str | None:
        """Take one turn's calls and results; why the round ends, once the same refusals came
        `limit` turns in a row, else None."""
        turn = _turn(calls, results)
        if turn is None:
            self._last, self._count = None, 0
            return None
        self._count = self._count + 1 if turn == self._last else 1
        self._last = turn
        if self._count < self.limit:
            return None
        refusals = turn[0]
        name, code, message = refusals[0]
        if len(message) > _MESSAGE_CHARS:
            message = message[:_MESSAGE_CHARS] + "..."
        more = f" (and {len(refusals) - 1} more refused call(s))" if len(refusals) > 1 else ""
        return (
            f"the model made the same refused call {self._count} turns in a row, shown why each "
            f"time: {name}: {code}: {message}{more}; it does not correct it, so it is not asked "
            "again for the rest of its turns (ORCH_MAX_TURNS)"
        )


#: A turn as compared: (tool, code, message) of each refused call, then (tool, arguments) of
#: each other call.
_Turn = tuple[tuple[tuple[str, str, str], ...], tuple[tuple[str, str], ...]]


def _turn(calls: Sequence[ToolCall], results: Sequence[ToolResult]) -> _Turn | None:
    """What makes a turn the same again, or None when it refused nothing of what the model
    wrote. Besides its refusals, the calls that ran count by what the model sent (a read of the
    task's context before the same refused report, every turn, is the same turn again), not by
    their answers, which carry a new evidence id and time each time."""
    refused: list[tuple[str, str, str]] = []
    others: list[tuple[str, str]] = []
    for call, result in zip(calls, results, strict=True):
        if result.status == "failed" and result.code is not None:
            if result.code in _NOT_THE_CALL:
                return None  # something outside the call failed: it may not fail again
            refused.append((call.name, result.code, result.message or ""))
        else:
            try:
                sent = canonical_json(call.arguments)
            except NonCanonical:
                sent = repr(call.arguments)
            others.append((call.name, sent))
    return (tuple(refused), tuple(others)) if refused else None
