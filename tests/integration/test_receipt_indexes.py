"""The receipt look-ups use the index meant for them, on a table Postgres has never analyzed.

A new deployment's first minute (before autovacuum's first ANALYZE) is when the planner has no
statistics; a claim's read back by (owner, identity_key) then once went through the content
index and filtered every receipt of the owner.
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
from sqlalchemy import event

from orchestrator.store import Database, fastclaim
from orchestrator.store.receipts import ReceiptLedger
from tests.integration.receipt_rows import DIGEST

OWNER = "task:indexed"
RECEIPTS = 3000
UNIQUE = "uq_invocation_receipts_owner_identity_key"
CONTENT = "ix_invocation_receipts_owner_tool_name_args_digest"


@pytest.fixture
def filled(pg_url: str) -> str:
    """One owner with many finished receipts and a few unresolved ones; never analyzed."""
    with psycopg.connect(pg_url.replace("+psycopg", ""), autocommit=True) as conn:
        conn.execute("ALTER TABLE invocation_receipts SET (autovacuum_enabled = false)")
        conn.execute(
            "INSERT INTO invocation_receipts (invocation_id, owner, session_id, tool_name, "
            "identity_key, args_digest, claim_token, status, summary, created_at, updated_at) "
            "SELECT 'id-' || n, %s, NULL, 'call_api', 'key-' || n, %s, 'token-' || n, "
            "CASE WHEN n %% 100 = 0 THEN 'unknown' ELSE 'succeeded' END, 'done', now(), now() "
            "FROM generate_series(1, %s) AS n",
            (OWNER, DIGEST, RECEIPTS),
        )
        row = conn.execute(
            "SELECT reltuples FROM pg_class WHERE relname = 'invocation_receipts'"
        ).fetchone()
        assert row is not None
        assert row[0] < 0  # never analyzed: the planner has no statistics
    return pg_url


def _indexes_used(pg_url: str, statement: str, params: Any) -> set[str]:
    with psycopg.connect(pg_url.replace("+psycopg", ""), autocommit=True) as conn:
        row = conn.execute(f"EXPLAIN (FORMAT JSON) {statement}", params).fetchone()  # type: ignore[arg-type]
    assert row is not None
    found: set[str] = set()

    def walk(node: dict[str, Any]) -> None:
        if node.get("Relation Name") == "invocation_receipts":
            found.add(node.get("Index Name", node["Node Type"]))
        for child in node.get("Plans", []):
            walk(child)

    plan = row[0] if isinstance(row[0], list) else json.loads(row[0])
    walk(plan[0]["Plan"])
    return found


def _as_server_params(statement: str) -> str:
    """fastclaim's native `$n` placeholders, for EXPLAIN with psycopg's client-side ones."""
    for number in range(len(fastclaim.COLUMNS), 0, -1):
        statement = statement.replace(f"${number}", f"%(p{number})s")
    return statement


def _claim_params(identity: str) -> dict[str, Any]:
    values = dict.fromkeys(fastclaim.COLUMNS, "x")
    values.update(owner=OWNER, identity_key=identity, status="running")
    values.update(created_at=None, updated_at=None)
    return {f"p{n}": values[name] for n, name in enumerate(fastclaim.COLUMNS, start=1)}


def test_a_claims_read_back_uses_the_unique_index(filled: str) -> None:
    read = _as_server_params(fastclaim._READ)
    assert _indexes_used(filled, read, {"p1": OWNER, "p2": "key-7"}) == {UNIQUE}


def test_the_claim_statement_reads_the_standing_row_by_the_unique_index(filled: str) -> None:
    claim = _as_server_params(fastclaim._CLAIM)
    used = _indexes_used(filled, claim, _claim_params("key-7"))
    assert CONTENT not in used
    assert UNIQUE in used


def test_the_look_up_of_an_unresolved_identical_write_uses_the_partial_index(
    filled: str,
) -> None:
    db = Database.from_url(filled)
    seen: list[tuple[str, Any]] = []

    def capture(_conn: Any, _cursor: Any, statement: str, params: Any, *_: Any) -> None:
        seen.append((statement, params))

    event.listen(db.engine, "before_cursor_execute", capture)
    try:
        found = ReceiptLedger(db).find_unresolved(
            owner=OWNER, tool_name="call_api", args_digest=DIGEST
        )
    finally:
        event.remove(db.engine, "before_cursor_execute", capture)
        db.dispose()
    assert found is not None
    assert found.status == "unknown"
    (statement, params), *_ = [item for item in seen if "invocation_receipts" in item[0]]
    assert "'running'" in statement  # the statuses as literals, not parameters
    assert "'unknown'" in statement
    assert _indexes_used(filled, statement, params) == {CONTENT}
