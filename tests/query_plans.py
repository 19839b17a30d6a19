"""How many rows the statements of a read make Postgres scan: what the deep-page tests assert
and `bench/list_pages.py` reports (EXPLAIN ANALYZE of each SELECT the read sent, replayed), or
split into the rows read from tables and the index entries read alone (`table_and_index_rows`);
and how many rows a read's statements hand to Python, on either store (`rows_returned`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import event, text

from orchestrator.store import Database

__all__ = ["rows_returned", "rows_scanned", "sqlite_plans", "table_and_index_rows", "vacuumed"]


def rows_scanned(db: Database, read: Callable[[Any], Any], *, show: bool = False) -> int:
    """Rows the scans of the statements `read(conn)` sends returned or discarded by a filter
    (`show`: print each statement's plan)."""
    return sum(_scanned(plan) for plan in _plans(db, read, show=show))


def table_and_index_rows(
    db: Database, read: Callable[[Any], Any], *, of: str | None = None, show: bool = False
) -> tuple[int, int]:
    """Of the rows the scans of `read(conn)`'s statements (of table `of` only, if given)
    returned or discarded: those read from tables (an index-only scan's heap fetches among
    them), and the index entries an index-only scan answered from the index alone."""
    table = index = 0
    for plan in _plans(db, read, show=show):
        for node in _nodes(plan):
            if of is not None and node.get("Relation Name") != of:
                continue
            # Per loop, as `_scanned` counts them: times the loops (0 when it never ran).
            loops = float(node.get("Actual Loops", 1))
            per_loop = float(node.get("Actual Rows", 0)) + float(
                node.get("Rows Removed by Filter", 0)
            )
            rows = round(per_loop * loops)
            if node["Node Type"] == "Index Only Scan":
                # EXPLAIN gives an index-only scan's heap fetches for all its loops together.
                fetched = int(node.get("Heap Fetches", 0))
                table, index = table + fetched, index + rows - fetched
            elif "Scan" in node["Node Type"] and node["Node Type"] != "Bitmap Index Scan":
                table += rows
    return table, index


def _plans(db: Database, read: Callable[[Any], Any], *, show: bool) -> list[dict[str, Any]]:
    """The executed plan of each SELECT `read(conn)` sends, replayed with EXPLAIN ANALYZE."""
    plans = []
    with db.transaction(readonly=True) as conn:
        for statement, params in _sent(db, read):
            if not statement.lstrip().upper().startswith("SELECT"):
                continue
            explain = f"EXPLAIN (ANALYZE, FORMAT JSON) {statement}"
            [[plan]] = conn.exec_driver_sql(explain, params).fetchall()
            if show:
                print(statement[:80], plan[0]["Plan"])
            plans.append(plan[0]["Plan"])
    return plans


def sqlite_plans(db: Database, read: Callable[[Any], Any]) -> list[str]:
    """SQLite's EXPLAIN QUERY PLAN of each SELECT `read(conn)` sends: each step's detail
    (`SEARCH outbox USING COVERING INDEX ...`, `SCAN actions`)."""
    details = []
    with db.transaction(readonly=True) as conn:
        for statement, params in _sent(db, read):
            if statement.lstrip().upper().startswith("SELECT"):
                plan = conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", params)
                details.extend(str(row[-1]) for row in plan)
    return details


def _nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    return [node, *(child for plan in node.get("Plans", []) for child in _nodes(plan))]


def _sent(db: Database, read: Callable[[Any], Any]) -> list[tuple[str, Any]]:
    """The statements (and parameters) `read(conn)` sends, in a read-only transaction."""
    sent: list[tuple[str, Any]] = []

    def keep(_conn: Any, _cursor: Any, statement: str, params: Any, *_: Any) -> None:
        sent.append((statement, params))

    event.listen(db.engine, "before_cursor_execute", keep)
    try:
        with db.transaction(readonly=True) as conn:
            read(conn)
    finally:
        event.remove(db.engine, "before_cursor_execute", keep)
    return sent


def _scanned(node: dict[str, Any]) -> int:
    # A bitmap heap scan's rows are its bitmap index scan's: counted once, at the heap.
    # EXPLAIN gives a node's rows (returned and filtered out) per loop, averaged and rounded;
    # a scan that runs once per outer row (a nested loop's inner side, a correlated
    # subquery) reads them each time: times its loops (0 when it never ran).
    own = 0
    if "Scan" in node["Node Type"] and node["Node Type"] != "Bitmap Index Scan":
        per_loop = float(node["Actual Rows"]) + float(node.get("Rows Removed by Filter", 0))
        own = round(per_loop * float(node["Actual Loops"]))
    return own + sum(_scanned(child) for child in node.get("Plans", []))


def rows_returned(db: Database, read: Callable[[Any], Any]) -> tuple[int, int]:
    """How many statements `read(conn)` sends and how many rows their SELECTs hand to Python
    (each replayed and fetched), on either store: a read that counts in SQL returns its counts,
    one that counts in Python returns every row it counts."""
    sent = _sent(db, read)
    returned = 0
    with db.transaction(readonly=True) as conn:
        for statement, params in sent:
            if statement.lstrip().upper().startswith("SELECT"):
                returned += len(conn.exec_driver_sql(statement, params).fetchall())
    return len(sent), returned


def vacuumed(db: Database, *tables: str, within: float = 5.0) -> None:
    """VACUUM ANALYZE, as autovacuum leaves a store: statistics, and each page of `tables`
    all-visible (the visibility map an index-only scan needs, which the planner weighs). Again
    until it is: just after a write, a snapshot still open in the cluster (another test's
    teardown) leaves the new rows' pages as they were, for a moment."""
    deadline = time.monotonic() + within
    with db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE"))
        while True:
            pages = conn.execute(
                text(
                    "SELECT relname, relpages, relallvisible FROM pg_class WHERE relname = ANY(:t)"
                ),
                {"t": list(tables)},
            ).all()
            behind = [row.relname for row in pages if row.relallvisible < row.relpages]
            if not behind:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"pages of {behind} still not all-visible after {within} s")
            time.sleep(0.1)
            conn.execute(text(f"VACUUM {', '.join(behind)}"))
