"""`orchestrator tasks list`: one page of tasks, filtered like `GET /api/v1/tasks`, and how to
ask for the next one.

The filters become the same `TaskFilter` the API builds, so both refuse the same values; here a
bad value is one line and exit code 2. `--since`/`--until` take an ISO-8601 time (no zone: UTC)
or an age (`90m`, `24h`, `7d`: that long ago). The next-page line repeats the filters with the
ages resolved to fixed times, so every page of one listing uses the same range.
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

from orchestrator.cli.common import (
    CommandFailed,
    add_json_flag,
    bounded_int,
    command_runtime,
    cursor_arg,
    print_json,
    printable,
)
from orchestrator.domain.task_filter import TaskFilter, as_utc, task_filter
from orchestrator.domain.vocabulary import TASK_STATUSES
from orchestrator.errors import ValidationFailed

__all__ = ["MAX_LIMIT", "register_list"]

MAX_LIMIT = 200  # the API's bound on `GET /api/v1/tasks?limit=`
_AGE = re.compile(r"(\d{1,6})([mhd])")
_UNITS = {"m": "minutes", "h": "hours", "d": "days"}


def register_list(actions: Any) -> None:
    listing = actions.add_parser("list", help="tasks, newest first, one page at a time")
    listing.add_argument("--status", choices=TASK_STATUSES)
    listing.add_argument("--type", dest="task_type", help="only tasks of this type")
    listing.add_argument(
        "--since",
        type=_when,
        metavar="WHEN",
        help="created at or after WHEN: ISO-8601 (no zone: UTC) or an age like 90m, 24h, 7d",
    )
    listing.add_argument(
        "--until", type=_when, metavar="WHEN", help="created before WHEN (same forms)"
    )
    listing.add_argument(
        "--limit",
        type=bounded_int(1, MAX_LIMIT),
        default=50,
        help=f"at most this many (1..{MAX_LIMIT}, default 50)",
    )
    listing.add_argument(
        "--cursor", type=cursor_arg, help="the next page, as printed after the previous one"
    )
    add_json_flag(listing)
    listing.set_defaults(handler=_list)


def _when(text: str) -> datetime:
    """An argparse `type`: an ISO-8601 time or an age, as an aware UTC time."""
    age = _AGE.fullmatch(text.strip())
    if age:
        delta = timedelta(**{_UNITS[age.group(2)]: int(age.group(1))})
        return datetime.now(UTC).replace(microsecond=0) - delta
    try:
        # RFC 3339 allows a lower-case `t` and `z`, which `fromisoformat` does not read.
        moment = as_utc(datetime.fromisoformat(text.strip().upper()))
    except ValueError:
        moment = None
    if moment is None:
        raise argparse.ArgumentTypeError(f"not an ISO-8601 time or an age like 24h: {text[:60]!r}")
    return moment


def _filter(args: argparse.Namespace) -> TaskFilter:
    try:
        return task_filter(
            status=args.status,
            task_type=args.task_type,
            created_after=args.since,
            created_before=args.until,
        )
    except ValidationFailed as exc:
        field = exc.details[0]["field"] if exc.details else ""
        option = {"task_type": "--type", "created_after": "--since", "created_before": "--until"}
        message = exc.message.replace("created_after", "--since")
        message = message.replace("created_before", "--until")
        raise CommandFailed(
            f"invalid {option.get(field, '--' + field)}: {message}", exit_code=2
        ) from None


def _utc(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _handed_back(wait: dict[str, Any] | None) -> str:
    """After the title of a `running` task whose round was handed back: nothing runs until
    the sweeper requeues it (the reason: `tasks show`)."""
    if wait is None:
        return ""
    after = wait["requeue_after"]
    return f"  [handed back, requeued after {_utc(after)}]" if after else "  [handed back]"


def next_page_command(where: TaskFilter, limit: int, cursor: str) -> str:
    """The command that lists the page after this one, with the same filters."""
    words = ["orchestrator", "tasks", "list"]
    if where.status:
        words += ["--status", where.status]
    if where.task_type:
        words += ["--type", where.task_type]
    if where.created_after:
        words += ["--since", where.created_after.isoformat()]
    if where.created_before:
        words += ["--until", where.created_before.isoformat()]
    if limit != 50:
        words += ["--limit", str(limit)]
    return shlex.join([*words, "--cursor", cursor])


def _list(args: argparse.Namespace) -> int:
    where = _filter(args)
    rt = command_runtime()
    try:
        found, cursor = rt.tasks.page_tasks(where=where, limit=args.limit, cursor=args.cursor)
        views = rt.tasks.views(found)
    finally:
        rt.close()
    more = f"next page: {next_page_command(where, args.limit, cursor)}" if cursor else ""
    if args.json:
        print_json(views)
        if more:  # stdout stays one JSON array; the way on goes beside it
            print(more, file=sys.stderr)
        return 0
    if not found:
        print("no tasks")
        return 0
    # As wide as the longest type shown (up to 64 characters), never cut: two types that
    # differ after their 20th character read alike when cut there.
    wide = max(20, *(len(printable(task.task_type)) for task in found))
    print(f"{'TASK':36}  {'STATUS':9}  {'GEN':>3}  {'TYPE':{wide}}  {'CREATED':20}  TITLE")
    for task, view in zip(found, views, strict=True):
        created = _utc(task.created_at)
        print(
            f"{task.task_id:36}  {task.status:9}  {task.generation:>3}  "
            f"{printable(task.task_type):{wide}}  {created:20}  {printable(task.title)}"
            + _handed_back(view["handed_back"])
            + ("  [wake-up not sent: the sweeper sends it]" if view.get("wake_up_unsent") else "")
        )
    if more:
        print(more)
    return 0
