"""A turn's calls made ready before anything runs, and the order they run in.

Each call the model made is checked at the host boundary before any of them runs (`prepare`):
its tool found by its exact name (a near miss is told the name it may have meant), its
arguments validated and normalised by the tool's model, a read-only caller (a sub-agent) kept
to reads, a configured secret the model copied into a write's arguments masked, and a receipted
write given its digest and identity (invariants 13 and 14). What fails is answered at once and
runs nothing. The reads the context window has no room for are then answered `no_room`
(`leave_for_later`, `agent.turn_room`), and the rest run in phases (`phases`): the look-ups
first, then the calls without a later place, a proposal after them and the report last.
The host (`agent.host`) runs what this module leaves.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from pydantic import ValidationError

from orchestrator.agent.sensitive import hide_configured
from orchestrator.agent.tool_names import closest
from orchestrator.agent.transcript import is_sensitive
from orchestrator.agent.turn_room import TURN_FIT, Planned, in_fit_order
from orchestrator.domain.fingerprints import (
    NonCanonical,
    canonical_json,
    fingerprint,
    identity_key,
    refuse_non_finite,
)
from orchestrator.errors import OrchestratorError
from orchestrator.logs import Secret
from orchestrator.tools.base import Effect, Tool, ToolCall, ToolContext, ToolResult

__all__ = [
    "Prepared",
    "leave_for_later",
    "phases",
    "prepare",
    "reused_id",
]

log = logging.getLogger(__name__)

#: The effects whose arguments are kept (the orchestrator's store, the business backend).
_WRITES = frozenset({"write", "internal_write"})


@dataclass(frozen=True)
class Prepared:
    """A call that passed validation: what runs, and (for writes) its receipt identity."""

    call: ToolCall
    tool: Tool
    args: Any
    effect: Effect
    digest: str | None = None
    identity: str | None = None
    #: A configured secret was masked in the arguments (`MASKED_NOTE`).
    masked: bool = False
    #: A look-up the context window had no room for (`agent.turn_room`): its answer when its
    #: own takes more room (`TurnFit.held`), and what says so (`TurnFit.shown`).
    held: ToolResult | None = None
    shown: Callable[[ToolResult], bool] | None = None

    @property
    def unit_key(self) -> tuple[str, ...]:
        # Identical writes of one turn share one unit (and one receipt); every other call is
        # its own unit, keyed by its position so two reads with one id still both run.
        if self.identity is not None and self.digest is not None:
            return ("write", self.identity, self.digest)
        return ("call", str(id(self)))


def prepare(
    ctx: ToolContext,
    call: ToolCall,
    *,
    tools: Mapping[str, Tool],
    secrets: Sequence[Secret],
    receipts: bool,
) -> Prepared | ToolResult:
    """`call` made ready to run, or the result that refuses it (nothing run): the tool found by
    its exact name, the arguments validated, a read-only caller kept to reads, a configured
    secret masked in a write's arguments, a receipted write's digest and identity. `receipts`:
    the host has a receipt ledger (a receipted write needs one)."""
    tool = tools.get(call.name)
    if tool is None:
        # A model may write a name in another case, with a hyphen or with "()": say which
        # one it meant and run nothing (it corrects the name in its next turn).
        alike = [name for name in tools if _loose(name) == _loose(call.name)]
        hint = f"; tool names are exact: did you mean {alike[0]!r}?" if alike else ""
        near = closest(call.name, tools)
        if not alike and near:
            # Not one tool by an exact rule (`tool_names`): the names it may have meant.
            hint = "; the closest tool names: " + ", ".join(repr(name) for name in near)
        return ToolResult.failed(
            f"unknown tool {call.name!r}; nothing was run{hint}", code="unknown_tool"
        )
    args = _validated(tool, call.arguments)
    if isinstance(args, ToolResult):
        return args
    effect = tool.effect_for(args)
    if ctx.readonly and (
        effect != "read" or tool.read_uses() is None or is_sensitive(tool, call.arguments)
    ):
        # Seed 000: sub-agents are read-only at the host boundary, on every call, whatever
        # identity they inherit; a sensitive original value is not readable either, whether
        # its operation says `sensitive_read` or is a read marked `x-sensitive`.
        return ToolResult.failed(
            f"{call.name} ({effect}) is not allowed for a read-only sub-agent; nothing was "
            f"run. It may call instead: {_read_uses(tools)}. Put what should be written or "
            "planned in the answer; the main agent decides.",
            code="readonly",
        )
    masked = False
    if effect in _WRITES and secrets:
        hidden = hide_configured(call.arguments, secrets)
        if hidden != call.arguments:
            # Validated again: the tool sees (and its receipt fingerprints) what is kept.
            args = _validated(tool, hidden)
            if isinstance(args, ToolResult):
                return args
            masked = True
    if effect != "write":
        return Prepared(call, tool, args, effect, masked=masked)
    if not receipts:
        return ToolResult.failed(
            "write tools need the receipt ledger, which is not configured; nothing was run",
            code="receipt_unavailable",
        )
    try:
        digest = _digest(args)
    except NonCanonical as exc:
        return ToolResult.failed(
            f"invalid arguments; nothing was run: {exc}", code="invalid_arguments"
        )
    if tool.identity == "intent":
        identity = identity_key("intent", ctx.intent_scope, ctx.round_id, tool.name, digest)
    elif ctx.generation is None:
        identity = identity_key("call", ctx.session_id, call.id)
    else:
        # A call id names a call of one conversation, and an execution's is its generation's:
        # a task's generations share one session, and servers count their ids again in each
        # (Kimi K2's functions.NAME:0, :1, ... over the conversation). Keyed by the session
        # alone, the next generation's call under such an id was refused
        # invocation_conflict, or answered from the last generation's receipt unrun.
        identity = identity_key("call", ctx.session_id, f"g{ctx.generation}", call.id)
    return Prepared(call, tool, args, effect, digest, identity, masked)


def _read_uses(tools: Mapping[str, Tool]) -> str:
    """What a read-only caller may call instead, from the tools' own words."""
    uses = [use for tool in tools.values() if (use := tool.read_uses()) is not None]
    return "; ".join(uses) or "nothing"


def leave_for_later(
    ctx: ToolContext,
    calls: Sequence[ToolCall],
    results: list[ToolResult | None],
    units: dict[tuple[str, ...], list[int]],
    prepared: dict[tuple[str, ...], Prepared],
) -> None:
    """Answer `no_room` the reads of this turn the context window cannot hold beside the
    others (`agent.turn_room`), before anything runs: they are not run, and record nothing.
    A turn of one call is told too: the room of its answer depends on what it is."""
    fit = ctx.extras.get(TURN_FIT)
    if not callable(fit):
        return
    key_of = {index: key for key, indexes in units.items() for index in indexes}
    planned: list[Planned] = []
    reads: list[tuple[str, ...]] = []
    for index, call in enumerate(calls):
        answered = results[index]
        if answered is not None:
            planned.append(Planned(call.id, "answered", answer=answered))
            continue
        unit = prepared[key_of[index]]
        cited = unit.tool.records_evidence(unit.args)
        if unit.effect != "read":
            receipted = unit.effect == "write"
            planned.append(
                Planned(call.id, "write", cited=cited, receipted=receipted, masked=unit.masked)
            )
            continue
        reads.append(key_of[index])
        least = unit.tool.least_shown(unit.args)
        planned.append(
            Planned(
                call.id,
                "read",
                least=least,
                pageable=unit.tool.pageable,
                cited=cited,
                look_up=unit.tool.looks_up(unit.args),
            )
        )
    turn = fit(planned)
    if turn is None or not reads or len(calls) < 2:
        return
    reads = in_fit_order(reads, lambda key: prepared[key].tool.looks_up(prepared[key].args))
    left = 0
    for key, answer in zip(reads[turn.runs :], turn.answers, strict=True):
        unit = prepared[key]
        if unit.tool.looks_up(unit.args) and turn.shown is not None:
            # Run all the same: shown if it takes no more room than `answer` (`_run_unit`).
            prepared[key] = replace(unit, held=answer, shown=partial(turn.shown, answer))
            continue
        left += 1
        for index in units.pop(key):
            results[index] = answer
        del prepared[key]
    if left:
        log.info(
            "%d of the turn's %d calls left for a later turn: the context window holds no more",
            left,
            len(calls),
        )


#: The calls of a turn that wait for the others: a proposal needs its node in a saved plan, and
#: the report comes last (invariant 10). A model often sends them in one reply, in any order.
_LATER = {"propose_action": 1, "save_report": 2}


def phases(
    units: dict[tuple[str, ...], list[int]], prepared: dict[tuple[str, ...], Prepared]
) -> list[list[tuple[str, ...]]]:
    """The units of a turn in the order they may run: each list after the previous returned,
    the units of one list concurrently; the look-ups (`Tool.looks_up`: quick, their answers
    mostly small) first, so that the calls after them fit their results to the room those
    answers leave (`turn_room.TURN_ANSWERED`), then the calls without a later place,
    together."""
    phases: dict[int, list[tuple[str, ...]]] = {}
    for key in units:
        unit = prepared[key]
        first = unit.effect == "read" and unit.tool.looks_up(unit.args)
        rank = -1 if first else _LATER.get(unit.tool.name, 0)
        phases.setdefault(rank, []).append(key)
    return [phases[rank] for rank in sorted(phases)]


def _validated(tool: Tool, arguments: dict[str, Any]) -> Any:
    """The tool's arguments validated and normalised, or the `invalid_arguments` result."""
    try:
        return tool.normalize(tool.arguments.model_validate(arguments))
    except ValidationError as exc:
        return ToolResult.failed(
            "invalid arguments; nothing was run: " + _validation_text(exc),
            code="invalid_arguments",
        )
    except OrchestratorError as exc:
        return ToolResult.failed(
            f"invalid arguments; nothing was run: {exc.message}", code="invalid_arguments"
        )


def _loose(name: str) -> str:
    """A tool name as a model may misspell it: case, hyphens, spaces and "()" aside."""
    return name.strip().removesuffix("()").strip().replace("-", "_").lower()


def _digest(args: Any) -> str:
    """The receipt digest of validated arguments."""
    # Validated and normalised arguments: pydantic filled defaults and coerced types first.
    refuse_non_finite(args.model_dump(mode="python"))
    return fingerprint(args.model_dump(mode="json"))


def reused_id(seen: dict[str, str], call: ToolCall) -> bool:
    """True when `call.id` already came with another tool or other arguments in this round."""
    try:
        signature = call.name + "\x1f" + canonical_json(call.arguments)
    except NonCanonical:
        signature = call.name + "\x1f" + repr(call.arguments)
    first = seen.setdefault(call.id, signature)
    return first != signature


def _validation_text(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors(include_url=False, include_input=False)[:10]:
        location = ".".join(str(part) for part in error["loc"]) or "(arguments)"
        parts.append(f"{location}: {error['msg']}")
    return "; ".join(parts)
