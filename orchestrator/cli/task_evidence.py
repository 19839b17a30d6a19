"""`orchestrator tasks evidence ID`: the evidence records the host wrote for a task."""

from __future__ import annotations

import argparse
from typing import Any

from orchestrator.cli.common import add_json_flag, load, print_json
from orchestrator.runtime import build_runtime
from orchestrator.services.task_records import TaskRecords

__all__ = ["register"]


def register(actions: Any) -> None:
    """Add `evidence` to the `tasks` sub-commands."""
    evidence = actions.add_parser(
        "evidence", help="the evidence records the host wrote for a task, oldest first"
    )
    evidence.add_argument("task_id")
    add_json_flag(evidence)
    evidence.set_defaults(handler=_evidence)


def _evidence(args: argparse.Namespace) -> int:
    rt = build_runtime(load())
    try:
        items = TaskRecords(rt.db).evidence(args.task_id)["items"]
    finally:
        rt.close()
    if args.json:
        print_json(items)
        return 0
    if not items:
        print("no evidence recorded for this task")
        return 0
    print(f"{'EVIDENCE':36}  {'GEN':>3}  {'ORIGIN':17}  {'TRUNC':5}  {'ROWS':>5}  SOURCE")
    for item in items:
        rows = "" if item["row_count"] is None else str(item["row_count"])
        print(
            f"{item['evidence_id']:36}  {item['generation']:>3}  {item['origin']:17}  "
            f"{'yes' if item['truncated'] else 'no':5}  {rows:>5}  {item['source']} "
            f"at {item['queried_at']}"
        )
        # What the record says it came from (a command's line): the source alone named
        # `execute_command` for an `echo` as for a real probe.
        print(f"    {item['summary']}")
    return 0
