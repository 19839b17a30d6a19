"""The count of rows a read makes Postgres scan (`tests/query_plans.rows_scanned`, what the
deep-page tests bound) counts a scan each time it runs: an inner scan of a nested loop, or a
correlated subquery, reads its rows once per outer row. Before, it counted them once, as
EXPLAIN reports them (per loop), so a read that scans a table per row looked as cheap as one
that scans it once."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import text

from orchestrator.store import Database
from tests.query_plans import rows_scanned


@pytest.fixture
def db(pg_empty_url: str) -> Iterator[Database]:
    database = Database.from_url(pg_empty_url)
    with database.transaction() as conn:
        conn.execute(text("CREATE TABLE outer_rows (id int PRIMARY KEY)"))
        conn.execute(text("CREATE TABLE inner_rows (id int PRIMARY KEY, k int NOT NULL)"))
        conn.execute(text("INSERT INTO outer_rows SELECT g FROM generate_series(1, 10) g"))
        conn.execute(text("INSERT INTO inner_rows SELECT g, g % 10 FROM generate_series(1, 100) g"))
        conn.execute(text("ANALYZE outer_rows"))
        conn.execute(text("ANALYZE inner_rows"))
    yield database
    database.dispose()


def test_a_scan_run_once_per_outer_row_counts_its_rows_each_time(db: Database) -> None:
    # No index on inner_rows.k: the correlated subquery scans all 100 rows for each outer row.
    def per_row(conn: Any) -> None:
        conn.execute(
            text(
                "SELECT o.id, (SELECT count(*) FROM inner_rows i WHERE i.k = o.id % 10) "
                "FROM outer_rows o"
            )
        ).fetchall()

    def once(conn: Any) -> None:
        conn.execute(text("SELECT count(*) FROM inner_rows")).fetchall()

    assert rows_scanned(db, once) == 100
    assert rows_scanned(db, per_row) == 10 + 10 * 100  # was 10 + 100
