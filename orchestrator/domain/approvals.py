"""What an approval is bound to (DESIGN invariant 24): the action's digest and its plan node.

The digest is the SHA-256 of the canonical JSON of `{"kind", "payload"}`: the person approving
names it, so an approval can only carry forward exactly what was shown to them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from orchestrator.domain.fingerprints import fingerprint

__all__ = ["action_digest", "still_bound"]

#: A node in one of these statuses no longer waits for its action: skipped or cancelled (it no
#: longer applies), failed (never reopened: a retry is a new node, with its own action), or
#: completed while the action was pending, which only a person can do (the agent completes an
#: action's node after its approval): the step was done without the order. An approval of
#: its action would send work the plan holds nobody to, or send it a second time.
_GONE = frozenset({"skipped", "cancelled", "failed", "completed"})


def action_digest(kind: str, payload: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of the action's kind and canonical payload."""
    return fingerprint({"kind": kind, "payload": dict(payload)})


def still_bound(
    action_id: str, node_id: str, plan_nodes: Sequence[Mapping[str, Any]] | None
) -> bool:
    """Whether the latest plan of the action's session still serves it: its node names the
    action and was not skipped, cancelled, failed or completed since."""
    for node in plan_nodes or ():
        if node.get("id") == node_id:
            return node.get("action_id") == action_id and node.get("status") not in _GONE
    return False
