"""Human nodes closed by a person (seed 004: 人工采样、复测、回访; DESIGN §8, invariant 22).

Only a person closes a human node, through a server-side plan revision. The agent's writes and
the person's are serialised on the task row; an agent publish that still shows a node as open
which a person closed meanwhile keeps the person's node, so neither write loses the other's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Final

from orchestrator.domain.plan_fields import Problem, problem
from orchestrator.domain.vocabulary import OPEN_NODE_STATUSES
from orchestrator.errors import ConflictError, NotFound, echoed

__all__ = [
    "PERSON_REQUEST_PREFIX",
    "PERSON_STATUSES",
    "close_human_node",
    "is_person_revision",
    "keep_person_closed",
    "reserved_request_id_problems",
]

#: What a person can set a human node to: complete, fail or skip (`--complete`, `--fail`, `--skip`).
PERSON_STATUSES: Final = ("completed", "failed", "skipped")
#: The request id of a person's revision starts with this (the agent's are its own).
PERSON_REQUEST_PREFIX: Final = "human:"


def is_person_revision(request_id: str | None) -> bool:
    """Whether a plan revision with this request id was a person closing a human node."""
    return request_id is not None and request_id.startswith(PERSON_REQUEST_PREFIX)


def reserved_request_id_problems(request_id: Any) -> list[Problem]:
    """`reserved_request_id` when a publish's request id passes for a person's revision (the
    end of a round reads it: `is_person_revision`); [] otherwise."""
    if not isinstance(request_id, str) or not is_person_revision(request_id):
        return []
    return [
        problem(
            "reserved_request_id",
            f"request_id may not start with {PERSON_REQUEST_PREFIX!r}: a person's revisions "
            "carry it",
            field="request_id",
        )
    ]


def close_human_node(
    nodes: Sequence[Mapping[str, Any]],
    node_id: str,
    status: str,
    *,
    by: str,
    at: datetime,
    evidence: str | None = None,
    reason: str | None = None,
) -> list[dict[str, Any]]:
    """The plan's nodes with `node_id` closed by `by` at `at`; who and when go in its reason.

    Raises `NotFound` (`unknown_node`) or `ConflictError` (`agent_node`, `node_closed`).
    """
    if status not in PERSON_STATUSES:
        raise ValueError(f"a person sets a human node to one of {PERSON_STATUSES}, not {status}")
    found = next((n for n in nodes if n.get("id") == node_id), None)
    if found is None:
        raise NotFound(
            f"node {echoed(node_id)!r} is not in the task's current plan", code="unknown_node"
        )
    if found.get("actor") != "human":
        raise ConflictError(
            f"node {node_id!r} is an agent node: only the agent reports it", code="agent_node"
        )
    # A status that could not be read (None: `domain.plans.readable_nodes`) is open: the end of
    # a round waits for its person, who must be able to close it.
    if found.get("status") is not None and found.get("status") not in OPEN_NODE_STATUSES:
        raise ConflictError(_closed_message(node_id, found), code="node_closed")
    stamp = f"{status} by {by} at {at.isoformat(timespec='seconds')}"
    closed = dict(found, status=status, reason=f"{reason} ({stamp})" if reason else stamp)
    if status == "completed":
        closed["evidence"] = evidence or ""
    return [closed if n.get("id") == node_id else dict(n) for n in nodes]


def _closed_message(node_id: str, found: Mapping[str, Any]) -> str:
    """Why a closed node cannot be closed again: its status and reason, which name who closed
    it and when (a second person acting on the step learns that someone did, and who)."""
    status = found.get("status")
    reason = found.get("reason")
    if status not in PERSON_STATUSES:
        # Only the agent closes a human node otherwise (cancelled), and its reason is the
        # model's text: said as such, never read as a person's stamp.
        said = f" (its reason: {reason})" if isinstance(reason, str) and reason else ""
        return f"node {node_id!r} is already {status}, by the agent{said}"
    if not isinstance(reason, str) or not reason:
        return f"node {node_id!r} is already {status}"
    if reason.startswith(f"{status} by "):  # a person's completion: the stamp alone
        return f"node {node_id!r} is already {status} ({reason})"
    return f"node {node_id!r} is already {status}: {reason}"


def keep_person_closed(
    nodes: Sequence[dict[str, Any]], previous: Sequence[Mapping[str, Any]] | None
) -> list[dict[str, Any]]:
    """An agent's nodes, with every human node a person closed in `previous` kept as closed
    where the agent still shows it open (it read the plan before the person wrote)."""
    closed = {
        n["id"]: n
        for n in previous or ()
        if n.get("actor") == "human" and n.get("status") in PERSON_STATUSES
    }
    if not closed:
        return list(nodes)
    return [
        dict(closed[n["id"]])
        if n.get("id") in closed
        and n.get("actor") == "human"
        and n.get("status") in OPEN_NODE_STATUSES
        else n
        for n in nodes
    ]
