"""The tests' own databases (`tests.databases`): a copy of the template a test gave back is
handed to a later test only as a new copy is, every row, counter and figure the test left gone;
one the test changed beyond its rows is dropped, and the next test gets a new copy."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from orchestrator.services.tasks import Trigger
from tests.databases import TemplateCopies
from tests.executions_support import completing_turns, runtime_for, write_script
from tests.services import PostgresServer

pytestmark = pytest.mark.postgres


@pytest.fixture
def copies(postgres: PostgresServer) -> Iterator[TemplateCopies]:
    own = TemplateCopies(postgres, "orch_template")
    yield own
    own.close()


def what_a_test_reads(postgres: PostgresServer, name: str) -> dict[str, Any]:
    """What a test could read of database `name` that a new copy decides: the rows of every
    table, the planner's figures of every relation, the sequences, the counters."""
    with postgres.connect(name) as conn:
        tables = [
            row[0]
            for row in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY 1"
            )
        ]
        rows = {
            table: conn.execute(f'SELECT count(*) FROM "{table}"').fetchone()  # type: ignore[arg-type]
            for table in tables
        }
        figures = conn.execute(
            "SELECT c.relname, c.relpages, c.reltuples, c.relallvisible FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public'"
            " ORDER BY 1"
        ).fetchall()
        sequences = conn.execute(
            "SELECT sequencename, last_value FROM pg_sequences ORDER BY 1"
        ).fetchall()
        counters = conn.execute(
            "SELECT relname, seq_scan, coalesce(idx_scan, 0), n_tup_ins, n_live_tup, n_dead_tup"
            " FROM pg_stat_user_tables WHERE n_tup_ins + seq_scan + coalesce(idx_scan, 0) > 0"
        ).fetchall()
        statistics = conn.execute("SELECT count(*) FROM pg_statistic WHERE starelid >= 16384")
        version = conn.execute("SELECT version_num FROM alembic_version").fetchall()
        return {
            "rows": rows,
            "figures": figures,
            "sequences": sequences,
            "counters": counters,
            "statistics": statistics.fetchone(),
            "version": version,
        }


def database_oid(postgres: PostgresServer, name: str) -> int | None:
    with postgres.connect() as conn:
        row = conn.execute("SELECT oid FROM pg_database WHERE datname = %s", [name]).fetchone()
    return None if row is None else int(row[0])


def test_a_copy_given_back_written_is_taken_again_as_a_new_copy(
    copies: TemplateCopies, postgres: PostgresServer, scripts: Path
) -> None:
    name = copies.take()
    oid = database_oid(postgres, name)
    new = what_a_test_reads(postgres, name)
    assert {count for table, count in new["rows"].items() if table != "alembic_version"} == {(0,)}
    rt, _ = runtime_for(postgres.url(name), scripts)
    write_script(scripts, "simple", completing_turns())
    task_id = rt.tasks.trigger(Trigger(task_type="simple", title="t")).task.task_id
    assert rt.executions.run(task_id, 1, worker="w1").outcome == "completed"
    rt.close()
    lingering = postgres.connect(name)  # a session the test left open, in a transaction
    lingering.autocommit = False
    lingering.execute("UPDATE tasks SET title = 'changed'")  # a TRUNCATE would wait for it
    written = what_a_test_reads(postgres, name)
    assert sum(count[0] for count in written["rows"].values()) > 10
    assert written["counters"]
    assert written["sequences"] != new["sequences"]

    copies.give_back(name)

    with pytest.raises(psycopg.OperationalError):
        lingering.execute("SELECT 1")  # ended, as DROP DATABASE ... WITH (FORCE) ended it
    lingering.close()
    again = copies.take()
    assert again != name  # the same database, by another name: the test's URL leads nowhere
    assert database_oid(postgres, again) == oid
    assert database_oid(postgres, name) is None
    assert (copies.reused, copies.dropped) == (1, 0)
    assert what_a_test_reads(postgres, again) == new


@pytest.mark.parametrize(
    "change",
    [
        "ANALYZE tasks",
        "VACUUM tasks",
        "ALTER TABLE tasks SET (autovacuum_enabled = false)",
        "ALTER TABLE tasks ALTER COLUMN title SET STATISTICS 500",
        "CREATE TABLE extra (id integer)",
        "CREATE INDEX extra ON tasks (title)",
        "DROP INDEX ix_tasks_task_type_created_at",
        "SELECT nextval('outbox_outbox_id_seq')",
        "ALTER DATABASE {name} SET timezone TO 'Asia/Shanghai'",
        "UPDATE alembic_version SET version_num = '0001'",
        "CREATE FUNCTION extra() RETURNS integer LANGUAGE sql AS 'SELECT 1'",
    ],
)
def test_a_copy_changed_beyond_its_rows_is_dropped(
    copies: TemplateCopies, postgres: PostgresServer, change: str
) -> None:
    name = copies.take()
    new = what_a_test_reads(postgres, name)
    with postgres.connect(name) as conn:
        conn.execute(change.format(name=name))  # type: ignore[arg-type]

    copies.give_back(name)

    assert (copies.reused, copies.dropped) == (0, 1)
    assert database_oid(postgres, name) is None
    another = copies.take()
    assert another != name
    assert what_a_test_reads(postgres, another) == new
