"""Execution plans (seed 004): validation of a publish, status counts, the idempotency digest.

Pure functions over plain JSON values. Every problem is collected and reported at once, so an
agent can fix a refused plan in one retry.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from orchestrator.domain.vocabulary import NODE_ACTORS, NODE_STATUSES
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
    "PlanDraft",
    "Problem",
    "check_update",
    "content_digest",
    "find_cycle",
    "parse_plan",
    "raise_problems",
    "status_counts",
    "validate_plan",
]

SCHEMA_VERSION: Final = "execution-plan@1"
MAX_NODES: Final = 40
MAX_EDGES: Final = 80
MAX_ID: Final = 64
MAX_REQUEST_ID: Final = 128  # the width of plan_revisions.request_id
MAX_TITLE: Final = 200
MAX_TEXT: Final = 2000
ID_PATTERN: Final = re.compile(r"[A-Za-z0-9_.:-]+")

#: Every code a refused publish can carry; stable, the agent and the UI match on them.
CODES: Final = (
    "unknown_session",
    "request_id_conflict",
    "invalid_type",
    "missing_field",
    "unknown_field",
    "field_too_long",
    "empty_plan",
    "too_many_nodes",
    "too_many_edges",
    "duplicate_node_id",
    "invalid_actor",
    "invalid_status",
    "evidence_required",
    "reason_required",
    "dangling_edge",
    "self_loop",
    "cycle",
    "node_removed",
    "completed_node_changed",
)

_PLAN_FIELDS: Final = frozenset({"request_id", "title", "reason", "nodes", "edges"})
# `action_id` is written back once an action proposed for the node exists (DESIGN invariant 10).
_NODE_FIELDS: Final = frozenset(
    {"id", "title", "actor", "description", "evidence", "status", "reason", "action_id"}
)
_EDGE_FIELDS: Final = frozenset({"from", "to", "label"})
_NEEDS_REASON: Final = frozenset({"failed", "waiting"})

Problem = dict[str, Any]


@dataclass(frozen=True)
class PlanDraft:
    """A publish that passed the structural checks, in its normalised stored form."""

    request_id: str
    title: str
    reason: str
    nodes: list[dict[str, Any]]
    edges: list[dict[str, Any]]

    @property
    def digest(self) -> str:
        return content_digest(self.title, self.reason, self.nodes, self.edges)


def _problem(code: str, message: str, **where: Any) -> Problem:
    found: Problem = {"code": code, "message": message}
    found.update({key: value for key, value in where.items() if value is not None})
    return found


class _Collector:
    """Reads fields of JSON objects, recording a problem for each one that is wrong."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []

    def add(self, code: str, message: str, **where: Any) -> None:
        self.problems.append(_problem(code, message, **where))

    def text(
        self,
        obj: Mapping[str, Any],
        key: str,
        label: str,
        limit: int,
        where: Mapping[str, Any],
        *,
        required: bool = False,
        pattern: re.Pattern[str] | None = None,
    ) -> str | None:
        """The string at `key` ("" when optional and absent), or None after recording why not."""
        value = obj.get(key)
        problem: tuple[str, str] | None = None
        if value is None:
            if not required:
                return ""
            problem = ("missing_field", f"{label} is required")
        elif not isinstance(value, str):
            problem = ("invalid_type", f"{label} must be a string")
        elif required and not value.strip():
            problem = ("missing_field", f"{label} must not be empty")
        elif len(value) > limit:
            problem = ("field_too_long", f"{label} is {len(value)} characters, at most {limit}")
        elif pattern is not None and not pattern.fullmatch(value):
            # The issue files the id format under the same code as its length.
            problem = ("field_too_long", f"{label} must be 1-{limit} characters of [A-Za-z0-9_.:-]")
        if problem is None:
            return str(value)
        self.add(*problem, field=key, **where)
        return None

    def unknown(
        self, obj: Mapping[str, Any], allowed: frozenset[str], label: str, **where: Any
    ) -> None:
        for key in sorted(set(obj) - allowed, key=str):
            self.add("unknown_field", f"{label} has no field {key!r}", field=str(key), **where)


def _parse_node(c: _Collector, index: int, raw: Any) -> dict[str, Any] | None:
    if not isinstance(raw, Mapping):
        c.add("invalid_type", f"nodes[{index}] must be an object", index=index)
        return None
    raw_id = raw.get("id")
    where = {"node_id": raw_id if isinstance(raw_id, str) else None, "index": index}
    node_id = c.text(
        raw, "id", f"nodes[{index}].id", MAX_ID, where, required=True, pattern=ID_PATTERN
    )
    label = f"node {node_id!r}" if node_id else f"nodes[{index}]"
    c.unknown(raw, _NODE_FIELDS, label, **where)
    title = c.text(raw, "title", f"{label} title", MAX_TITLE, where, required=True)
    description = c.text(raw, "description", f"{label} description", MAX_TEXT, where)
    evidence = c.text(raw, "evidence", f"{label} evidence", MAX_TEXT, where)
    reason = c.text(raw, "reason", f"{label} reason", MAX_TEXT, where)
    action_id = c.text(raw, "action_id", f"{label} action_id", MAX_ID, where, pattern=ID_PATTERN)
    actor, status = raw.get("actor"), raw.get("status")
    ok = True
    if not isinstance(actor, str) or actor not in NODE_ACTORS:
        c.add("invalid_actor", f"{label} actor must be one of {', '.join(NODE_ACTORS)}", **where)
        ok = False
    if not isinstance(status, str) or status not in NODE_STATUSES:
        c.add(
            "invalid_status", f"{label} status must be one of {', '.join(NODE_STATUSES)}", **where
        )
        ok = False
    elif status == "completed" and isinstance(evidence, str) and not evidence.strip():
        c.add("evidence_required", f"{label} is completed, so it needs evidence", **where)
        ok = False
    elif status in _NEEDS_REASON and isinstance(reason, str) and not reason.strip():
        c.add("reason_required", f"{label} is {status}, so it needs a reason", **where)
        ok = False
    if not ok or None in (node_id, title, description, evidence, reason, action_id):
        return None
    node: dict[str, Any] = {
        "id": node_id,
        "title": title,
        "actor": actor,
        "description": description,
        "evidence": evidence,
        "status": status,
        "reason": reason or None,
    }
    if action_id:
        node["action_id"] = action_id
    return node


def _parse_edge(c: _Collector, index: int, raw: Any) -> dict[str, Any] | None:
    if not isinstance(raw, Mapping):
        c.add("invalid_type", f"edges[{index}] must be an object", index=index)
        return None
    where = {"edge": {"index": index, "from": raw.get("from"), "to": raw.get("to")}}
    label = f"edges[{index}]"
    c.unknown(raw, _EDGE_FIELDS, label, **where)
    source = c.text(raw, "from", f"{label}.from", MAX_ID, where, required=True)
    target = c.text(raw, "to", f"{label}.to", MAX_ID, where, required=True)
    text = c.text(raw, "label", f"{label}.label", MAX_TITLE, where)
    if source is None or target is None or text is None:
        return None
    return {"from": source, "to": target, "label": text or None}


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


def parse_plan(payload: Any) -> tuple[PlanDraft | None, list[Problem]]:
    """Check everything that needs no history; a draft only when no problem was found."""
    c = _Collector()
    if not isinstance(payload, Mapping):
        c.add("invalid_type", "the plan must be a JSON object")
        return None, c.problems
    c.unknown(payload, _PLAN_FIELDS, "the plan")
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

    nodes = [_parse_node(c, index, raw) for index, raw in enumerate(raw_nodes)]
    seen: dict[str, int] = {}  # id -> how often; insertion order keeps reports stable
    for raw in raw_nodes:
        node_id = raw.get("id") if isinstance(raw, Mapping) else None
        if not isinstance(node_id, str):
            continue
        seen[node_id] = seen.get(node_id, 0) + 1
        if seen[node_id] == 2:
            c.add(
                "duplicate_node_id", f"node id {node_id!r} is used more than once", node_id=node_id
            )

    edges = [_parse_edge(c, index, raw) for index, raw in enumerate(raw_edges)]
    links: list[tuple[str, str]] = []
    for index, edge in enumerate(edges):
        if edge is None:
            continue
        ref = {"index": index, "from": edge["from"], "to": edge["to"]}
        missing = [end for end in (edge["from"], edge["to"]) if end not in seen]
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
    nodes: Sequence[Mapping[str, Any]], previous: Sequence[Mapping[str, Any]] | None
) -> list[Problem]:
    """Rules against the previous revision: keep every node, never rewrite a completed one."""
    if not previous:
        return []
    problems: list[Problem] = []
    current = {node.get("id"): node for node in nodes if isinstance(node, Mapping)}
    for old in previous:
        node_id = old["id"]
        new = current.get(node_id)
        if new is None:
            problems.append(
                _problem(
                    "node_removed",
                    f"node {node_id!r} of the previous revision is missing; "
                    "mark it skipped or cancelled instead",
                    node_id=node_id,
                )
            )
        elif old.get("status") == "completed" and (
            new.get("title") != old.get("title")
            or (new.get("evidence") or "") != (old.get("evidence") or "")
        ):
            problems.append(
                _problem(
                    "completed_node_changed",
                    f"node {node_id!r} was completed; its title and evidence cannot change "
                    "(add a review node and say why in reason)",
                    node_id=node_id,
                )
            )
    return problems


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


def status_counts(nodes: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """How many nodes are in each status, every status listed (progress is counts, not time)."""
    counts = dict.fromkeys(NODE_STATUSES, 0)
    for node in nodes:
        status = node.get("status")
        if status in counts:
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
