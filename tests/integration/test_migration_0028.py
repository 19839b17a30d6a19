"""Migration 0028: the outbox's index of each task's rows not yet delivered or discarded, built
on a live store.

On Postgres it is built CONCURRENTLY, outside the migration's transaction: every task event
queues a webhook, and a plain CREATE INDEX held up each of those writes until the build was
over (it waits for the writers before it, and every writer after it waits for it). The embedded
SQLite store gets the same partial index.
"""

from __future__ import annotations

import re

import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError

from orchestrator.store.migrations import current_revision, downgrade, upgrade
from tests.migration_checks import (
    connection,
    differences,
    index_definition,
    indexes,
    invalid_indexes,
    migrate_beside_writers,
    task_row,
)

NAME, COLUMNS = "ix_outbox_unsettled", ["task_id", "kind", "event_seq"]


def _webhook(seq: int, status: str) -> str:
    return (
        "INSERT INTO outbox (kind, task_id, event_seq, body, status, attempts, next_attempt_at,"
        f" created_at) VALUES ('webhook', 't1', {seq}, '{{}}', '{status}', 1, '2026-01-01',"
        " '2026-01-01')"
    )


#: A task's webhooks at 0027: delivered, discarded, still to send, dead.
ROWS = [task_row(), _webhook(1, "delivered"), _webhook(2, "discarded"), _webhook(3, "pending"),
        _webhook(4, "dead")]  # fmt: skip


def _at_0027_with_rows(url: str) -> None:
    upgrade(url, "0027")
    with connection(url) as conn:
        for statement in ROWS:
            conn.execute(text(statement))


def test_0028_builds_the_partial_index_and_goes_down_and_up_again(empty_url: str) -> None:
    _at_0027_with_rows(empty_url)
    upgrade(empty_url, "0028")
    assert current_revision(empty_url) == "0028"
    assert indexes(empty_url, "outbox")[NAME] == COLUMNS
    _, _, predicate = " ".join(index_definition(empty_url, NAME).lower().split()).partition(
        " where "
    )
    # SQLite keeps the statement as sent, Postgres says NOT IN as `<> ALL (ARRAY[...])`.
    assert re.search(r"status.*(not in|<> all).*'delivered'.*'discarded'", predicate), predicate
    upgrade(empty_url)
    assert differences(empty_url) == []

    downgrade(empty_url, "0027")
    assert current_revision(empty_url) == "0027"
    assert NAME not in indexes(empty_url, "outbox")
    with connection(empty_url) as conn:
        assert conn.execute(text("SELECT count(*) FROM outbox")).scalar_one() == 4
    upgrade(empty_url)
    assert indexes(empty_url, "outbox")[NAME] == COLUMNS
    assert differences(empty_url) == []


def test_0028_webhooks_are_queued_while_its_index_is_built(pg_empty_url: str) -> None:
    """A dispatcher's transaction is open on the outbox when the upgrade starts: the build
    waits for it, and meanwhile a task event's webhook goes in at once (the plain CREATE INDEX
    of before queued it behind the build: its lock_timeout ran out)."""
    _at_0027_with_rows(pg_empty_url)
    migrate_beside_writers(
        pg_empty_url,
        lambda: upgrade(pg_empty_url, "0028"),
        held="UPDATE outbox SET attempts = attempts + 1 WHERE task_id = 't1' AND event_seq = 3",
        writes=[_webhook(5, "pending")],
    )
    assert current_revision(pg_empty_url) == "0028"
    assert invalid_indexes(pg_empty_url) == []
    assert indexes(pg_empty_url, "outbox")[NAME] == COLUMNS
    with connection(pg_empty_url) as conn:
        assert conn.execute(text("SELECT count(*) FROM outbox")).scalar_one() == 5


def test_0028_webhooks_are_queued_while_its_index_is_dropped(pg_empty_url: str) -> None:
    """The downgrade drops the index CONCURRENTLY too: a plain DROP INDEX takes the table
    whole and holds every writer behind a transaction open on it."""
    _at_0027_with_rows(pg_empty_url)
    upgrade(pg_empty_url, "0028")
    migrate_beside_writers(
        pg_empty_url,
        lambda: downgrade(pg_empty_url, "0027"),
        held="UPDATE outbox SET attempts = attempts + 1 WHERE task_id = 't1' AND event_seq = 3",
        writes=[_webhook(5, "pending")],
        statement="DROP INDEX",
    )
    assert current_revision(pg_empty_url) == "0027"
    assert NAME not in indexes(pg_empty_url, "outbox")


def test_0028_run_again_after_an_interruption_before_its_stamp_finishes(
    pg_empty_url: str,
) -> None:
    """The index was built but the store not stamped (the process stopped between the two):
    the next upgrade builds it again rather than failing on its name."""
    upgrade(pg_empty_url, "0028")
    with connection(pg_empty_url) as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '0027'"))
    upgrade(pg_empty_url, "0028")
    assert current_revision(pg_empty_url) == "0028"
    assert indexes(pg_empty_url, "outbox")[NAME] == COLUMNS
    upgrade(pg_empty_url)
    assert differences(pg_empty_url) == []


def test_0028_the_invalid_index_a_failed_concurrent_build_left_is_built_anew(
    pg_empty_url: str,
) -> None:
    """A concurrent build that fails leaves its index behind, invalid (never used, yet kept
    up to date by every write), and the store at 0027: the next upgrade drops it and builds
    the index anew."""
    _at_0027_with_rows(pg_empty_url)
    with connection(pg_empty_url, autocommit=True) as conn, pytest.raises(IntegrityError):
        # t1's four webhooks share a task_id: the unique build fails half-way.
        conn.execute(text(f"CREATE UNIQUE INDEX CONCURRENTLY {NAME} ON outbox (task_id)"))
    assert invalid_indexes(pg_empty_url) == [NAME]
    upgrade(pg_empty_url, "0028")
    assert invalid_indexes(pg_empty_url) == []
    assert indexes(pg_empty_url, "outbox")[NAME] == COLUMNS
    upgrade(pg_empty_url)
    assert differences(pg_empty_url) == []
