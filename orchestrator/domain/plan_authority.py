"""Who may change what in a plan (seed 004, DESIGN invariants 6, 10 and 22).

Pure rules against the previous revision, beside the structural ones of `domain.plans`:

- a node's `actor` never changes (`actor_changed`), for every writer;
- a human node is completed, failed or skipped only by a person: an agent publish that puts one
  in those statuses (a new node, or a status change) is refused (`human_node`), and so is one
  that changes what a person closed: its status (to `cancelled`, say), or its closing fields
  (the reason that says who closed it and when, the evidence); keeping them is not a change;
- the action id written back to a node is never dropped or replaced (`action_id_removed`),
  except by the id of a new proposal replacing a superseded action;
- a node names only an action of its own task proposed for that node (`unknown_action`):
  another task's action, another node's (a person approved phoning the customer, not shutting
  the valve) or an id nobody proposed would let the node escape the approval check below;
- a node whose action is still pending approval, or was rejected or superseded, cannot be
  completed by the agent (`action_not_approved`);
- a node whose action is pending approval or approved keeps its title and description
  (`action_node_changed`): the approval is bound to the revision it was proposed under, and a
  node renamed after it ("phone the customer" becoming "shut valve V-12") would show the
  approval under work nobody approved. Once the action is rejected or superseded, it binds
  nothing and the node may change again.

The person's route (the human-loop issue) publishes with `writer="person"`, which lifts only the
two agent rules (`human_node`, `action_not_approved`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal

from orchestrator.domain.plan_fields import ID_PATTERN, MAX_ID, Problem, problem

__all__ = [
    "AUTHORITY_CODES",
    "HUMAN_CLOSED",
    "Writer",
    "authority_problems",
    "citation_problems",
    "cited_ids",
]

Writer = Literal["agent", "person"]

#: The statuses only a person sets on a human node.
HUMAN_CLOSED: Final = frozenset({"completed", "failed", "skipped"})
#: What a person's closing wrote on a human node, besides its status: who and when (in the
#: reason), and what it rests on. The agent's copy must carry them unchanged.
_CLOSING_FIELDS: Final = ("reason", "evidence", "evidence_ids")

#: The action statuses that bind a node's text: a person is deciding on it, or approved it.
_BINDING: Final = frozenset({"pending_approval", "approved"})

#: Said to an agent that tries to change a person's failed step: the way on.
_RETRY_HUMAN: Final = (
    "; to retry the step, add a new human node with an edge from it, which a person closes"
)

AUTHORITY_CODES: Final = (
    "human_node",
    "actor_changed",
    "action_id_removed",
    "action_node_changed",
    "action_not_approved",
    "unknown_action",
    "citation_required",
    "unknown_evidence",
    "write_pending",
    "write_not_succeeded",
)


def authority_problems(
    nodes: Sequence[Any],
    previous: Sequence[Mapping[str, Any]] | None,
    *,
    writer: Writer = "agent",
    action_statuses: Mapping[str, str] | None = None,
    action_nodes: Mapping[str, str] | None = None,
) -> list[Problem]:
    """Every authority problem of `nodes` against `previous` (None or [] for a first plan).

    `nodes` may be the raw input of a refused publish: only objects with a string id count.
    `action_statuses` maps the action ids the nodes (new and previous) name to their status,
    among the actions of the plan's task only (none for a session of no task); `action_nodes`
    maps them to the node each was proposed for (None: not checked).
    """
    before = {str(n["id"]): n for n in previous or () if isinstance(n, Mapping)}
    statuses = action_statuses or {}
    proposed_for = action_nodes or {}
    found: list[Problem] = []
    for node in nodes:
        if not isinstance(node, Mapping) or not isinstance(node.get("id"), str):
            continue
        node_id: str = node["id"]
        old = before.get(node_id)
        status = node.get("status")
        if old is not None and node.get("actor") != old.get("actor"):
            found.append(
                problem(
                    "actor_changed",
                    f"node {node_id!r} was {old.get('actor')!r}; a node's actor never changes "
                    "(add a new node instead)",
                    node_id=node_id,
                )
            )
        old_action, new_action = (old or {}).get("action_id"), node.get("action_id")
        # A superseded action (its generation ended) is replaced by a new proposal's id.
        replaced = statuses.get(str(old_action)) == "superseded" and str(new_action) in statuses
        if old_action and new_action != old_action and not replaced:
            found.append(
                problem(
                    "action_id_removed",
                    f"node {node_id!r} carries action {old_action}; keep its action_id",
                    node_id=node_id,
                )
            )
        if _an_id(new_action) and new_action != old_action and new_action not in statuses:
            found.append(
                problem(
                    "unknown_action",
                    f"node {node_id!r} names action {new_action}, which is not an action of "
                    "the plan's task: the server writes back the id of the action proposed "
                    "for the node",
                    node_id=node_id,
                    action_id=new_action,
                )
            )
        elif (
            old is not None
            and old_action
            and new_action == old_action
            and statuses.get(str(old_action)) in _BINDING
            and _text(node) != _text(old)
        ):
            found.append(
                problem(
                    "action_node_changed",
                    f"node {node_id!r} carries action {old_action}, which is "
                    f"{statuses[str(old_action)]}: keep its title and description as they were "
                    "when it was proposed (a person decides on them); for other work add a new "
                    "node",
                    node_id=node_id,
                    action_id=old_action,
                )
            )
        elif (
            _an_id(new_action)
            and new_action != old_action
            and (owner := proposed_for.get(str(new_action))) is not None
            and owner != node_id
        ):
            # Only the server writes an action id back, to the node it was proposed for; the
            # same id on another node would pass that node off as approved (or pending) work.
            found.append(
                problem(
                    "unknown_action",
                    f"node {node_id!r} names action {new_action}, which was proposed for node "
                    f"{owner!r}: a node carries only the action proposed for it (propose_action "
                    "for this node writes its id back)",
                    node_id=node_id,
                    action_id=new_action,
                )
            )
        if writer != "agent":
            continue
        human = node.get("actor") == "human" or (old is not None and old.get("actor") == "human")
        unchanged = old is not None and old.get("status") == status
        if human and isinstance(status, str) and status in HUMAN_CLOSED and not unchanged:
            found.append(
                problem(
                    "human_node",
                    f"node {node_id!r} is a human step: only a person marks it {status}; "
                    + (
                        "a person marked it failed" + _RETRY_HUMAN
                        if old is not None and old.get("status") == "failed"
                        else "leave it pending, running or waiting"
                    ),
                    node_id=node_id,
                )
            )
        elif (
            human
            and old is not None
            and old.get("status") in HUMAN_CLOSED
            and (not unchanged or _closing(node) != _closing(old))
        ):
            # A person closed it: re-closing it (cancelled), or rewriting the reason or the
            # evidence under the same status, would overwrite who closed it, when, and on what.
            found.append(
                problem(
                    "human_node",
                    f"node {node_id!r} is a human step a person marked {old.get('status')}; "
                    "keep it as it is (status, reason, evidence and evidence_ids)"
                    + (_RETRY_HUMAN if old.get("status") == "failed" else ""),
                    node_id=node_id,
                )
            )
        action_id = node.get("action_id")
        if status == "completed" and isinstance(action_id, str) and not unchanged:
            action_status = statuses.get(action_id)
            if action_status is not None and action_status != "approved":
                found.append(
                    problem(
                        "action_not_approved",
                        f"node {node_id!r} serves action {action_id}, which is "
                        f"{action_status}: it cannot be completed by the agent",
                        node_id=node_id,
                    )
                )
    return found


def _text(node: Mapping[str, Any]) -> tuple[Any, Any]:
    """What a node says it does: its title and description (no description is "")."""
    return node.get("title"), node.get("description") or ""


def _an_id(value: Any) -> bool:
    return (
        isinstance(value, str) and len(value) <= MAX_ID and ID_PATTERN.fullmatch(value) is not None
    )


def _closing(node: Mapping[str, Any]) -> tuple[Any, ...]:
    """A node's closing fields in their stored form: no reason is None, no evidence is ""."""
    return tuple(node.get(field) or None for field in _CLOSING_FIELDS)


def _newly_completed(
    nodes: Sequence[Any], previous: Sequence[Mapping[str, Any]] | None
) -> list[Mapping[str, Any]]:
    before = {str(n["id"]): n for n in previous or () if isinstance(n, Mapping)}
    found = []
    for node in nodes:
        if not isinstance(node, Mapping) or not isinstance(node.get("id"), str):
            continue
        old = before.get(node["id"])
        done = node.get("status") == "completed" and node.get("actor") == "agent"
        if done and (old is None or old.get("status") != "completed"):
            found.append(node)
    return found


def cited_ids(nodes: Sequence[Any], previous: Sequence[Mapping[str, Any]] | None) -> list[str]:
    """The ids the agent nodes completed by this revision cite (to look up)."""
    ids: list[str] = []
    for node in _newly_completed(nodes, previous):
        cited = node.get("evidence_ids")
        if isinstance(cited, list):
            ids.extend(i for i in cited if isinstance(i, str))
    return list(dict.fromkeys(ids))


def citation_problems(
    nodes: Sequence[Any],
    previous: Sequence[Mapping[str, Any]] | None,
    *,
    evidence: frozenset[str] | set[str],
    writes: Mapping[str, str],
) -> list[Problem]:
    """An agent node completed by this revision cites host evidence (`evidence`: the task's
    evidence ids) or a `succeeded` write (`writes`: the task's receipts, id -> status). A
    pending write keeps its node open; a failed, unknown or running one backs nothing."""
    found: list[Problem] = []
    for node in _newly_completed(nodes, previous):
        node_id = node["id"]
        cited = node.get("evidence_ids")
        cited = [i for i in cited if isinstance(i, str)] if isinstance(cited, list) else []
        if not cited:
            found.append(
                problem(
                    "citation_required",
                    f"node {node_id!r} is completed: cite in evidence_ids the evidence_id of a "
                    "query or the invocation_id of a succeeded write",
                    node_id=node_id,
                )
            )
            continue
        for cited_id in cited:
            if cited_id in evidence:
                continue
            status = writes.get(cited_id)
            if status is None:
                found.append(
                    problem(
                        "unknown_evidence",
                        f"node {node_id!r} cites {cited_id!r}, which is neither an evidence "
                        "record nor a write of this task",
                        node_id=node_id,
                        evidence_id=cited_id,
                    )
                )
            elif status == "pending":
                found.append(
                    problem(
                        "write_pending",
                        f"node {node_id!r} cites write {cited_id}, which was submitted and is "
                        "not finished: keep the node running or waiting",
                        node_id=node_id,
                        evidence_id=cited_id,
                    )
                )
            elif status != "succeeded":
                found.append(
                    problem(
                        "write_not_succeeded",
                        f"node {node_id!r} cites write {cited_id}, which is {status}: it cannot "
                        "back a completed node",
                        node_id=node_id,
                        evidence_id=cited_id,
                    )
                )
    return found
