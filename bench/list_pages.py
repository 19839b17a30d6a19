"""What a large installation's lists cost the store: a deep page of the task list, and one
refresh of the console's approvals page, each beside the way it was done before, in one run.

    .venv/bin/python bench/list_pages.py [--tasks 50000] [--pending 3000] [--busy 5000]
        [--rounds 15] [--write]

A throwaway Postgres (the tests' local binaries) gets `--tasks` tasks with their sessions and
`--pending` pending actions, written as the trigger and `insert_action` write them, then ANALYZE.
- Task list: the page after the cursor at several depths, with the keyset condition as an OR
  alone (before) and with the range bound of `store/keyset.py` (now); time and rows read.
- Approvals refresh: every pending action, 200 a page, newest first (the page before) beside the
  pending count and the 50 oldest (now), through the store's functions.
- A task's decided actions, the first page (the task page's "Decided actions"): one task with
  `--busy` decided actions, made over its lifetime among the others', read without the index
  on (task_id, created_at, action_id) (before migration 0029: dropped before the read,
  built again after it) and with it.
The ways alternate within each round, so load on the machine hits them alike; the figures are
medians over the rounds. `--write` replaces this benchmark's section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from docs_section import DOC, write_section
from execution_fleet import ROOT, servers

from tests.query_plans import rows_scanned

SEED_TASKS = (
    "INSERT INTO tasks (task_id, task_type, title, context, trigger_id, origin, status,"
    " generation, session_id, recoveries, handbacks, rounds, intent_round, created_at,"
    " updated_at)"
    " SELECT 't' || lpad(i::text, 7, '0'), 'leak', 'Task ' || i, '{\"site\": \"tap\"}',"
    " 'trig-' || i, 'live', (ARRAY['queued','running','waiting','completed','failed',"
    "'cancelled'])[1 + i % 6], 1, 's' || lpad(i::text, 7, '0'), 0, 0, 1, 1,"
    " :start + i * interval '1 minute', :start + i * interval '1 minute'"
    " FROM generate_series(1, :rows) i"
)
SEED_SESSIONS = (
    "INSERT INTO sessions (session_id, purpose, task_id, generation, owner, title, created_at,"
    " updated_at) SELECT session_id, 'task_execution', task_id, 1, 'task:' || task_id, title,"
    " created_at, created_at FROM tasks"
)
SEED_ACTIONS = (
    "INSERT INTO actions (action_id, task_id, generation, session_id, node_id, kind, payload,"
    " status, created_at, plan_revision, digest)"
    " SELECT 'a' || task_id || k, task_id, 1, session_id, 'n' || k, 'work_order',"
    " jsonb_build_object('crew', 'north', 'notes', repeat('n', 300)), 'pending_approval',"
    " created_at + k * interval '1 second', 1, repeat('0', 64)"
    " FROM tasks, generate_series(1, 2) k WHERE status = 'waiting' AND task_id <= :last"
)


def seed(db: Any, tasks: int, pending: int, busy: int) -> None:
    from sqlalchemy import text

    start = datetime.now(UTC) - timedelta(minutes=tasks)
    with db.transaction() as conn:
        conn.execute(text(SEED_TASKS), {"start": start, "rows": tasks})
        conn.execute(text(SEED_SESSIONS))
        # Every sixth task waits; two pending actions each, on the oldest waiting tasks.
        last = f"t{min(tasks, pending * 3):07d}"
        conn.execute(text(SEED_ACTIONS), {"last": last})
        # Decided actions, ten times as many: the long history a count must not read.
        conn.execute(
            text(
                "INSERT INTO actions SELECT 'd' || n || action_id, task_id, generation,"
                " session_id, node_id, kind, payload, 'approved', 'ops', created_at, NULL,"
                " created_at, plan_revision, digest FROM actions, generate_series(1, 10) n"
            )
        )
        conn.execute(text(SEED_BUSY), {"busy": busy, "task": busy_task(tasks)})
    # As autovacuum leaves a table: statistics, and the visibility map an index-only scan needs.
    with db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE"))


#: The task with a long decided history (`busy_task`, an early one: its actions, ten seconds
#: apart from its creation on, are not the store's newest).
SEED_BUSY = (
    "INSERT INTO actions (action_id, task_id, generation, session_id, node_id, kind, payload,"
    " status, decided_by, decided_at, created_at, plan_revision, digest)"
    " SELECT 'b' || k, task_id, 1, session_id, 'n' || k, 'work_order',"
    " jsonb_build_object('crew', 'north', 'notes', repeat('n', 300)), 'approved', 'ops',"
    " created_at + k * interval '10 seconds', created_at + k * interval '10 seconds', 1,"
    " repeat('0', 64) FROM tasks, generate_series(1, :busy) k WHERE task_id = :task"
)
TASK_ACTIONS_INDEX = "ix_actions_task_id_created_at_action_id"


def busy_task(tasks: int) -> str:
    return f"t{max(1, tasks // 500):07d}"


def decided_page(conn: Any, task_id: str) -> int:
    """The first page of the task's decided actions, as the API reads it."""
    from orchestrator.store import actions as action_store

    page = action_store.list_actions(conn, status=None, task_id=task_id, limit=51, decided=True)
    return min(len(page), 50)


def index_built(db: Any, built: bool) -> None:
    """The task's actions index there (now) or not (before migration 0029)."""
    from sqlalchemy import text

    with db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        if built:
            conn.execute(
                text(
                    f"CREATE INDEX IF NOT EXISTS {TASK_ACTIONS_INDEX}"
                    " ON actions (task_id, created_at, action_id)"
                )
            )
        else:
            conn.execute(text(f"DROP INDEX IF EXISTS {TASK_ACTIONS_INDEX}"))


def old_task_page(conn: Any, seen: tuple[datetime, str], limit: int) -> list[Any]:
    """The task list's page as it was sent before: the keyset condition as an OR alone (the
    rest as `list_tasks` does it)."""
    from sqlalchemy import and_, null, select

    from orchestrator.store.records import TaskRecord
    from orchestrator.store.tables import tasks

    at, task_id = seen
    light = [c for c in tasks.c if c.name not in ("context", "sample_input")]
    query = (
        select(*light, null().label("context"), null().label("sample_input"))
        .where(
            (tasks.c.created_at < at) | and_(tasks.c.created_at == at, tasks.c.task_id < task_id)
        )
        .order_by(tasks.c.created_at.desc(), tasks.c.task_id.desc())
        .limit(limit)
    )
    return [TaskRecord.from_row(row) for row in conn.execute(query)]


def new_task_page(conn: Any, seen: tuple[datetime, str], limit: int) -> list[Any]:
    from orchestrator.domain.task_filter import TaskFilter
    from orchestrator.store import tasks as task_store

    return task_store.list_tasks(conn, where=TaskFilter(), limit=limit, after=seen)


def every_pending(conn: Any) -> int:
    """The approvals page's refresh before: every pending action, 200 a page."""
    from orchestrator.store import actions as action_store

    seen = 0
    after = None
    while True:
        page = action_store.list_actions(
            conn, status="pending_approval", task_id=None, limit=201, after=after
        )
        seen += min(len(page), 200)
        if len(page) <= 200:
            return seen
        after = (page[199].created_at, page[199].action_id)


def count_and_oldest(conn: Any) -> int:
    from orchestrator.store import actions as action_store

    action_store.count_pending(conn)
    page = action_store.list_actions(
        conn, status="pending_approval", task_id=None, limit=51, oldest_first=True
    )
    return min(len(page), 50)


def timed(db: Any, read: Callable[[Any], Any]) -> float:
    with db.transaction(readonly=True) as conn:
        started = time.perf_counter()
        read(conn)
        return (time.perf_counter() - started) * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=50_000)
    parser.add_argument("--pending", type=int, default=3_000)
    parser.add_argument("--busy", type=int, default=5_000)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    from sqlalchemy import text

    from orchestrator.domain.task_filter import TaskFilter
    from orchestrator.store import tasks as task_store
    from orchestrator.store.db import Database

    load_start = os.getloadavg()[0]
    with servers() as (_pg, url, _redis, _template):
        db = Database.from_url(url)
        seed(db, args.tasks, args.pending, args.busy)
        depths = [d for d in (50, 1_000, 10_000, 25_000, args.tasks - 100) if d < args.tasks]
        cursors: dict[int, tuple[datetime, str]] = {}
        with db.transaction(readonly=True) as conn:
            rows = task_store.list_tasks(conn, where=TaskFilter(), limit=max(depths))
            for depth in depths:
                cursors[depth] = (rows[depth - 1].created_at, rows[depth - 1].task_id)
        ways: dict[str, Callable[[Any], Any]] = {}
        for depth, seen in cursors.items():
            ways[f"old {depth}"] = lambda c, s=seen: old_task_page(c, s, 51)
            ways[f"new {depth}"] = lambda c, s=seen: new_task_page(c, s, 51)
        ways["old approvals"] = every_pending
        ways["new approvals"] = count_and_oldest
        ways["old decided"] = lambda c: decided_page(c, busy_task(args.tasks))
        ways["new decided"] = lambda c: decided_page(c, busy_task(args.tasks))
        with_index = {"old decided": False, "new decided": True}
        samples: dict[str, list[float]] = {name: [] for name in ways}
        for _ in range(args.rounds):
            for name, read in ways.items():
                if name in with_index:
                    index_built(db, with_index[name])
                samples[name].append(timed(db, read))
        show = bool(os.environ.get("BENCH_PLANS"))
        read_rows = {}
        for name, read in ways.items():
            if name in with_index:
                index_built(db, with_index[name])
            read_rows[name] = rows_scanned(db, read, show=show)
        with db.transaction(readonly=True) as conn:
            shown = every_pending(conn)
            total = conn.execute(text("SELECT count(*) FROM actions")).scalar_one()
        db.dispose()
    median = {name: statistics.median(values) for name, values in samples.items()}
    command = (
        f".venv/bin/python bench/list_pages.py --tasks {args.tasks} --pending {args.pending}"
        f" --busy {args.busy} --rounds {args.rounds}{' --write' if args.write else ''}"
    )
    lines = [
        "## Lists of a large installation (bench/list_pages.py)",
        "",
        f"`{command}`: {args.tasks} tasks with their sessions, {shown} pending actions and ten"
        f" times as many decided, and one task with {args.busy} decided actions ({total} actions"
        f" in all); median of {args.rounds} rounds, the ways alternating; load"
        f" average {load_start:.2f} at the start, {os.getloadavg()[0]:.2f} at the end.",
        "",
        "| read | before: ms | rows read | now: ms | rows read |",
        "|---|---:|---:|---:|---:|",
    ]
    for depth in cursors:
        old, new = f"old {depth}", f"new {depth}"
        lines.append(
            f"| task list, the 50 after row {depth} | {median[old]:.2f} | {read_rows[old]} |"
            f" {median[new]:.2f} | {read_rows[new]} |"
        )
    lines += [
        f"| approvals page refresh (before: all {shown}, 200 a page; now: count and 50 oldest)"
        f" | {median['old approvals']:.2f} | {read_rows['old approvals']} |"
        f" {median['new approvals']:.2f} | {read_rows['new approvals']} |",
        f"| a task's decided actions, first page of 50 (before: no index on (task_id, created_at,"
        f" action_id); now: migration 0029's) | {median['old decided']:.2f} |"
        f" {read_rows['old decided']} | {median['new decided']:.2f} |"
        f" {read_rows['new decided']} |",
        "",
        "Rows read: what the scans of the statements returned or filtered out (EXPLAIN ANALYZE)."
        " The pending count reads each pending action's index entry, never the decided ones.",
    ]
    section = "\n".join(lines) + "\n"
    print(section)
    if args.write:
        write_section("list-pages", section)
        print(f"wrote the section to {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
