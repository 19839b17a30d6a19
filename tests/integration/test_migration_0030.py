"""Migration 0030: the executions' lease index holds the claimed open generations only.

The index on (outcome, lease_expires_at) gives way to `ix_executions_open_leases`, on
lease_expires_at for the rows whose outcome is null and lease expiry set. On Postgres both
changes run CONCURRENTLY, outside the migration's transaction; SQLite gets the same index.
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import text

from orchestrator.store import Database
from orchestrator.store.executions import count_handed_back, expired_executions
from orchestrator.store.migrations import current_revision, downgrade, upgrade
from orchestrator.store.types import utcnow
from tests.migration_checks import (
    connection,
    differences,
    index_definition,
    indexes,
    task_row,
)

NEW, OLD = "ix_executions_open_leases", "ix_executions_outcome_lease_expires_at"

EXECUTION = (
    "INSERT INTO executions (task_id, generation, session_id, created_at, lease_token,"
    " lease_expires_at, started_at, handed_back_at) VALUES ('{t}', 1, 's-{t}', '2026-01-01',"
    " {token}, {expires}, {expires}, {handed})"
)
#: A queued generation, one that runs with its lease expired, one handed back.
TASKS = [
    {"t": "queued", "status": "queued", "token": "NULL", "expires": "NULL", "handed": "NULL"},
    {"t": "expired", "status": "running", "token": "'k1'", "expires": "'2026-01-01 00:00:00'",
     "handed": "NULL"},
    {"t": "handed", "status": "running", "token": "'k2'", "expires": "'2026-01-01 00:00:01'",
     "handed": "'2026-01-01 00:00:00'"},
]  # fmt: skip


def test_0030_replaces_the_lease_index_and_the_sweep_s_reads_answer_as_before(
    empty_url: str,
) -> None:
    upgrade(empty_url, "0029")
    with connection(empty_url) as conn:
        for values in TASKS:
            conn.execute(text(task_row(values["t"], values["status"], values["t"])))
            conn.execute(text(EXECUTION.format(**values)))
    upgrade(empty_url)
    assert differences(empty_url) == []
    found = indexes(empty_url, "executions")
    assert (found[NEW], OLD in found) == (["lease_expires_at"], False)
    definition = "".join(index_definition(empty_url, NEW).split()).lower().replace("(", "")
    assert "whereoutcomeisnullandlease_expires_atisnotnull" in definition.replace(")", "")
    db = Database.from_url(empty_url)
    try:
        with db.transaction() as conn:
            now = utcnow() + timedelta(days=3650)
            assert [e.task_id for e in expired_executions(conn, now, 10)] == ["expired", "handed"]
            assert count_handed_back(conn) == 1
    finally:
        db.dispose()

    downgrade(empty_url, "0029")
    assert current_revision(empty_url) == "0029"
    found = indexes(empty_url, "executions")
    assert (found[OLD], NEW in found) == (["outcome", "lease_expires_at"], False)
    upgrade(empty_url)
    assert differences(empty_url) == []
    with connection(empty_url) as conn:
        assert conn.execute(text("SELECT count(*) FROM executions")).scalar_one() == 3


def test_0030_run_again_after_an_interruption_finishes(pg_empty_url: str) -> None:
    """Interrupted after its changes but before the store was stamped (or with the new index
    left invalid by a concurrent build that failed), the next upgrade builds the index anew
    and drops the old one only if it is still there."""
    upgrade(pg_empty_url)
    with connection(pg_empty_url) as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '0029'"))
    upgrade(pg_empty_url)
    assert current_revision(pg_empty_url) == "0030"
    assert differences(pg_empty_url) == []

    downgrade(pg_empty_url, "0029")
    with connection(pg_empty_url) as conn:
        conn.execute(text(f"CREATE INDEX {NEW} ON executions (task_id)"))  # a failed build's
    upgrade(pg_empty_url)
    assert indexes(pg_empty_url, "executions")[NEW] == ["lease_expires_at"]
    assert OLD not in indexes(pg_empty_url, "executions")
    assert differences(pg_empty_url) == []
