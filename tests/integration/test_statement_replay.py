"""The benchmark's replay of an execution's statements (bench/statement_replay.py) does what
the execution did: bench/executions.py reads its own statements' floor from it, so a replay
that skipped a statement or failed a fence would make that floor too low."""

from __future__ import annotations

from pathlib import Path

import psycopg

from bench.execution_fleet import MINIMAL, minimal_turns
from bench.statement_replay import WRITTEN_TABLES, Replayer, load, record, save
from orchestrator.services.tasks import Trigger
from tests.executions_support import runtime_for, write_script
from tests.services import PostgresServer

TABLES = (*WRITTEN_TABLES, "leases")  # the test's runtime keeps its leases in the store


def _rows(dsn: str) -> list[object]:
    with psycopg.connect(dsn) as connection:
        counted = [
            connection.execute(f"SELECT count(*) FROM {table}").fetchone()  # type: ignore[arg-type]
            for table in TABLES
        ]
        statuses = connection.execute(
            "SELECT task_id, status, generation FROM tasks ORDER BY task_id"
        ).fetchall()
        entries = connection.execute(
            "SELECT session_id, seq, kind, body FROM transcript_entries ORDER BY session_id, seq"
        ).fetchall()
    return [counted, statuses, entries]


def test_replayed_statements_leave_the_rows_the_executions_left(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    scripts = tmp_path / "scripts"
    write_script(scripts, MINIMAL, minimal_turns())
    source = postgres.create_database(template="orch_template")
    rt, _ = runtime_for(postgres.url(source), scripts)
    try:
        task_ids = [
            rt.tasks.trigger(Trigger(task_type=MINIMAL, title=f"replay {n}")).task.task_id
            for n in range(3)
        ]
    finally:
        rt.close()
    copy = postgres.create_database(template=source)
    rt, _ = runtime_for(postgres.url(source), scripts)
    try:
        traces = record(rt, task_ids)
    finally:
        rt.close()
    assert len(traces) == 3
    assert all(any(step[0] == "commit" for step in trace) for trace in traces)
    save(traces, tmp_path / "traces.pickle")
    recorded, replayed = (postgres.url(db).replace("+psycopg", "") for db in (source, copy))
    before = _rows(replayed)
    replayer = Replayer(replayed)
    try:
        for trace in load(str(tmp_path / "traces.pickle")):
            replayer.run(trace)
    finally:
        replayer.close()
    after = _rows(replayed)
    assert after != before  # the copy was taken before the executions
    assert after == _rows(recorded)
    assert {status for _, status, _ in after[1]} == {"completed"}  # type: ignore[attr-defined]
