"""A round finds its task and generation by their keys, however many tasks wait queued or run.

Every fenced statement checks `task_id = ... AND generation = ... AND outcome IS NULL` on the
execution and `status = 'running'` on the task; the claim checks `status = 'queued'`. When
the tables' statistics predated the queue (taken while nothing was queued or running), the
planner took an index on the status or the outcome for these instead of the key: each fenced
write read every queued execution (the lease index before migration 0030 held them) and every
running task, and the claim every queued task. Measured here with Postgres's own counters of
the rows each table gave (`pg_stat_user_tables`), flushed by ending the sessions that read
them.
"""

from __future__ import annotations

import time
from pathlib import Path

from sqlalchemy import text

from bench.execution_fleet import minimal_turns
from orchestrator.services.tasks import Trigger
from orchestrator.store import Database
from orchestrator.store.executions import count_handed_back, expired_executions
from orchestrator.store.types import utcnow
from tests.executions_support import runtime_for, write_script
from tests.query_plans import rows_scanned, vacuumed

#: Tasks ended before the statistics were taken; of them, those running after (other workers'
#: rounds); and tasks queued after.
HISTORY, RUNNING, BACKLOG = 600, 300, 1500


def test_a_round_reads_its_own_rows_not_the_queue_or_the_other_running_tasks(
    pg_url: str, scripts: Path
) -> None:
    write_script(scripts, "minimal", minimal_turns())
    rt, _ = runtime_for(pg_url, scripts)
    try:
        for _ in range(HISTORY):
            rt.tasks.trigger(Trigger(task_type="minimal", title="before"))
        with rt.db.transaction() as conn:
            # An installation's past: every generation ended, as its statistics saw it.
            conn.execute(text("UPDATE executions SET outcome = 'completed', ended_at = now()"))
            conn.execute(text("UPDATE tasks SET status = 'completed'"))
        _analyze(rt.db)
        with rt.db.transaction() as conn:
            conn.execute(
                text(
                    "UPDATE tasks SET status = 'running' WHERE task_id IN"
                    " (SELECT task_id FROM tasks ORDER BY task_id LIMIT :n)"
                ),
                {"n": RUNNING},
            )
        queued = [
            rt.tasks.trigger(Trigger(task_type="minimal", title="queued")).task.task_id
            for _ in range(BACKLOG)
        ]
    finally:
        rt.close()
    before = _rows_read(pg_url)

    rt, _ = runtime_for(pg_url, scripts)
    try:
        result = rt.executions.run(queued[0], 1, worker="w1")
    finally:
        rt.close()
    after = _rows_read(pg_url)

    assert (result.ran, result.outcome) == (True, "completed")
    read = {table: after[table] - before[table] for table in after}
    # One round: its claim, the fenced writes of its evidence, transcript, plan and report, and
    # its end, each a row or two by key. Before, each fenced write read BACKLOG executions and
    # RUNNING tasks, and the claim BACKLOG tasks.
    assert read["executions"] < 100, read
    assert read["tasks"] < 100, read


def test_the_sweep_reads_claimed_generations_by_index_not_the_queued_ones(pg_url: str) -> None:
    db = Database.from_url(pg_url)
    try:
        with db.transaction() as conn:
            conn.execute(
                text(
                    "INSERT INTO tasks (task_id, task_type, title, context, trigger_id, origin,"
                    " status, generation, created_at, updated_at)"
                    " SELECT 't' || g, 'x', 't', '{}', 't' || g, 'live',"
                    " CASE WHEN g <= 40 THEN 'running' ELSE 'queued' END, 1, now(), now()"
                    " FROM generate_series(1, 2040) g"
                )
            )
            # 40 claimed (10 of them expired, 5 handed back), 2,000 queued.
            conn.execute(
                text(
                    "INSERT INTO executions (task_id, generation, session_id, created_at,"
                    " lease_token, started_at, lease_expires_at, handed_back_at)"
                    " SELECT 't' || g, 1, 's' || g, now(),"
                    " CASE WHEN g <= 40 THEN 'k' || g END, CASE WHEN g <= 40 THEN now() END,"
                    " CASE WHEN g <= 10 THEN now() - interval '1 minute'"
                    " WHEN g <= 40 THEN now() + interval '1 minute' END,"
                    " CASE WHEN g <= 5 THEN now() END"
                    " FROM generate_series(1, 2040) g"
                )
            )
        vacuumed(db, "executions", "tasks")
        now = utcnow()
        with db.transaction() as conn:
            assert len(expired_executions(conn, now, 100)) == 10
            assert count_handed_back(conn) == 5
        # Each reads the claimed generations' index entries at most: never the 2,000 queued.
        assert rows_scanned(db, lambda conn: expired_executions(conn, now, 100)) <= 40
        assert rows_scanned(db, count_handed_back) <= 40
    finally:
        db.dispose()


def _analyze(db: Database) -> None:
    with db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("ANALYZE executions"))
        conn.execute(text("ANALYZE tasks"))


def _rows_read(url: str, within: float = 10.0) -> dict[str, int]:
    """Rows each table gave its scans so far (sequential and by index): every other session of
    the database is ended first, and a session's counts reach these views when it ends."""
    db = Database.from_url(url)
    try:
        with db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            others = text(
                "SELECT pid FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            for (pid,) in conn.execute(others).all():
                conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
            deadline = time.monotonic() + within
            while conn.execute(others).first() is not None:
                assert time.monotonic() < deadline, "sessions still open"
                time.sleep(0.05)
            conn.execute(text("SELECT pg_stat_clear_snapshot()"))
            rows = conn.execute(
                text(
                    "SELECT relname, coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0)"
                    " FROM pg_stat_user_tables WHERE relname IN ('executions', 'tasks')"
                )
            ).all()
    finally:
        db.dispose()
    return {str(name): int(count) for name, count in rows}
