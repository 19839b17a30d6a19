"""Alembic builds exactly the models' schema, and takes it down again, on both databases."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

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
