"""Migration 0029: the indexes an open task page reads, built on a live store.

On Postgres they are built CONCURRENTLY, outside the migration's transaction: a transaction
that writes deliveries or actions while they are built is not held up (a plain CREATE INDEX
waits for the writers before it and holds up every writer after it). The embedded SQLite
store gets the same indexes.
"""

from __future__ import annotations

from sqlalchemy import text

from orchestrator.store.migrations import current_revision, downgrade, upgrade
from tests.migration_checks import (
    connection,
    differences,
    indexes,
    invalid_indexes,
    migrate_beside_writers,
    task_row,
)

INDEXES = {
    "ix_outbox_settled": ("outbox", ["task_id", "kind", "status"]),
    "ix_actions_task_id_created_at_action_id": ("actions", ["task_id", "created_at", "action_id"]),
    "ix_actions_pending_task_id": ("actions", ["task_id"]),
}

ROWS = [
    task_row(),
    "INSERT INTO sessions (session_id, purpose, task_id, generation, owner, title, created_at,"
    " updated_at) VALUES ('s1', 'task_execution', 't1', 1, 'task:t1', 't', '2026-01-01',"
    " '2026-01-01')",
    "INSERT INTO outbox (kind, task_id, event_seq, body, status, attempts, next_attempt_at,"
    " created_at, delivered_at) VALUES ('webhook', 't1', 1, '{}', 'delivered', 1,"
    " '2026-01-01', '2026-01-01', '2026-01-01')",
    "INSERT INTO actions (action_id, task_id, generation, session_id, node_id, kind, payload,"
    " status, decided_by, created_at, digest) VALUES ('a1', 't1', 1, 's1', 'n1', 'command',"
    " '{}', 'approved', 'ops', '2026-01-01', '" + "0" * 64 + "')",
]


def test_0029_builds_the_task_page_s_indexes_and_rows_of_before_stay(empty_url: str) -> None:
    upgrade(empty_url, "0028")
    with connection(empty_url) as conn:
        for statement in ROWS:
            conn.execute(text(statement))
    upgrade(empty_url)
    assert differences(empty_url) == []
    for name, (table, columns) in INDEXES.items():
        assert indexes(empty_url, table)[name] == columns
    with connection(empty_url) as conn:
        assert conn.execute(text("SELECT count(*) FROM outbox")).scalar_one() == 1
        assert conn.execute(text("SELECT action_id FROM actions")).scalar_one() == "a1"

    downgrade(empty_url, "0028")
    assert current_revision(empty_url) == "0028"
    for name, (table, _) in INDEXES.items():
        assert name not in indexes(empty_url, table)
    upgrade(empty_url)
    assert differences(empty_url) == []


def test_0029_an_index_an_interrupted_build_left_is_built_anew(pg_empty_url: str) -> None:
    """Postgres keeps the index of a concurrent build that failed (invalid, not used), and
    the store stays at 0028: the next upgrade builds it again rather than failing on its
    name."""
    upgrade(pg_empty_url, "0028")
    with connection(pg_empty_url) as conn:
        conn.execute(text("CREATE INDEX ix_outbox_settled ON outbox (task_id)"))
    upgrade(pg_empty_url)
    assert indexes(pg_empty_url, "outbox")["ix_outbox_settled"] == INDEXES["ix_outbox_settled"][1]
    assert differences(pg_empty_url) == []


def test_0029_deliveries_and_actions_are_written_while_its_indexes_are_built(
    pg_empty_url: str,
) -> None:
    """A dispatcher's transaction is open on the outbox when the upgrade starts: the build
    waits for it, and meanwhile another writer's delivery and action go in at once (a plain
    CREATE INDEX queues them behind it: their lock_timeout ran out)."""
    upgrade(pg_empty_url, "0028")
    with connection(pg_empty_url) as conn:
        for statement in ROWS:
            conn.execute(text(statement))
    migrate_beside_writers(
        pg_empty_url,
        lambda: upgrade(pg_empty_url, "0029"),
        held="UPDATE outbox SET attempts = attempts + 1, status = 'delivered' WHERE task_id = 't1'",
        writes=[
            "INSERT INTO outbox (kind, task_id, event_seq, body, status, next_attempt_at,"
            " created_at) VALUES ('webhook', 't1', 2, '{}', 'pending', now(), now())",
            "INSERT INTO actions (action_id, task_id, generation, session_id, node_id, kind,"
            " payload, status, created_at, digest) VALUES ('a2', 't1', 1, 's1', 'n2',"
            " 'command', '{}', 'pending_approval', now(), repeat('1', 64))",
        ],
    )
    assert current_revision(pg_empty_url) == "0029"
    assert invalid_indexes(pg_empty_url) == []
    with connection(pg_empty_url) as conn:
        assert conn.execute(text("SELECT count(*) FROM outbox")).scalar_one() == 2
    for name, (table, columns) in INDEXES.items():
        assert indexes(pg_empty_url, table)[name] == columns
