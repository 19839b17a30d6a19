"""How many rows the statements of a read make Postgres scan: what the deep-page tests assert
and `bench/list_pages.py` reports (EXPLAIN ANALYZE of each SELECT the read sent, replayed); and
how many rows a read's statements hand to Python, on either store (`rows_returned`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import event

from orchestrator.store import Database

__all__ = ["rows_returned", "rows_scanned"]


def rows_scanned(db: Database, read: Callable[[Any], Any], *, show: bool = False) -> int:
    """Rows the scans of the statements `read(conn)` sends returned or discarded by a filter
    (`show`: print each statement's plan)."""
    sent = _sent(db, read)
    total = 0
    with db.transaction(readonly=True) as conn:
        for statement, params in sent:
            if not statement.lstrip().upper().startswith("SELECT"):
                continue
            explain = f"EXPLAIN (ANALYZE, FORMAT JSON) {statement}"
            [[plan]] = conn.exec_driver_sql(explain, params).fetchall()
            if show:
                print(statement[:80], plan[0]["Plan"])
            total += _scanned(plan[0]["Plan"])
    return total


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
