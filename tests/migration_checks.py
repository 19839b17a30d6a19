"""What the migration tests read of a store at a URL, on SQLite and Postgres alike: its
difference from the models, its indexes and their definitions, a transaction or an autocommit
connection on it (each on an engine of its own, disposed after); and, on Postgres, a migration
run beside a live writer (`migrate_beside_writers`). They run on `empty_url`
(tests/conftest.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection, inspect, text

from orchestrator.store import make_engine, metadata

__all__ = [
    "connection",
    "differences",
    "index_definition",
    "indexes",
    "invalid_indexes",
    "migrate_beside_writers",
    "task_row",
]


@contextmanager
def connection(url: str, *, autocommit: bool = False) -> Iterator[Connection]:
    """One transaction on the store at `url` (or, `autocommit`, a connection outside one)."""
    engine = make_engine(url)
    try:
        if autocommit:
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                yield conn
        else:
            with engine.begin() as conn:
                yield conn
    finally:
        engine.dispose()


def differences(url: str) -> list[object]:
    """How the store's schema differs from the models' (Alembic's autogenerate comparison)."""
    with connection(url) as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        return list(compare_metadata(context, metadata))


def indexes(url: str, table: str) -> dict[str, list[str]]:
    """`table`'s indexes by name, with their columns."""
    engine = make_engine(url)
    try:
        return {str(i["name"]): list(i["column_names"]) for i in inspect(engine).get_indexes(table)}
    finally:
        engine.dispose()


def task_row(task_id: str = "t1", status: str = "waiting", trigger_id: str = "trig") -> str:
    """The INSERT of a task at generation 1, in the columns every revision since has: the rows
    a migration test writes before the upgrade, in SQL (the models are the head's schema)."""
    return (
        "INSERT INTO tasks (task_id, task_type, title, context, trigger_id, origin, status,"
        f" generation, created_at, updated_at) VALUES ('{task_id}', 'x', 't', '{{}}',"
        f" '{trigger_id}', 'live', '{status}', 1, '2026-01-01', '2026-01-01')"
    )


def index_definition(url: str, name: str) -> str:
    """The index `name` as the store says it (its CREATE INDEX statement), predicate included."""
    with connection(url) as conn:
        if conn.dialect.name == "sqlite":
            query = "SELECT sql FROM sqlite_master WHERE name = :name"
        else:
            query = "SELECT indexdef FROM pg_indexes WHERE indexname = :name"
        return str(conn.execute(text(query), {"name": name}).scalar_one())


def invalid_indexes(url: str) -> list[str]:
    """The Postgres indexes that are not valid or not ready: what a concurrent build that
    failed leaves behind."""
    with connection(url) as conn:
        found = conn.execute(
            text(
                "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
                " WHERE NOT i.indisvalid OR NOT i.indisready ORDER BY c.relname"
            )
        )
        return [str(name) for name in found.scalars()]


def migrate_beside_writers(
    url: str,
    migrate: Callable[[], None],
    *,
    held: str,
    writes: Sequence[str],
    statement: str = "CREATE INDEX",
    within: float = 30.0,
) -> None:
    """Run `migrate` (on the Postgres store at `url`) while a transaction that ran `held` is
    open, as a dispatcher's is on a live store. Once the migration's `statement` waits on a lock
    (the held transaction's), `writes` run in one transaction of another writer whose lock
    timeout is 2 s: a DDL statement that queues writers behind it makes them fail with that
    timeout (raised here); one built CONCURRENTLY lets them in at once. The held transaction
    then commits and the migration finishes; its error, if any, is raised here too."""
    failures: list[BaseException] = []

    def run() -> None:
        try:
            migrate()
        except BaseException as error:  # reported by the caller, not lost in the thread
            failures.append(error)

    engine = make_engine(url)
    try:
        with engine.connect() as holder:
            holder.execute(text("BEGIN"))
            holder.execute(text(held))
            thread = threading.Thread(target=run)
            thread.start()
            try:
                _wait_for_the_migration_to_wait(url, statement, within)
                with connection(url) as writer:
                    writer.execute(text("SET LOCAL lock_timeout = '2s'"))
                    for write in writes:
                        writer.execute(text(write))
            finally:
                holder.execute(text("COMMIT"))
                thread.join(timeout=60)
    finally:
        engine.dispose()
    assert not thread.is_alive(), "the migration did not finish within 60 s of the commit"
    if failures:
        raise failures[0]


def _wait_for_the_migration_to_wait(url: str, statement: str, within: float) -> None:
    """Until a session's query that starts with `statement` (a regular expression) waits on a
    lock."""
    deadline = time.monotonic() + within
    with connection(url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            waiting = conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                    " AND query ~* :statement"
                ),
                # Alembic's DDL starts on a new line.
                {"statement": rf"^\s*{statement}"},
            ).scalar_one()
            if waiting:
                return
            time.sleep(0.05)
    raise AssertionError(f"the migration's {statement} did not wait within {within} s")
