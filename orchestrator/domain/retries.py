"""Which node is a retry of which failed node, as the host can show it (seed 004: 重试使用新节点).

A retry of a failed node A is a node X of A's actor, with an edge A -> X, where X first appeared
in the plan at or after the revision in which A was first stored `failed`. The same revision
counts: an agent may fail its own node and draw the new one in one publish, but the failure
must be in what it drew: a node an agent draws after a human node it still saw open, which a
person failed meanwhile (the host keeps the failure: `keep_person_closed`), follows it and
retries nothing, so `services.plans` passes the nodes as drawn. An edge drawn before the
failure is a succession, not a retry: a plan `sample (human) -> retest (human)`
drawn at the start, `sample` failed by a person (the bottle broke), `retest` completed by a
person later, never repeated the sampling, so it releases nothing.

Which revision a node first appeared in is history a single revision does not show. It is
kept with each stored revision instead (`plan_revisions.retries`, `{failed_id: [retry ids]}`)
and computed when a revision is written, from the previous revision alone: a plan never drops
a node (invariant 3), so a node is new exactly when the previous revision does not have it,
and the first plan of a new generation keeps the task's last plan (invariant 22), whose
relation it carries on. Every relation is carried forward, whatever happens to its edge later:
X was drawn as A's retry, and a later publish that leaves the edge out (a model forgets one)
does not undo what a person then did on X.

A revision stored before the relation was kept has none (NULL): it is read by the rule of that
time (`retries_by_edges`: any node of A's actor with an edge from failed A), so nothing stored
changes meaning, and the next revision written over it starts from that reading. A failure
recorded after that is judged by the rule above.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["Retries", "next_retries", "readable_retries", "retries_by_edges", "retries_of"]

#: The failed node's id -> the ids of its retries, in the order they were drawn.
Retries = dict[str, list[str]]


def retries_by_edges(
    nodes: Sequence[Mapping[str, Any]] | None, edges: Sequence[Mapping[str, Any]] | None
) -> Retries:
    """The relation a revision stored without one is read with: every node of a failed node's
    actor with an edge from it (the rule before the relation was kept)."""
    by_id = {str(n["id"]): n for n in nodes or ()}
    found: Retries = {}
    for edge in edges or ():
        source, target = by_id.get(str(edge.get("from"))), by_id.get(str(edge.get("to")))
        if source is None or target is None or source.get("status") != "failed":
            continue
        if target.get("actor") == source.get("actor"):
            _add(found, str(source["id"]), str(target["id"]))
    return found


def retries_of(
    nodes: Sequence[Mapping[str, Any]] | None,
    edges: Sequence[Mapping[str, Any]] | None,
    stored: Mapping[str, Sequence[str]] | None,
) -> Mapping[str, Sequence[str]]:
    """The relation the rules go by for a stored revision: its own, or, for one stored before
    the relation was kept (`stored` None), the one its edges show (`retries_by_edges`)."""
    return stored if stored is not None else retries_by_edges(nodes, edges)


def next_retries(
    nodes: Sequence[Mapping[str, Any]],
    edges: Sequence[Mapping[str, Any]],
    *,
    previous_nodes: Sequence[Mapping[str, Any]] | None,
    previous_edges: Sequence[Mapping[str, Any]] | None,
    previous_retries: Mapping[str, Sequence[str]] | None,
) -> Retries:
    """The relation of the revision `nodes`/`edges` about to be written over the previous one.

    `previous_nodes` is None when there is no previous revision (the first plan of the task);
    `previous_retries` is None when the previous revision was stored without a relation, which
    is then read from its edges (`retries_by_edges`). One pass over the edges: a publish
    already reads the previous revision, and this costs next to nothing beside its checks.
    """
    if previous_nodes is None:
        found: Retries = {}
    elif previous_retries is None:
        found = retries_by_edges(previous_nodes, previous_edges)
    else:
        found = {failed: list(retries) for failed, retries in previous_retries.items()}
    before = {str(n["id"]) for n in previous_nodes or ()}
    by_id = {str(n["id"]): n for n in nodes}
    for edge in edges:
        source_id, target_id = str(edge.get("from")), str(edge.get("to"))
        if target_id in before:
            continue  # drawn before: a succession, or an edge into a node closed already
        source, target = by_id.get(source_id), by_id.get(target_id)
        if source is None or target is None or source.get("status") != "failed":
            continue
        if target.get("actor") == source.get("actor"):
            _add(found, source_id, target_id)
    return found


def readable_retries(stored: Any) -> Retries | None:
    """A stored relation as the rules read it; None when none was stored (an older revision).

    The host writes it, but a hand edit may not have: what is not text ids in a list is left
    out (the host cannot show that retry), and a relation that is not an object shows none.
    """
    if stored is None:
        return None
    if not isinstance(stored, Mapping):
        return {}
    return {
        failed: [retry for retry in retries if isinstance(retry, str)]
        for failed, retries in stored.items()
        if isinstance(failed, str) and isinstance(retries, list)
    }


def _add(found: Retries, failed: str, retry: str) -> None:
    drawn = found.setdefault(failed, [])
    if retry not in drawn:
        drawn.append(retry)
