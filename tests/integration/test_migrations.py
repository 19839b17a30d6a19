"""Alembic builds exactly the models' schema, and takes it down again, on both databases."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text

from orchestrator.store import make_engine, metadata
from orchestrator.store.migrations import current_revision, downgrade, head_revision, upgrade


@pytest.fixture(params=["sqlite", "postgres"])
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'empty.db'}"
    return str(request.getfixturevalue("pg_empty_url"))


def _tables(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return set(inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def _differences(url: str) -> list[object]:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"compare_type": True})
            return list(compare_metadata(context, metadata))
    finally:
        engine.dispose()


def test_upgrade_builds_the_models_schema_without_difference(empty_url: str) -> None:
    upgrade(empty_url)
    assert current_revision(empty_url) == head_revision()
    assert _tables(empty_url) == set(metadata.tables)
    assert _differences(empty_url) == []


def test_downgrade_removes_everything_and_upgrade_again_works(empty_url: str) -> None:
    upgrade(empty_url)
    downgrade(empty_url, "base")
    assert _tables(empty_url) == set()
    assert current_revision(empty_url) is None
    upgrade(empty_url)
    assert _tables(empty_url) == set(metadata.tables)
    assert _differences(empty_url) == []


def _receipt_fk_ondelete(url: str) -> str | None:
    engine = make_engine(url)
    try:
        (fk,) = inspect(engine).get_foreign_keys("invocation_receipts")
        return fk.get("options", {}).get("ondelete")
    finally:
        engine.dispose()


def _task_indexes(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return {str(index["name"]) for index in inspect(engine).get_indexes("tasks")}
    finally:
        engine.dispose()


def test_0002_receipts_outlive_sessions_and_tasks_index_queued(empty_url: str) -> None:
    upgrade(empty_url, "0001")
    assert (_receipt_fk_ondelete(empty_url) or "").upper() == "CASCADE"
    engine = make_engine(empty_url)
    now = "2026-01-01 00:00:00+00:00"
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO sessions (session_id, purpose, owner, title, created_at,"
                    " updated_at) VALUES ('s1', 'ordinary_chat', 'alice', 't', :now, :now)"
                ),
                {"now": now},
            )
            conn.execute(
                text(
                    "INSERT INTO invocation_receipts (invocation_id, owner, session_id,"
                    " tool_name, identity_key, args_digest, claim_token, status, summary,"
                    " created_at, updated_at) VALUES ('i1', 'alice', 's1', 'call_api', 'k',"
                    " :digest, 'tok', 'unknown', 's', :now, :now)"
                ),
                {"now": now, "digest": "0" * 64},
            )
    finally:
        engine.dispose()

    upgrade(empty_url)
    assert (_receipt_fk_ondelete(empty_url) or "").upper() == "SET NULL"
    assert "ix_tasks_status_queued_at" in _task_indexes(empty_url)
    assert _differences(empty_url) == []
    engine = make_engine(empty_url)
    try:
        with engine.begin() as conn:
            # The rebuilt SQLite table kept its rows; deleting the session orphans the receipt.
            conn.execute(text("DELETE FROM sessions WHERE session_id = 's1'"))
            row = conn.execute(
                text("SELECT session_id, status FROM invocation_receipts WHERE invocation_id='i1'")
            ).one()
        assert tuple(row) == (None, "unknown")
    finally:
        engine.dispose()

    downgrade(empty_url, "0001")
    assert (_receipt_fk_ondelete(empty_url) or "").upper() == "CASCADE"
    assert "ix_tasks_status_queued_at" not in _task_indexes(empty_url)
