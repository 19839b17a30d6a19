"""Recovery snapshots (seed 000, 异常和取消后的继续): what a round did, what is unknown.

A round that ends by an exception, a cancel or a lost lease leaves a snapshot: every tool call it
made with the status of the result it received (and the receipt id of a write), the calls that
never got a result marked `unknown`, and its last plan. A worker that died leaves none; the
same snapshot is then built from its durable transcript. The plan it is shown with is the task's
as it stands when it is read (`services.recovery.snapshot_for`): a person may close a human
step of it after the round ended. The next generation reads it first: an
`unknown` call may or may not have taken effect and must be verified read-only before anything
is retried. Pure rules: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

__all__ = ["CallRecord", "Snapshot", "readable_call"]

VERIFY_FIRST = (
    "The previous generation stopped before these calls returned: they may or may not have "
    "taken effect. Verify each one read-only (get_tool_execution with its receipt, or a read of "
    "the state it would change) before retrying anything; never repeat one blindly."
)


@dataclass(frozen=True)
class CallRecord:
    """One tool call of a round and, once received, its result's status and receipt id."""

    call_id: str
    tool: str
    arguments: Any  # already redacted for a sensitive operation
    turn: int
    status: str | None = None  # None: no result received
    invocation_id: str | None = None

    def answered(self, status: str, invocation_id: str | None) -> CallRecord:
        return replace(self, status=status, invocation_id=invocation_id)


@dataclass(frozen=True)
class Snapshot:
    reason: str
    generation: int | None
    received: tuple[dict[str, Any], ...]
    unknown: tuple[dict[str, Any], ...]
    last_plan: dict[str, Any] | None = None

    @classmethod
    def from_calls(
        cls,
        calls: Sequence[CallRecord],
        *,
        reason: str,
        generation: int | None,
        last_plan: dict[str, Any] | None = None,
    ) -> Snapshot:
        received: list[dict[str, Any]] = []
        unknown: list[dict[str, Any]] = []
        for call in calls:
            base = {"call_id": call.call_id, "tool": call.tool, "turn": call.turn}
            if call.status is None or call.status == "unknown":
                unknown.append(
                    {
                        **base,
                        "status": "unknown",
                        "arguments": call.arguments,
                        "invocation_id": call.invocation_id,
                        "why": "no result was received"
                        if call.status is None
                        else "the call's outcome is unknown",
                    }
                )
            else:
                received.append(
                    {**base, "status": call.status, "invocation_id": call.invocation_id}
                )
        return cls(reason, generation, tuple(received), tuple(unknown), last_plan)

    @classmethod
    def from_transcript(
        cls,
        entries: Sequence[dict[str, Any]],
        *,
        reason: str,
        generation: int | None,
        last_plan: dict[str, Any] | None = None,
    ) -> Snapshot:
        """The same snapshot from the durable transcript (`Entry.to_dict()` items, in order).

        Only the main agent's calls count; a sub-agent's (with a `parent_call_id`) are reads.
        A tool call an older version wrote in another shape (no id or name, not an object) is
        kept as it was among the unknown calls: what it did cannot be read, so it is verified.
        """
        calls: dict[str, CallRecord] = {}
        unreadable: list[Any] = []
        for entry in entries:
            if entry.get("parent_call_id") is not None:
                continue
            body = entry.get("body")
            body = body if isinstance(body, dict) else {}
            if entry["kind"] == "model_turn":
                turn_calls = body.get("tool_calls") or []
                for call in turn_calls if isinstance(turn_calls, list) else [turn_calls]:
                    if not readable_call(call):
                        unreadable.append(call)
                        continue
                    calls[call["id"]] = CallRecord(
                        call["id"], call["name"], call.get("arguments"), entry["turn"]
                    )
            elif entry["kind"] == "tool_result" and entry.get("call_id") in calls:
                call_id = entry["call_id"]
                calls[call_id] = calls[call_id].answered(
                    entry.get("status") or body.get("status") or "unknown",
                    body.get("invocation_id"),
                )
        snapshot = cls.from_calls(
            list(calls.values()), reason=reason, generation=generation, last_plan=last_plan
        )
        return replace(snapshot, unknown=snapshot.unknown + tuple(unreadable))

    def to_dict(self) -> dict[str, Any]:
        return {
            "generation": self.generation,
            "reason": self.reason,
            "done": list(self.received),
            "unknown": list(self.unknown),
            "verify_first": VERIFY_FIRST if self.unknown else None,
            "last_plan": self.last_plan,
        }


def readable_call(call: Any) -> bool:
    """A tool call of today's shape: an object with a text id and name."""
    return (
        isinstance(call, dict)
        and isinstance(call.get("id"), str)
        and isinstance(call.get("name"), str)
    )
