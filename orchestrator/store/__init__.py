"""The durable store: SQLAlchemy 2 Core tables and repositories (Postgres or SQLite)."""

from __future__ import annotations

from orchestrator.store.db import Database, make_engine
from orchestrator.store.tables import metadata

__all__ = ["Database", "make_engine", "metadata"]
