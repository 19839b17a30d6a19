"""What an open console tab costs the API while its task does not change: the task view and
its pending actions every 3 s, an evidence page and a transcript page every 15 s, each answered
in full or, with the `ETag` the console holds, `304` with no body.

    .venv/bin/python bench/task_polls.py [--polls 200] [--rounds 5] [--write]

A throwaway Postgres (the tests' local binaries) and Redis get a task of realistic size: a plan
of 10 nodes, one pending action, 50 evidence records, 200 task events and 400 transcript
entries, beside 20,000 other tasks. The API runs in this process (FastAPI's TestClient): the
CPU time per read is the process's, the client's share included alike in both columns. A full
answer is what a client without the tag gets (and any client after a change): it includes
reading the tag (about a millisecond). The ways alternate within each round; the figures are
medians over the rounds.
Busy tasks beside it: two tasks with 1,000 and 10,000 delivered webhooks and 3 failing ones
each (a task keeps its delivered webhooks ORCH_RETENTION_DAYS; each generation writes several),
and 100 and 1,000 actions, one pending.
For each, the statement of the view's tag (`store.task_versions`) as it was before (every
outbox row of the task summed up) and now, timed in the store and read with EXPLAIN ANALYZE,
and an unchanged poll of the task's view through the API with each statement (wall time: the
statement runs in Postgres, not in this process), the ways alternating.
`--write` replaces this benchmark's section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

from docs_section import DOC, write_section
from execution_fleet import ROOT, servers

from tests.query_plans import table_and_index_rows, vacuumed

SEED = [
    "INSERT INTO tasks (task_id, task_type, title, context, trigger_id, origin, status,"
    " generation, session_id, recoveries, handbacks, rounds, intent_round, created_at,"
    " updated_at) SELECT 't' || i, 'leak', 'Task ' || i, '{}', 'trig-' || i, 'live', 'completed',"
    " 1, NULL, 0, 0, 1, 1, now() - i * interval '1 minute', now() FROM generate_series(1, 20000) i",
    "INSERT INTO tasks (task_id, task_type, title, context, trigger_id, origin, status,"
    " generation, session_id, recoveries, handbacks, rounds, intent_round, created_at,"
    " updated_at) VALUES ('big', 'leak', 'Big task', '{\"site\": \"tap 3\"}', 'trig-big', 'live',"
    " 'waiting', 1, 'sbig', 0, 0, 3, 1, now(), now())",
    "INSERT INTO sessions (session_id, purpose, task_id, generation, owner, title, created_at,"
    " updated_at) VALUES ('sbig', 'task_execution', 'big', 1, 'task:big', 'Big task', now(),"
    " now())",
    "INSERT INTO executions (task_id, generation, session_id, created_at, started_at, ended_at,"
    " outcome, reason) VALUES ('big', 1, 'sbig', now(), now(), now(), 'waiting', 'waits')",
    "INSERT INTO plan_revisions (session_id, revision, request_id, schema_version, title, reason,"
    " nodes, edges, content_digest, task_id, generation, updated_at) VALUES ('sbig', 1, 'r1',"
    " 'execution-plan@1', 'Plan', 'first', CAST(:nodes AS jsonb), CAST(:edges AS jsonb),"
    " repeat('0', 64), 'big', 1, now())",
    "INSERT INTO evidence (evidence_id, task_id, generation, session_id, source, queried_at,"
    " content_ref, origin, truncated, summary, created_at, kind, params_digest, row_count,"
    " char_count) SELECT 'ev' || lpad(i::text, 3, '0'), 'big', 1, 'sbig', 'meter_readings', now(),"
    " 'sha256:' || repeat('a', 64), 'live', false, 'turbidity reading ' || i || repeat(' x', 60),"
    " now() + i * interval '1 ms', 'data_source', repeat('b', 64), 10, 500"
    " FROM generate_series(0, 49) i",
    "INSERT INTO task_events (task_id, seq, type, generation, status, reason, data, created_at)"
    " SELECT 'big', i, 'waiting', 1, 'waiting', 'event ' || i, '{}', now()"
    " FROM generate_series(1, 200) i",
    "INSERT INTO transcript_entries (session_id, seq, task_id, generation, turn, kind, body,"
    " prompt_tokens, completion_tokens, created_at) SELECT 'sbig', i, 'big', 1, i / 2,"
    " CASE WHEN i % 2 = 0 THEN 'model_turn' ELSE 'tool_result' END,"
    " jsonb_build_object('content', repeat('the meter reads 4.1 NTU; ', 20)),"
    " CASE WHEN i % 2 = 0 THEN 1200 END, CASE WHEN i % 2 = 0 THEN 80 END, now()"
    " FROM generate_series(1, 400) i",
    "INSERT INTO actions (action_id, task_id, generation, session_id, node_id, kind, payload,"
    " status, created_at, plan_revision, digest) VALUES ('a1', 'big', 1, 'sbig', 'n3',"
    ' \'work_order\', \'{"crew": "north", "valve": "V-12"}\', \'pending_approval\', now(),'
    " 1, repeat('c', 64))",
    "INSERT INTO reports (report_id, task_id, generation, session_id, summary, findings,"
    " evidence_refs, outcome, created_at) VALUES ('rep1', 'big', 1, 'sbig', 'waits for the crew',"
    " '[]', '[\"ev001\"]', 'waiting', now())",
]

#: The busy tasks: their delivered webhooks, each with 3 failing ones after them, and a tenth as
#: many actions, one of them pending.
BUSY = {"busy1k": 1_000, "busy10k": 10_000}

SEED_BUSY = [
    "INSERT INTO tasks (task_id, task_type, title, context, trigger_id, origin, status,"
    " generation, session_id, recoveries, handbacks, rounds, intent_round, created_at,"
    " updated_at) VALUES (:task, 'leak', 'Busy task', '{}', :trigger, 'live',"
    " 'completed', 1, NULL, 0, 0, 1, 1, now(), now())",
    "INSERT INTO outbox (kind, task_id, event_seq, body, status, attempts, next_attempt_at,"
    " created_at, delivered_at) SELECT 'webhook', :task, i, '{\"type\": \"waiting\"}',"
    " 'delivered', 1, now(), now() - interval '1 day' + i * interval '1 second', now()"
    " FROM generate_series(1, :rows) i",
    "INSERT INTO outbox (kind, task_id, event_seq, body, status, attempts, next_attempt_at,"
    " created_at, last_error) SELECT 'webhook', :task, :rows + i, '{}', 'pending', 1,"
    " now() + interval '1 hour', now(), 'HTTP 503' FROM generate_series(1, 3) i",
    "INSERT INTO sessions (session_id, purpose, task_id, generation, owner, title, created_at,"
    " updated_at) VALUES (:session, 'task_execution', :task, 1, :owner, 'Busy task', now(),"
    " now())",
    # A decided action for every tenth delivery, and one pending.
    "INSERT INTO actions (action_id, task_id, generation, session_id, node_id, kind, payload,"
    " status, decided_by, decided_at, created_at, plan_revision, digest)"
    " SELECT :task || '-a' || i, :task, 1, :session, 'n' || i, 'work_order', '{}',"
    " CASE WHEN i = :rows / 10 THEN 'pending_approval' ELSE 'approved' END,"
    " CASE WHEN i = :rows / 10 THEN NULL ELSE 'ops' END, now(),"
    " now() - interval '1 day' + i * interval '1 second', 1, repeat('0', 64)"
    " FROM generate_series(1, :rows / 10) i",
]

READS = {
    "task view (every 3 s)": "/api/v1/tasks/big",
    "its pending actions (every 3 s)": "/api/v1/actions?status=pending_approval&limit=200"
    "&task_id=big",
    "evidence page of 100 (every 15 s)": "/api/v1/tasks/big/evidence?limit=100",
    "transcript page of 200 (every 15 s)": "/api/v1/tasks/big/transcript?limit=200",
}


def seed(url: str) -> None:
    from sqlalchemy import text

    from orchestrator.store.db import Database

    nodes = [
        {"id": f"n{i}", "title": f"Step {i}", "actor": "agent" if i % 2 else "human",
         "description": "check the meter " * 5, "evidence": "", "status": "pending",
         "evidence_ids": [f"ev{i:03d}"]}
        for i in range(10)
    ]  # fmt: skip
    edges = [{"from": f"n{i}", "to": f"n{i + 1}", "label": None} for i in range(9)]
    db = Database.from_url(url)
    with db.transaction() as conn:
        for statement in SEED:
            conn.execute(text(statement), {"nodes": json.dumps(nodes), "edges": json.dumps(edges)})
        for task, rows in BUSY.items():
            for statement in SEED_BUSY:
                conn.execute(
                    text(statement),
                    {"task": task, "rows": rows, "trigger": f"trig-{task}", "session": f"s{task}",
                     "owner": f"task:{task}"},
                )  # fmt: skip
    # As autovacuum leaves the tables: statistics, and the visibility map.
    vacuumed(db, "outbox", "tasks", "actions")
    db.dispose()


def old_version() -> Any:
    """The tag's statement with its outbox and actions terms as they were before migration
    0029: every outbox row and every action of the task summed up (copied here)."""
    from sqlalchemy import func

    from orchestrator.store import task_versions as tv
    from orchestrator.store.tables import actions, outbox

    everything = tv._summary(
        outbox,
        func.sum(outbox.c.attempts),
        func.sum(outbox.c.throttled),
        func.max(outbox.c.next_attempt_at),
        func.max(outbox.c.delivered_at),
        func.max(outbox.c.discarded_at),
        func.max(outbox.c.retried_at),
        func.max(outbox.c.claimed_until),
        func.count(outbox.c.claimed_until),
        *(tv._tally(outbox.c.status, status) for status in ("pending", "dead", "discarded")),
    )
    every_action = tv._summary(
        actions,
        func.max(actions.c.created_at),
        func.max(actions.c.decided_at),
        tv._tally(actions.c.status, "pending_approval"),
        tv._tally(actions.c.status, "superseded"),
    )
    changed = [*tv._OUTBOX, *tv._ACTIONS]
    parts = [part for part in tv._PARTS if part not in changed] + [everything, every_action]
    ever_sent = [old_ever_sent(kind) for kind in ("action", "webhook")]
    return tv._statement(parts, ever_sent)


def old_ever_sent(kind: str) -> Any:
    from sqlalchemy import case, exists

    from orchestrator.store.tables import outbox
    from orchestrator.store.task_versions import _TASK

    return case(
        (
            exists().where(
                outbox.c.task_id == _TASK, outbox.c.kind == kind, outbox.c.status == "pending"
            ),
            exists().where(
                outbox.c.status.in_(("delivered", "dead", "discarded")), outbox.c.kind == kind
            ),
        ),
        else_=None,
    ).label(f"{kind}_ever_sent")


def busy_polls(client: Any, url: str, polls: int, rounds: int) -> dict[str, Any]:
    """For each busy task and each way (the tag's statement before, now): the statement's
    milliseconds in the store, the rows it read (from tables, and index entries alone), and an
    unchanged poll's wall milliseconds through the API; medians over the rounds."""
    from orchestrator.store import task_versions
    from orchestrator.store.db import Database

    now = task_versions._VERSION
    ways = {"before": old_version(), "now": now}
    db = Database.from_url(url)
    params = {task: {"task_id": task, "owner": f"task:{task}"} for task in BUSY}
    tags = {}  # each way's statement makes its own tag
    for way, statement in ways.items():
        task_versions._VERSION = statement
        for task in BUSY:
            tags[(task, way)] = client.get(f"/api/v1/tasks/{task}").headers["ETag"]
    task_versions._VERSION = now
    store: dict[tuple[str, str], list[float]] = {}
    wall: dict[tuple[str, str], list[float]] = {}
    try:
        for _ in range(rounds):
            for task in BUSY:
                for way, statement in ways.items():
                    with db.transaction(readonly=True) as conn:
                        started = time.perf_counter()
                        for _ in range(polls):
                            conn.execute(statement, params[task]).one()
                        spent = (time.perf_counter() - started) * 1000 / polls
                    store.setdefault((task, way), []).append(spent)
                    task_versions._VERSION = statement
                    try:
                        headers = {"If-None-Match": tags[(task, way)]}
                        started = time.perf_counter()
                        for _ in range(polls):
                            answer = client.get(f"/api/v1/tasks/{task}", headers=headers)
                            assert answer.status_code == 304, answer.status_code
                        spent = (time.perf_counter() - started) * 1000 / polls
                    finally:
                        task_versions._VERSION = now
                    wall.setdefault((task, way), []).append(spent)
        rows = {
            (task, way): table_and_index_rows(
                db, lambda conn, s=statement, t=task: conn.execute(s, params[t]).one()
            )
            for task in BUSY
            for way, statement in ways.items()
        }
    finally:
        db.dispose()
    return {
        "store": {key: statistics.median(values) for key, values in store.items()},
        "wall": {key: statistics.median(values) for key, values in wall.items()},
        "rows": rows,
    }


def per_read(client: Any, path: str, polls: int, tag: str | None) -> tuple[float, int]:
    """CPU milliseconds and bytes of body per read of `path`."""
    headers = {"If-None-Match": tag} if tag else {}
    size = 0
    started = time.process_time()
    for _ in range(polls):
        answer = client.get(path, headers=headers)
        assert answer.status_code == (304 if tag else 200), answer.text
        size += len(answer.content)
    return (time.process_time() - started) * 1000 / polls, size // polls


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--polls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    from fastapi.testclient import TestClient

    from orchestrator.api.app import create_app
    from orchestrator.settings import load_settings

    load_start = os.getloadavg()[0]
    with servers() as (_pg, url, redis_url, _template):
        seed(url)
        settings = load_settings(database_url=url, redis_url=redis_url, model="scripted:/nowhere")
        samples: dict[tuple[str, bool], list[float]] = {}
        sizes: dict[tuple[str, bool], int] = {}
        with TestClient(create_app(settings)) as client:
            tags = {name: client.get(path).headers["ETag"] for name, path in READS.items()}
            for _ in range(args.rounds):
                for name, path in READS.items():
                    for conditional in (False, True):
                        tag = tags[name] if conditional else None
                        ms, size = per_read(client, path, args.polls, tag)
                        samples.setdefault((name, conditional), []).append(ms)
                        sizes[(name, conditional)] = size
            busy = busy_polls(client, url, args.polls, args.rounds)
    median = {key: statistics.median(values) for key, values in samples.items()}
    command = (
        f".venv/bin/python bench/task_polls.py --polls {args.polls} --rounds {args.rounds}"
        f"{' --write' if args.write else ''}"
    )
    lines = [
        "## An open console tab of an unchanged task (bench/task_polls.py)",
        "",
        f"`{command}`: a task with a plan of 10 nodes, a pending action, 50 evidence records,"
        f" 200 events and 400 transcript entries among 20,000 tasks; median of {args.rounds}"
        f" rounds of {args.polls} reads each, the ways alternating; load average"
        f" {load_start:.2f} at the start, {os.getloadavg()[0]:.2f} at the end.",
        "",
        "| read | full answer: CPU ms | bytes | with its ETag (304): CPU ms | bytes | ratio |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name in READS:
        full, cached = median[(name, False)], median[(name, True)]
        lines.append(
            f"| {name} | {full:.2f} | {sizes[(name, False)]} | {cached:.2f} |"
            f" {sizes[(name, True)]} | {full / cached:.1f}x |"
        )
    lines += [
        "",
        "CPU: this process's, the API and the test client together. A full answer includes the"
        " tag's own read (one statement), which an unchanged read is made of.",
        "",
        "Busy tasks: the view's tag before (every outbox row and every action of the task"
        " summed up) and now (delivered and discarded rows counted per kind and status from"
        " `ix_outbox_settled`, the rows still to send or dead summed up; the newest action and"
        " the count of pending ones, from indexes: migration 0029), the ways alternating.",
        "",
        "| task | tag statement before: ms | rows read | now: ms | rows read + index entries"
        " | ratio | unchanged poll (304) before: wall ms | now: wall ms | ratio |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for task, rows in BUSY.items():
        before, now = busy["store"][(task, "before")], busy["store"][(task, "now")]
        poll_before, poll_now = busy["wall"][(task, "before")], busy["wall"][(task, "now")]
        (read_before, entries_before), (read_now, entries_now) = (
            busy["rows"][(task, "before")],
            busy["rows"][(task, "now")],
        )
        lines.append(
            f"| {rows:,} delivered webhooks, 3 failing; {rows // 10:,} actions | {before:.2f} |"
            f" {read_before + entries_before} | {now:.2f} | {read_now} + {entries_now} |"
            f" {before / now:.1f}x | {poll_before:.2f} | {poll_now:.2f} |"
            f" {poll_before / poll_now:.1f}x |"
        )
    lines += [
        "",
        "Rows read: what the scans of the tag's statement returned or filtered out (EXPLAIN"
        " ANALYZE), of every table; index entries: those an index-only scan counted without"
        " reading their rows. Wall ms of a poll: the API in this process and Postgres together.",
    ]
    section = "\n".join(lines) + "\n"
    print(section)
    if args.write:
        write_section("task-polls", section)
        print(f"wrote the section to {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
