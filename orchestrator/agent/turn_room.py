"""How many calls of one turn a small context window holds, and what the others are answered.

Every result of a turn is shown in the next request beside the others, and each needs room of
its own however little it shows: the tool message and the host's evidence record around it
(for a call that records evidence, `Tool.records_evidence` of its arguments: a receipt's status,
a tool search or a query of an undeclared source shows none, and its answer is as small as the
record alone), and what the tool shows at its
smallest (a data source's: none of its rows, and why; `Tool.least_shown`). In
a local 4k model's window the task tools' definitions leave room for one or two such results:
three queries in one turn overflowed the next request and the round failed `context_overflow`.

Before a turn's calls run, the host tells the request builder what each call is (`TURN_FIT`, set
by the builder from the window; for a turn of one call too: a write's answer carries its
receipt's id and the host's message, which its room counts) and asks how many of its reads the
next request holds at their smallest. The reads after those, in call order but the look-ups last
(`in_fit_order`), are not run: each is answered `no_room` (`no_room`), saying how many of the
turn's calls the window holds and to make the rest in later turns. When the window has no room
for each to say so (about 82 tokens: a day's query, a pressure query and two look-ups in 4,096
tokens), the first left says it and the others say in fewer words (about 61) that they did not
run and to make them in a later turn, with fewer calls (`SHORT_NO_ROOM`). Not run, they leave no
evidence record: the host's records are exactly what the model was shown (invariant 12). Writes
always run (leaving one out would be a decision the model did not make); when the writes alone
do not fit, or the first read fits neither beside the others' answers nor in a turn of its own,
every call runs as before, and the next request fails `context_overflow` with a line naming the
settings and the turn's calls. A first read that fits a turn of its own waits with the others
(three queries and two look-ups in 4,096 tokens): none of the turn's calls fit together.

A look-up (`Tool.looks_up`: a receipt's status, a query of an undeclared source, refused at
once) left for a later turn runs all the same: it is quick, changes nothing and records nothing,
and its answer often takes less room than `no_room` (51 tokens against about 82, or 61 in fewer
words). It is shown when it takes no more room than its `no_room` answer would (which the turn's
fit counted), else that answer is given, saying it was not shown.

The room a result may take is what the request leaves, shared equally by the turn's calls but
for those whose answers are known first, which take what their answers take: a refusal, a read
left (its `no_room`), and a look-up, which runs before the turn's other calls and whose answer
the host hands the builder (`TURN_ANSWERED`). Beside two look-ups (about 51 tokens each) a day's
query in a 4,096-token window was given a third of the room and showed no row; it now has what
they leave, and shows 3 (beside an undeclared source's query, 4 where it showed 1).

`no_room` is the model's doing (`agent.repeats`): a model that sends the same calls in the
same order every turn never has the later ones run, and is stopped as a repeated refusal; one
that makes the rest in later turns makes progress, and is not.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, Literal, TypeVar

from orchestrator.tools.base import ToolResult

__all__ = [
    "NO_ROOM",
    "SHORT_NO_ROOM",
    "TURN_ANSWERED",
    "TURN_FIT",
    "Planned",
    "TurnFit",
    "in_fit_order",
    "no_room",
]

T = TypeVar("T")

#: The key of `ToolContext.extras` holding `fit(planned) -> TurnFit | None` (the request
#: builder's, from the context window). Unset: every call runs.
TURN_FIT: Final = "turn_fit"
#: The key of `ToolContext.extras` holding `answered(call_id, result)` (the request builder's):
#: the host tells it the answers of a turn's calls that ran before the others (a look-up), whose
#: results are then fitted to the room those answers leave, not to an equal share.
TURN_ANSWERED: Final = "turn_answered"
#: The code of a call left for a later turn.
NO_ROOM: Final = "no_room"
#: What a read left after the first one left is told when the window has no room for each to
#: be told in full (`no_room(..., short=True)`): the first says how many calls a turn holds.
SHORT_NO_ROOM: Final = "no room in this turn; make it again in a later turn, with fewer calls"


@dataclass(frozen=True)
class Planned:
    """One call of a turn as the host is about to answer it."""

    call_id: str
    #: `read`: may be left for a later turn; `write`: always runs; `answered`: refused before
    #: anything ran (`answer`).
    kind: Literal["read", "write", "answered"]
    answer: ToolResult | None = None
    #: The JSON text of the smallest payload its answer is shown with (`Tool.least_shown`),
    #: if the tool knows it.
    least: str | None = None
    #: A large answer becomes a preview (its keys and the least text worth showing are its
    #: least, `result_room._LEAST_PREVIEW`).
    pageable: bool = True
    #: Its answer may carry the host's evidence record (`Tool.records_evidence`).
    cited: bool = True
    #: A write behind a receipt (`agent.receipted`): its answer carries the receipt's id and
    #: the host's message.
    receipted: bool = False
    #: A write whose arguments held a configured secret: its answer says so (`host.MASKED_NOTE`).
    masked: bool = False
    #: A look-up (`Tool.looks_up`): left for a later turn, it runs all the same.
    look_up: bool = False


@dataclass(frozen=True)
class TurnFit:
    """The reads that run (the first `runs` in `in_fit_order`) and the answers of the others."""

    runs: int
    #: The answer of each read left, in `in_fit_order`: `no_room`; a look-up's says it ran but is
    #: not shown (`no_room(..., ran=True)`), and is given when its own answer takes more room.
    answers: tuple[ToolResult, ...]
    #: `shown(held, result)`: whether a left look-up's `result` takes no more room than its
    #: answer `held`; None when no look-up is left.
    shown: Callable[[ToolResult, ToolResult], bool] | None = None


def in_fit_order(reads: Sequence[T], look_up: Callable[[T], bool]) -> list[T]:
    """A turn's reads in the order the window holds them, the first `TurnFit.runs` running:
    in call order, but the look-ups last. A look-up left runs all the same; made first, it
    took the place of a read that does not (a data source's query) and that read waited."""
    return sorted(reads, key=look_up)


def no_room(
    calls: int, held: int, window: int, *, ran: bool = False, short: bool = False
) -> ToolResult:
    """The answer of a read left for a later turn: `held` of the turn's `calls` calls fit a
    window of `window` tokens (none: not even the first read beside the others' answers, though
    it fits a turn of its own); `ran`: a look-up that ran, its answer not shown; `short`: a
    read left after the first one left, whose answer says it in fewer words (`SHORT_NO_ROOM`).
    The same words for the same turn (a repeated turn compares equal, `agent.repeats`)."""
    said = "not shown" if ran else "not run"
    if short:
        return ToolResult.failed(f"{said}: {SHORT_NO_ROOM}", code=NO_ROOM)
    if not held:
        # Not even the first read beside the others' answers, though it fits a turn of its own.
        return ToolResult.failed(
            f"{said}: the context window ({window} tokens) holds the results of none of this "
            f"turn's {calls} calls together; make this call again in a later turn, at most 1 "
            "call a turn",
            code=NO_ROOM,
        )
    most = f"at most {held} call{'s' if held != 1 else ''} a turn"
    return ToolResult.failed(
        f"{said}: the context window ({window} tokens) holds the "
        f"results of {held} of this turn's {calls} calls; make this call again in a later "
        f"turn, {most}",
        code=NO_ROOM,
    )
