"""Alembic, driven from Python: `orchestrator db upgrade` and the tests use these."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError

from orchestrator.store.db import make_engine

__all__ = [
    "alembic_config",
    "current_revision",
    "downgrade",
    "head_revision",
    "is_known",
    "upgrade",
]

_ROOT = Path(__file__).resolve().parents[2]


def alembic_config(url: str) -> Config:
    """An Alembic config for `url` that does not touch the caller's logging."""
    config = Config(str(_ROOT / "alembic.ini"))
    config.set_main_option("script_location", str(_ROOT / "alembic"))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    config.attributes["configure_logging"] = False
    return config


def upgrade(url: str, revision: str = "head") -> None:
    """Migrate the database at `url` up to `revision`."""
    make_engine(url).dispose()  # creates the SQLite folder when needed
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str) -> None:
    """Migrate the database at `url` down to `revision` (`base` removes everything)."""
    command.downgrade(alembic_config(url), revision)


@cache
def _scripts() -> ScriptDirectory:
    """This code's migration scripts, read once a process: reading them runs each of them
    (a worker's start checked the store's revision against them three times)."""
    return ScriptDirectory.from_config(alembic_config("sqlite://"))


def head_revision() -> str | None:
    return _scripts().get_current_head()


def is_known(revision: str) -> bool:
    """Whether this code has `revision`: one it does not know was made by a newer version."""
    try:
        return _scripts().get_revision(revision) is not None
    except CommandError:
        return False


def current_revision(url: str) -> str | None:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()
