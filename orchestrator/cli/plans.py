"""`orchestrator plans show SESSION_ID [--revision N] [--json]`: a plan as a tree of branches."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import Any

from orchestrator.cli.common import add_json_flag, bounded_int, load, print_json, printable

__all__ = ["register", "render_tree"]


def register(commands: Any) -> None:
    plans = commands.add_parser("plans", help="execution plans of sessions")
    actions = plans.add_subparsers(dest="plans_command", metavar="ACTION", required=True)
    show = actions.add_parser("show", help="print a session's plan (latest unless --revision)")
    show.add_argument("session_id")
    show.add_argument(
        "--revision", type=bounded_int(1, MAX_REVISION), default=None, help="a given revision"
    )
    add_json_flag(show)
    show.set_defaults(handler=_show)


#: Revisions are stored as 32-bit integers; the API takes the same range.
MAX_REVISION = 2**31 - 1


def _line(node: Mapping[str, Any]) -> str:
    text = f"[{node['status']}] {node['id']}: {node['title']} ({node['actor']})"
    if node.get("reason"):
        text += f" - {node['reason']}"
    if node.get("action_id"):
        text += f" [action {node['action_id']}]"
    return text


def render_tree(
    nodes: Sequence[Mapping[str, Any]], edges: Sequence[Mapping[str, Any]]
) -> list[str]:
    """Roots first, each branch indented under its parent; a join shows once, then a reference."""
    by_id = {node["id"]: node for node in nodes}
    children: dict[str, list[tuple[str, str | None]]] = {node["id"]: [] for node in nodes}
    has_parent: set[str] = set()
    for edge in edges:
        if edge["from"] in children and edge["to"] in by_id:
            children[edge["from"]].append((edge["to"], edge.get("label")))
            has_parent.add(edge["to"])
    lines: list[str] = []
    shown: set[str] = set()

    def walk(node_id: str, label: str | None, prefix: str, last: bool, top: bool) -> None:
        branch = "" if top else ("└─ " if last else "├─ ")
        condition = f"<{label}> " if label else ""
        if node_id in shown:
            lines.append(f"{prefix}{branch}{condition}-> {node_id} (shown above)")
            return
        shown.add(node_id)
        lines.append(f"{prefix}{branch}{condition}{_line(by_id[node_id])}")
        below = prefix if top else prefix + ("   " if last else "│  ")
        kids = children[node_id]
        for index, (child, child_label) in enumerate(kids):
            walk(child, child_label, below, index == len(kids) - 1, False)

    for node in nodes:
        if node["id"] not in has_parent:
            walk(node["id"], None, "", True, True)
    for node in nodes:  # only reachable through a cycle, which validation refuses; be safe
        if node["id"] not in shown:
            walk(node["id"], None, "", True, True)
    return lines


def _show(args: argparse.Namespace) -> int:
    from orchestrator.api.plan_views import plan_as_sent
    from orchestrator.services.plans import PlanService
    from orchestrator.store.db import Database

    settings = load()
    db = Database.from_url(settings.store_url)
    try:
        service = PlanService(db)
        if args.revision is not None:
            plan: dict[str, Any] | None = service.revision(args.session_id, args.revision).to_dict()
        else:
            latest = service.latest(args.session_id)
            plan = latest.to_dict() if latest else None
    finally:
        db.dispose()
    if plan is not None:
        plan = plan_as_sent(plan)  # as the API sends it: a node of an older shape is its text
    if args.json:
        print_json(plan)
        return 0
    if plan is None:
        print(f"session {args.session_id} has no execution plan yet")
        return 0
    print(f"{plan['title']}  (session {plan['session_id']}, revision {plan['revision']})")
    print(
        f"updated {plan['updated_at']}" + (f"; reason: {plan['reason']}" if plan["reason"] else "")
    )
    counts = ", ".join(f"{status} {n}" for status, n in plan["status_counts"].items() if n)
    print(f"status: {counts}")
    print()
    nodes = [node for node in plan["nodes"] if isinstance(node, dict)]
    edges = [edge for edge in plan["edges"] if isinstance(edge, dict)]
    for line in render_tree(nodes, edges):
        print(line)
    for part, readable, every in (("node", nodes, plan["nodes"]), ("edge", edges, plan["edges"])):
        if len(readable) < len(every):
            print()
            print(f"{part}s stored by an older version in another shape, as written:")
            for item in every:
                if not isinstance(item, dict):
                    print(f"  {printable(item)}")
    return 0
