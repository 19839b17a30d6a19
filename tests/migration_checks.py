"""What the migration tests read of a store at a URL, on SQLite and Postgres alike: its
difference from the models, its indexes, a transaction or an autocommit connection on it (each
on an engine of its own, disposed after). They run on `empty_url` (tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection, inspect

from orchestrator.store import make_engine, metadata

__all__ = ["connection", "differences", "indexes"]


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
