"""A model that repeats a refused call: the same refusal, turn after turn, ends the round.

A model that calls a tool with arguments its schema refuses (or an unknown tool, or a call the
host's rules refuse) and, shown why, sends the same again gets the same answer every turn: the
round spent ORCH_MAX_TURNS turns on it and ended "the turn budget of the round ran out", and the
task did the same in each of its ORCH_MAX_ROUNDS rounds before it failed `round_limit`. The same
refusals `SAME_FAILURE_LIMIT` turns in a row (every call of each turn refused, with the same
answers in the same order) end the round `model_error`, naming the refusal.

A model that makes progress is not stopped: a turn with any call that was not refused (one that
ran, even if it failed for a reason outside the model: a source down, a time limit), or with
another refusal (a different message, another tool), starts the count again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

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
    """Counts the turns in a row whose calls were all refused the same way."""

    def __init__(self, limit: int = SAME_FAILURE_LIMIT) -> None:
        self.limit = limit
        self._last: tuple[tuple[str, str, str], ...] | None = None
        self._count = 0

    def observe(self, calls: Sequence[ToolCall], results: Sequence[ToolResult]) -> str | None:
        """Take one turn's calls and results; why the round ends, once the same refusals came
        `limit` turns in a row, else None."""
        refusals = _refusals(calls, results)
        if refusals is None:
            self._last, self._count = None, 0
            return None
        self._count = self._count + 1 if refusals == self._last else 1
        self._last = refusals
        if self._count < self.limit:
            return None
        name, code, message = refusals[0]
        if len(message) > _MESSAGE_CHARS:
            message = message[:_MESSAGE_CHARS] + "..."
        more = f" (and {len(refusals) - 1} more call(s) of the turn)" if len(refusals) > 1 else ""
        return (
            f"the model made the same refused call {self._count} turns in a row, shown why each "
            f"time: {name}: {code}: {message}{more}; it does not correct it, so it is not asked "
            "again for the rest of its turns (ORCH_MAX_TURNS)"
        )


def _refusals(
    calls: Sequence[ToolCall], results: Sequence[ToolResult]
) -> tuple[tuple[str, str, str], ...] | None:
    """(tool, code, message) of each call, when every call of the turn was refused; else None."""
    refused = []
    for call, result in zip(calls, results, strict=True):
        if result.status != "failed" or result.code is None or result.code in _NOT_THE_CALL:
            return None
        refused.append((call.name, result.code, result.message or ""))
    return tuple(refused) or None
