"""Field checks of a plan publish: each node and edge read into its stored form or a problem.

Well-formed nodes and edges take a fast path (plans are checked on every publish); anything else
goes through the collector, which records every problem with where it was found.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from orchestrator.domain.vocabulary import NODE_ACTORS, NODE_STATUSES

__all__ = [
    "ID_PATTERN",
    "MAX_ID",
    "MAX_REQUEST_ID",
    "MAX_TEXT",
    "MAX_TITLE",
    "Collector",
    "Problem",
    "parse_edge",
    "parse_node",
    "problem",
]

MAX_ID: Final = 64
MAX_REQUEST_ID: Final = 128  # the width of plan_revisions.request_id
MAX_TITLE: Final = 200
MAX_TEXT: Final = 2000
ID_PATTERN: Final = re.compile(r"[A-Za-z0-9_.:-]+")

# `action_id` is written back once an action proposed for the node exists (DESIGN invariant 10).
# `evidence_ids`: the evidence records or succeeded writes a completed node rests on (issue 13).
_NODE_FIELDS: Final = frozenset(
    {"id", "title", "actor", "description", "evidence", "status", "reason", "action_id",
     "evidence_ids"}
)  # fmt: skip
MAX_CITED: Final = 20
_EDGE_FIELDS: Final = frozenset({"from", "to", "label"})
_NEEDS_REASON: Final = frozenset({"failed", "waiting"})

Problem = dict[str, Any]


def problem(code: str, message: str, **where: Any) -> Problem:
    found: Problem = {"code": code, "message": message}
    found.update({key: value for key, value in where.items() if value is not None})
    return found


class Collector:
    """Reads fields of JSON objects, recording a problem for each one that is wrong."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []

    def add(self, code: str, message: str, **where: Any) -> None:
        self.problems.append(problem(code, message, **where))

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
        if (
            type(value) is str  # the common case first: plans are checked on every publish
            and len(value) <= limit
            and (pattern is None or pattern.fullmatch(value))
            and (not required or value.strip())
            and "\x00" not in value
        ):
            return value
        found: tuple[str, str] | None = None
        if value is None:
            if not required:
                return ""
            found = ("missing_field", f"{label} is required")
        elif not isinstance(value, str):
            found = ("invalid_type", f"{label} must be a string")
        elif required and not value.strip():
            found = ("missing_field", f"{label} must not be empty")
        elif len(value) > limit:
            found = ("field_too_long", f"{label} is {len(value)} characters, at most {limit}")
        elif "\x00" in value:
            # Postgres text cannot hold NUL; refusing it keeps both stores alike.
            found = ("invalid_character", f"{label} contains a NUL character")
        elif pattern is not None and not pattern.fullmatch(value):
            # The issue files the id format under the same code as its length.
            found = ("field_too_long", f"{label} must be 1-{limit} characters of [A-Za-z0-9_.:-]")
        if found is None:
            return str(value)
        self.add(*found, field=key, **where)
        return None

    def unknown(
        self, obj: Mapping[str, Any], allowed: frozenset[str], label: str, **where: Any
    ) -> None:
        extra = obj.keys() - allowed
        for key in sorted(extra, key=str) if extra else ():
            self.add("unknown_field", f"{label} has no field {key!r}", field=str(key), **where)


def _short(value: Any, limit: int) -> bool:
    return value is None or (type(value) is str and len(value) <= limit and "\x00" not in value)


def _an_id(value: Any) -> bool:
    return type(value) is str and len(value) <= MAX_ID and ID_PATTERN.fullmatch(value) is not None


def _clean_node(raw: Any) -> dict[str, Any] | None:
    """A well-formed node without the collector (the common case); None means look closer."""
    if type(raw) is not dict or not raw.keys() <= _NODE_FIELDS:
        return None
    title, actor, status = raw.get("title"), raw.get("actor"), raw.get("status")
    evidence, reason, action_id = raw.get("evidence"), raw.get("reason"), raw.get("action_id")
    if not (
        _an_id(raw.get("id"))
        and _short(title, MAX_TITLE)
        and type(title) is str
        and title.strip()
        and type(actor) is str
        and actor in NODE_ACTORS
        and type(status) is str
        and status in NODE_STATUSES
        and _short(raw.get("description"), MAX_TEXT)
        and _short(evidence, MAX_TEXT)
        and _short(reason, MAX_TEXT)
        and (action_id is None or _an_id(action_id))
        and _ids(raw.get("evidence_ids"))
        and (status != "completed" or (evidence or "").strip())
        and (status not in _NEEDS_REASON or (reason or "").strip())
    ):
        return None
    node = {
        "id": raw["id"],
        "title": title,
        "actor": actor,
        "description": raw.get("description") or "",
        "evidence": evidence or "",
        "status": status,
        "reason": reason or None,
    }
    if action_id:
        node["action_id"] = action_id
    if raw.get("evidence_ids"):
        node["evidence_ids"] = list(raw["evidence_ids"])
    return node


def _ids(value: Any) -> bool:
    return value is None or (
        type(value) is list and len(value) <= MAX_CITED and all(_an_id(item) for item in value)
    )


def _clean_edge(raw: Any) -> dict[str, Any] | None:
    """A well-formed edge without the collector; None means look closer."""
    if type(raw) is not dict or not raw.keys() <= _EDGE_FIELDS:
        return None
    source, target, label = raw.get("from"), raw.get("to"), raw.get("label")
    if (
        type(source) is str
        and type(target) is str
        and 0 < len(source.strip()) <= len(source) <= MAX_ID
        and 0 < len(target.strip()) <= len(target) <= MAX_ID
        and "\x00" not in source
        and "\x00" not in target
        and _short(label, MAX_TITLE)
    ):
        return {"from": source, "to": target, "label": label or None}
    return None


def parse_node(c: Collector, index: int, raw: Any) -> dict[str, Any] | None:
    clean = _clean_node(raw)
    if clean is not None:
        return clean
    if not isinstance(raw, dict):
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
    cited = raw.get("evidence_ids")
    if not _ids(cited):
        c.add(
            "invalid_type",
            f"{label} evidence_ids must be a list of at most {MAX_CITED} ids",
            field="evidence_ids",
            **where,
        )
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
    if cited:
        node["evidence_ids"] = list(cited)
    return node


def parse_edge(c: Collector, index: int, raw: Any) -> dict[str, Any] | None:
    clean = _clean_edge(raw)
    if clean is not None:
        return clean
    if not isinstance(raw, dict):
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
