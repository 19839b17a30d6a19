"""`orchestrator tasks evidence ID`: the evidence records the host wrote for a task, a page at a
time, oldest first, and how to ask for the next page (as `tasks list` and `actions list` do).

Before, every record came at once: thousands of records for a long task, with nothing to page by.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import Any

from orchestrator.cli.common import (
    add_json_flag,
    bounded_int,
    command_runtime,
    cursor_arg,
    print_json,
)
from orchestrator.domain.pages import EVIDENCE_PAGE, EVIDENCE_PAGE_MAX

__all__ = ["register"]


def register(actions: Any) -> None:
    """Add `evidence` to the `tasks` sub-commands."""
    evidence = actions.add_parser(
        "evidence",
        help="the evidence records the host wrote for a task, oldest first, one page at a time",
    )
    evidence.add_argument("task_id")
    evidence.add_argument(
        "--limit",
        type=bounded_int(1, EVIDENCE_PAGE_MAX),
        default=EVIDENCE_PAGE,
        help=f"at most this many (1..{EVIDENCE_PAGE_MAX}, default {EVIDENCE_PAGE})",
    )
    evidence.add_argument(
        "--cursor", type=cursor_arg, help="the next page, as printed after the previous one"
    )
    add_json_flag(evidence)
    evidence.set_defaults(handler=_evidence)


def _next_page(args: argparse.Namespace, cursor: str) -> str:
    """The command that lists the page after this one."""
    words = ["orchestrator", "tasks", "evidence", args.task_id]
    if args.limit != EVIDENCE_PAGE:
        words += ["--limit", str(args.limit)]
    if args.json:
        words.append("--json")
    return shlex.join([*words, "--cursor", cursor])


def _evidence(args: argparse.Namespace) -> int:
    from orchestrator.services.task_records import TaskRecords

    rt = command_runtime()
    try:
        page = TaskRecords(rt.db).evidence(args.task_id, limit=args.limit, cursor=args.cursor)
    finally:
        rt.close()
    items = page["items"]
    cursor = page["next_cursor"]
    more = f"next page: {_next_page(args, cursor)}" if cursor else ""
    if args.json:
        print_json(items)
        if more:  # stdout stays one JSON array; the way on goes beside it
            print(more, file=sys.stderr)
        return 0
    if not items:
        print("no more evidence" if args.cursor else "no evidence recorded for this task")
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
    if more:
        print(more)
    return 0
