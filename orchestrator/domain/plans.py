"""Execution plans (seed 004): validation of a publish, status counts, the idempotency digest.

Pure functions over plain JSON values. Every problem is collected and reported at once, so an
agent can fix a refused plan in one retry.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Final

from orchestrator.domain.plan_fields import (
    ID_PATTERN,
    MAX_ID,
    MAX_REQUEST_ID,
    MAX_TEXT,
    MAX_TITLE,
    Collector,
    Problem,
    parse_edge,
    parse_node,
    problem,
)
from orchestrator.domain.vocabulary import NODE_STATUSES
from orchestrator.errors import ValidationFailed

__all__ = [
    "CODES",
    "ID_PATTERN",
    "MAX_EDGES",
    "MAX_ID",
    "MAX_NODES",
    "MAX_REQUEST_ID",
    "MAX_TEXT",
    "MAX_TITLE",
    "SCHEMA_VERSION",
    "SERVER_FIELDS",
    "PlanDraft",
    "Problem",
    "check_update",
    "content_digest",
    "distinct_edges",
    "find_cycle",
    "parse_plan",
    "raise_problems",
    "readable_edges",
    "readable_nodes",
    "retry_edge_problems",
    "status_counts",
    "validate_plan",
]

SCHEMA_VERSION: Final = "execution-plan@1"
MAX_NODES: Final = 40
MAX_EDGES: Final = 80

#: Every code a refused publish can carry; stable, the agent and the UI match on them.
CODES: Final = (
    "unknown_session",
    "request_id_conflict",
    "invalid_type",
    "missing_field",
    "unknown_field",
    "field_too_long",
    "invalid_character",
    "empty_plan",
    "too_many_nodes",
    "too_many_edges",
    "duplicate_node_id",
    "invalid_actor",
    "invalid_status",
    "evidence_required",
    "reason_required",
    "dangling_edge",
    "duplicate_edge",
    "self_loop",
    "cycle",
    "node_removed",
    "completed_node_changed",
    "failed_node_reopened",
    "retry_not_new",
    "reserved_request_id",
    # Who may change what (`domain.plan_authority`).
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

_PLAN_FIELDS: Final = frozenset({"request_id", "title", "reason", "nodes", "edges"})
#: Fields the server sets on a stored revision. An agent that sends a stored plan back with
#: them (the usual way to keep every node) is not refused: they are ignored, whatever their
#: value, and the server assigns its own (`retries` too: which node retries which is the
#: host's record, `domain.retries`, never the agent's word).
SERVER_FIELDS: Final = frozenset(
    {"schema_version", "session_id", "revision", "status_counts", "updated_at", "task_id",
     "generation", "retries"}
)  # fmt: skip
_ACCEPTED_FIELDS: Final = _PLAN_FIELDS | SERVER_FIELDS
#: What a failed node can no longer be: open again, or done after all.
_REOPENED: Final = frozenset({"pending", "running", "waiting", "completed"})


@dataclass(frozen=True)
class PlanDraft:
    """A publish that passed the structural checks, in its normalised stored form."""

    request_id: str
    title: str
    reason: str
    nodes: list[dict[str, Any]]
    edges: list[dict[str, Any]]

    @cached_property
    def digest(self) -> str:
        return content_digest(self.title, self.reason, self.nodes, self.edges)


def find_cycle(node_ids: Sequence[str], edges: Sequence[tuple[str, str]]) -> list[str] | None:
    """The node ids of one cycle, in order (first repeated at the end), or None if acyclic."""
    successors: dict[str, list[str]] = {node: [] for node in node_ids}
    for source, target in edges:
        if source in successors and target in successors:
            successors[source].append(target)
    state: dict[str, int] = {}  # 1 on the current path, 2 finished
    for root in node_ids:
        if state.get(root):
            continue
        path: list[str] = [root]
        iterators = [iter(successors[root])]
        state[root] = 1
        while iterators:
            nxt = next(iterators[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                iterators.pop()
            elif state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            elif not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                iterators.append(iter(successors[nxt]))
    return None


def _utf8(payload: Mapping[str, Any]) -> bool:
    """Whether every string of the payload (keys too) encodes as UTF-8: a lone surrogate (which
    JSON's \\ud800 escape can carry) cannot be stored, digested or echoed in an error."""
    try:
        json.dumps(payload, ensure_ascii=False, check_circular=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    except (TypeError, ValueError, RecursionError):
        return True  # not JSON-shaped: the checks below say what is wrong
    return True


def parse_plan(payload: Any) -> tuple[PlanDraft | None, list[Problem]]:
    """Check everything that needs no history; a draft only when no problem was found."""
    c = Collector()
    if not isinstance(payload, Mapping):
        c.add("invalid_type", "the plan must be a JSON object")
        return None, c.problems
    if not _utf8(payload):
        # Before any check that names a field's value: no answer could carry it either.
        c.add("invalid_character", "the plan holds text that is not UTF-8 (an unpaired surrogate)")
        return None, c.problems
    c.unknown(payload, _ACCEPTED_FIELDS, "the plan")
    request_id = c.text(
        payload, "request_id", "request_id", MAX_REQUEST_ID, {}, required=True, pattern=ID_PATTERN
    )
    title = c.text(payload, "title", "title", MAX_TITLE, {}, required=True)
    reason = c.text(payload, "reason", "reason", MAX_TEXT, {})
    raw_nodes, raw_edges = payload.get("nodes"), payload.get("edges", [])
    if raw_nodes is None:
        c.add("missing_field", "nodes is required", field="nodes")
        raw_nodes = []
    elif not isinstance(raw_nodes, list):
        c.add("invalid_type", "nodes must be a list", field="nodes")
        raw_nodes = []
    elif not raw_nodes:
        c.add("empty_plan", "a plan needs at least one node")
    if raw_edges is None:
        raw_edges = []
    elif not isinstance(raw_edges, list):
        c.add("invalid_type", "edges must be a list", field="edges")
        raw_edges = []
    if len(raw_nodes) > MAX_NODES:
        c.add("too_many_nodes", f"{len(raw_nodes)} nodes, at most {MAX_NODES} are allowed")
    if len(raw_edges) > MAX_EDGES:
        c.add("too_many_edges", f"{len(raw_edges)} edges, at most {MAX_EDGES} are allowed")

    nodes = [parse_node(c, index, raw) for index, raw in enumerate(raw_nodes)]
    seen: dict[str, int] = {}  # id -> how often; insertion order keeps reports stable
    for raw in raw_nodes:
        node_id = raw.get("id") if isinstance(raw, dict) else None
        if not isinstance(node_id, str):
            continue
        seen[node_id] = seen.get(node_id, 0) + 1
        if seen[node_id] == 2:
            c.add(
                "duplicate_node_id", f"node id {node_id!r} is used more than once", node_id=node_id
            )

    edges = [parse_edge(c, index, raw) for index, raw in enumerate(raw_edges)]
    links: list[tuple[str, str]] = []
    pairs: dict[tuple[str, str], int] = {}  # (from, to) -> how often, whatever the label
    for index, edge in enumerate(edges):
        if edge is None:
            continue
        source, target = edge["from"], edge["to"]
        pairs[source, target] = pairs.get((source, target), 0) + 1
        if pairs[source, target] == 2:
            # One dependency is one edge; a second one (another label, say) is a mistake the
            # agent must resolve, not a branch: a conditional branch goes to another node.
            c.add(
                "duplicate_edge",
                f"edges[{index}] repeats the edge from {source!r} to {target!r}",
                edge={"index": index, "from": source, "to": target},
            )
        if source != target and source in seen and target in seen:
            links.append((source, target))  # the common case, without building a report
            continue
        ref = {"index": index, "from": source, "to": target}
        missing = [end for end in (source, target) if end not in seen]
        for end in dict.fromkeys(missing):
            c.add("dangling_edge", f"edges[{index}] names unknown node {end!r}", edge=ref)
        if edge["from"] == edge["to"]:
            c.add("self_loop", f"edges[{index}] goes from {edge['from']!r} to itself", edge=ref)
        elif not missing:
            links.append((edge["from"], edge["to"]))
    cycle = find_cycle(list(seen), links)
    if cycle is not None:
        c.add(
            "cycle",
            f"the graph has a cycle {' -> '.join(cycle)}; a retry is a new node",
            node_ids=cycle,
        )
    if c.problems:
        return None, c.problems
    # No problem means every field parsed; the `or ""` only narrows the types.
    return PlanDraft(
        request_id or "",
        title or "",
        reason or "",
        [n for n in nodes if n],
        [e for e in edges if e],
    ), []


def check_update(
    nodes: Sequence[Any], previous: Sequence[Mapping[str, Any]] | None
) -> list[Problem]:
    """Rules against the previous revision: keep every node, never rewrite a completed one,
    never reopen a failed one.

    `nodes` may be the raw input of a refused publish: only objects whose id is a string can
    match a stored node (a list or an object as id is reported by `parse_plan`, not here).
    A completed node keeps its title, evidence and status; a corrected conclusion is a new
    review node. A failed node stays failed, or is marked skipped or cancelled once something
    else replaces it: a retry is a new node (seed 004: 重试使用新节点), of the same actor with an
    edge from the failed node, and the task completes once it is completed
    (`domain.decisions.unretried_failed_nodes`).
    """
    if not previous:
        return []
    problems: list[Problem] = []
    current: dict[str, Mapping[str, Any]] = {}
    for node in nodes:
        if isinstance(node, Mapping):
            node_id = node.get("id")
            if isinstance(node_id, str):
                current[node_id] = node
    for old in previous:
        node_id = old["id"]
        new = current.get(node_id)
        if new is None:
            problems.append(
                problem(
                    "node_removed",
                    f"node {node_id!r} of the previous revision is missing; "
                    "mark it skipped or cancelled instead",
                    node_id=node_id,
                )
            )
        elif old.get("status") == "completed" and (
            new.get("status") != "completed"
            or new.get("title") != old.get("title")
            or (new.get("evidence") or "") != (old.get("evidence") or "")
            or (new.get("evidence_ids") or []) != (old.get("evidence_ids") or [])
        ):
            problems.append(
                problem(
                    "completed_node_changed",
                    f"node {node_id!r} was completed; its status, title and evidence cannot "
                    "change (add a review node and say why in reason)",
                    node_id=node_id,
                )
            )
        elif old.get("status") == "failed" and _reopened(new.get("status")):
            problems.append(
                problem(
                    "failed_node_reopened",
                    f"node {node_id!r} failed; it cannot be {new.get('status')} again: a retry "
                    "is a new node of the same actor with an edge from the failed one, which "
                    "stays failed (an agent node that no longer applies may be marked skipped "
                    "or cancelled)",
                    node_id=node_id,
                )
            )
    return problems


def retry_edge_problems(
    nodes: Sequence[Mapping[str, Any]],
    edges: Sequence[Mapping[str, Any]],
    previous: Sequence[Mapping[str, Any]] | None,
    previous_edges: Sequence[Mapping[str, Any]] | None,
) -> list[Problem]:
    """A new edge that would make a node already in the plan a retry of its source.

    A retry of a failed node is a node of its actor with an edge from it, new since the
    failure (seed 004: 重试使用新节点; `domain.retries`). So a new edge from a node of the same
    actor is refused into a node already completed or failed (one closed before the edge was
    drawn retries nothing), and a new edge from a failed node into any node already in the
    plan (a call-back planned for its own reason). Such an edge could not make the node a
    retry: the host keeps which node retries which, and a node already in the plan is none.
    The refusal tells the agent so at once, rather than after a round whose reason says the
    failed node still has no retry. An edge the previous revision (or the task's last plan)
    had already is kept as it is.
    """
    if not previous:
        return []
    before = {str(n["id"]): n for n in previous if isinstance(n, Mapping)}
    now = {str(n.get("id")): n for n in nodes if isinstance(n, Mapping)}
    drawn = {(str(e.get("from")), str(e.get("to"))) for e in previous_edges or ()}
    problems: list[Problem] = []
    for edge in edges:
        source, target = str(edge.get("from")), str(edge.get("to"))
        old = before.get(target)
        origin = now.get(source, {})
        if old is None or origin.get("actor") != old.get("actor") or (source, target) in drawn:
            continue
        closed = old.get("status") in ("completed", "failed")
        if not closed and origin.get("status") != "failed":
            continue
        problems.append(
            problem(
                "retry_not_new",
                f"node {target!r} is in the plan already ({old.get('status')}); a new edge "
                f"from {source!r} to it would make it a retry, and a retry is a new node (add "
                f"one with an edge from {source!r})",
                node_id=target,
                edge={"from": source, "to": target},
            )
        )
    return problems


def _reopened(status: Any) -> bool:
    return isinstance(status, str) and status in _REOPENED


def raise_problems(problems: Sequence[Problem]) -> None:
    """Raise `ValidationFailed` carrying every problem, coded by the first; no-op when none."""
    if not problems:
        return
    codes = ", ".join(dict.fromkeys(p["code"] for p in problems))
    count = len(problems)
    message = f"the plan was refused ({count} problem{'s' if count != 1 else ''}: {codes})"
    raise ValidationFailed(message, code=problems[0]["code"], details=list(problems))


def validate_plan(
    payload: Any, previous_nodes: Sequence[Mapping[str, Any]] | None = None
) -> PlanDraft:
    """The whole check of one publish; raises `ValidationFailed` listing every problem."""
    draft, problems = parse_plan(payload)
    raw_nodes = payload.get("nodes") if isinstance(payload, Mapping) else None
    nodes = draft.nodes if draft else (raw_nodes if isinstance(raw_nodes, list) else [])
    problems = problems + check_update(nodes, previous_nodes)
    raise_problems(problems)
    assert draft is not None
    return draft


def distinct_edges(edges: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """`edges` with each (from, to) kept once, the first. A stored plan is published again by
    the server (a person closes a node, an action is proposed); one stored before
    `duplicate_edge` was refused goes out without its repeats instead of being refused."""
    seen: set[tuple[str, str]] = set()
    kept = []
    for edge in edges:
        # Ends of an older shape (a list, an object) are compared as their JSON text; the
        # publish that follows refuses them with what is wrong.
        pair = (_end(edge.get("from")), _end(edge.get("to")))
        if pair not in seen:
            seen.add(pair)
            kept.append(dict(edge))
    return kept


def _end(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)


def readable_nodes(nodes: Any) -> list[dict[str, Any]] | None:
    """The nodes of a stored revision the rules can read: objects with a string id.

    A node an older version (or a hand edit) stored in another shape without an id cannot be
    matched, kept or decided on: it stays in its own revision, where the read routes show it as
    written, and the rules see the rest (a publish over it, a person's close, the end of a
    round). A node with an id is always seen, whatever its status (seed 004: 更新必须保留原节点):
    one whose status is not text (null, absent, a list) is given the rules with status None, so
    it must be kept, is never done, and a human one waits for its person."""
    if nodes is None:
        return None
    return [
        node if isinstance(node.get("status"), str) else {**node, "status": None}
        for node in _items(nodes)
        if isinstance(node, dict) and isinstance(node.get("id"), str)
    ]


def readable_edges(edges: Any) -> list[dict[str, Any]] | None:
    """The edges of a stored revision the rules can read: objects from a text id to a text id
    (see `readable_nodes`)."""
    if edges is None:
        return None
    return [
        edge
        for edge in _items(edges)
        if isinstance(edge, dict)
        and isinstance(edge.get("from"), str)
        and isinstance(edge.get("to"), str)
    ]


def _items(stored: Any) -> Sequence[Any]:
    """A stored list; one value stored in its place (an older shape) is one item."""
    return stored if isinstance(stored, list | tuple) else [stored]


def status_counts(nodes: Sequence[Any]) -> dict[str, int]:
    """How many nodes are in each status, every status listed (progress is counts, not time)."""
    counts = dict.fromkeys(NODE_STATUSES, 0)
    for node in nodes:
        # A stored node of an older shape (not an object, a status of another type) counts in
        # no status rather than failing the reader.
        status = node.get("status") if isinstance(node, Mapping) else None
        if isinstance(status, str) and status in counts:
            counts[status] += 1
    return counts


def content_digest(
    title: str, reason: str, nodes: Sequence[Mapping[str, Any]], edges: Sequence[Mapping[str, Any]]
) -> str:
    """SHA-256 of the canonical JSON of a plan's content (request_id excluded)."""
    canonical = json.dumps(
        {"title": title, "reason": reason, "nodes": nodes, "edges": edges},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()
