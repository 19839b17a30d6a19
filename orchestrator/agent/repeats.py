"""A model that repeats refused calls with nothing new run in between ends the round.

A model that calls a tool with arguments its schema refuses (or an unknown tool, or a call the
host's rules refuse) and, shown why, sends the same again gets the same answer every turn: the
round spent ORCH_MAX_TURNS turns on it and ended "the turn budget of the round ran out", and the
task did the same in each of its ORCH_MAX_ROUNDS rounds before it failed `round_limit`. The same
turn `SAME_FAILURE_LIMIT` times in a row (the same refusals, in the same order) ends the round
`model_error`, naming the refusal.

A model that alternates between refused calls (A, B, A, B, ...) or cycles among a few makes no
turn the same as the one before, and was not stopped at all. So the count is kept per refusal
(tool, code and message) over the turns since the model last made progress: a turn whose every
refusal has come `SAME_FAILURE_LIMIT` times in those turns ends the round `model_error` too,
naming each refusal that came more than once (A, B, A, B, A ends at the fifth turn; a cycle of
three at the seventh). A turn with a refusal not seen since then does not end it: the model is
trying something else.

A model that makes progress is not stopped: a turn with no refusal, or with a failure outside
the model's call (a source down, a time limit: the same call may work later), starts every
count again, and so does a turn with a call that ran with arguments no call of the tool ran
with before in this round (another point queried, a plan published anew). A call that ran with
the same arguments as before does not (the task's context read again before the same refused
report, or a cycle of reads each made before): the model learns nothing new from it.

A read left for a later turn because the context window holds no more of the turn's results
(`no_room`, `agent.turn_room`) is the model's doing: it counts as a refusal. A model that sends
the same calls in the same order every turn never has the later ones run (the first runs, and
is the same call again), and is stopped; one that makes the rest in later turns runs a call it
had not run each turn, which starts the count again.

Across rounds, a round that ends on the same empty answer as the rounds before it, saving no
report, is stuck only if it made the same calls as they did (`calls_made`, from the rounds'
transcripts): the next would be asked the same and do the same. A round that read something
new or published another plan made progress, and the task goes on (to ORCH_MAX_ROUNDS).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Final

from orchestrator.domain.fingerprints import NonCanonical, canonical_json
from orchestrator.store.transcripts import Entry
from orchestrator.tools.base import ToolCall, ToolResult

__all__ = ["SAME_FAILURE_LIMIT", "RepeatedRefusals", "calls_made"]

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
    """Counts, per refusal, the turns since the model last made progress that brought it, and
    the turns in a row that were the same turn again."""

    def __init__(self, limit: int = SAME_FAILURE_LIMIT) -> None:
        self.limit = limit
        self._last: _Turn | None = None
        self._count = 0
        #: Every call of the round that ran, as the model sent it.
        self._ran: set[tuple[str, str]] = set()
        #: The turns that brought each refusal since the last progress, in the order first seen.
        self._since: dict[_Refusal, int] = {}
        #: The turns since the last progress.
        self._turns = 0

    def observe(self, calls: Sequence[ToolCall], results: Sequence[ToolResult]) -> str | None:
        """Take one turn's calls and results; why the round ends, once the same refusals came
        `limit` turns in a row or, in any order, `limit` turns each since the last progress,
        else None."""
        refused, ran, outside = _parts(calls, results)
        new = not ran <= self._ran
        self._ran |= ran
        if outside or not refused:
            self._last, self._count = None, 0
            self._since, self._turns = {}, 0
            return None
        if new:
            self._since, self._turns = {}, 0
        turn: _Turn = (tuple(refused), tuple(sorted(ran)))
        self._count = self._count + 1 if turn == self._last else 1
        self._last = turn
        self._turns += 1
        for refusal in dict.fromkeys(refused):
            self._since[refusal] = self._since.get(refusal, 0) + 1
        if self._count >= self.limit:
            return self._in_a_row(refused)
        if all(self._since[refusal] >= self.limit for refusal in refused):
            return self._in_turn()
        return None

    def _in_a_row(self, refused: list[_Refusal]) -> str:
        more = f" (and {len(refused) - 1} more refused call(s))" if len(refused) > 1 else ""
        return (
            f"the model made the same refused call {self._count} turns in a row, shown why each "
            f"time: {_said(refused[0])}{more}; it does not correct it, so it is not asked "
            "again for the rest of its turns (ORCH_MAX_TURNS)"
        )

    def _in_turn(self) -> str:
        """Why the round ends on refusals that came in turn: each that came more than once."""
        named = [refusal for refusal, turns in self._since.items() if turns > 1]
        said = "; ".join(_said(refusal) for refusal in named[:_NAMED])
        if len(named) > _NAMED:
            said += f" (and {len(named) - _NAMED} more refused call(s))"
        if len(named) == 1:
            made = f"the same refused call {self._since[named[0]]} times in {self._turns} turns"
        else:
            made = f"the same {len(named)} refused calls in turn, {self._turns} turns"
        return (
            f"the model made {made} with nothing new run in between, shown why each time: {said}; "
            "it does not correct them, so it is not asked again for the rest of its turns "
            "(ORCH_MAX_TURNS)"
        )


#: A refused call as compared: its tool, the refusal's code and message.
_Refusal = tuple[str, str, str]
#: A turn as compared: its refusals in order, then (tool, arguments) of each other call.
_Turn = tuple[tuple[_Refusal, ...], tuple[tuple[str, str], ...]]
#: The most refusals the reason names.
_NAMED: Final = 3


def _said(refusal: _Refusal) -> str:
    name, code, message = refusal
    if len(message) > _MESSAGE_CHARS:
        message = message[:_MESSAGE_CHARS] + "..."
    return f"{name}: {code}: {message}"


def _parts(
    calls: Sequence[ToolCall], results: Sequence[ToolResult]
) -> tuple[list[_Refusal], set[tuple[str, str]], bool]:
    """A turn's refusals of what the model wrote, its calls that ran (by what the model sent:
    a read of the task's context, every turn, is the same call again; not by their answers,
    which carry a new evidence id and time each time), and whether something outside a call
    failed (it may not fail again)."""
    refused: list[_Refusal] = []
    ran: set[tuple[str, str]] = set()
    outside = False
    for call, result in zip(calls, results, strict=True):
        if result.status == "failed" and result.code is not None:
            if result.code in _NOT_THE_CALL:
                outside = True
            else:
                refused.append((call.name, result.code, result.message or ""))
            continue
        try:
            sent = canonical_json(call.arguments)
        except NonCanonical:
            sent = repr(call.arguments)
        ran.add((call.name, sent))
    return refused, ran, outside


def calls_made(entries: Iterable[Entry]) -> frozenset[tuple[str, str]]:
    """What a round asked of its tools: the (tool, arguments) of every call of its model turns
    (not its sub-agents'), as its transcript keeps them, whatever their order and ids. Two
    rounds that made the same calls did the same work."""
    made: set[tuple[str, str]] = set()
    for entry in entries:
        body = entry.body if entry.kind == "model_turn" else None
        # An older row's body may be of another shape (`tasks transcript` shows it unreadable).
        calls = body.get("tool_calls") if isinstance(body, Mapping) else None
        if entry.parent_call_id is not None or not isinstance(calls, list):
            continue
        for call in calls:
            if not isinstance(call, Mapping):
                continue
            try:
                sent = canonical_json(call.get("arguments"))
            except NonCanonical:
                sent = repr(call.get("arguments"))
            made.add((str(call.get("name")), sent))
    return frozenset(made)
