"""What a store error means, in one line: not migrated, wrong credentials, host unreachable.

The CLI's answer used to be "unavailable or not migrated: run `orchestrator db upgrade`" for any
of them, which sends an operator with a wrong password to run migrations. The driver's own text
is matched here (Postgres via psycopg, and SQLite), with the password masked by `one_line`.
"""

from __future__ import annotations

from sqlalchemy.exc import OperationalError, ProgrammingError, SQLAlchemyError

from orchestrator.cli.common import one_line, safe_store_url

__all__ = ["describe_store_error"]

_AUTH = ("password authentication failed", "authentication failed", "no password supplied")
_HOST = (
    "connection refused",
    "could not translate host name",
    "name or service not known",
    "temporary failure in name resolution",
    "no route to host",
    "timeout expired",
    "connection timed out",
    "network is unreachable",
    "could not connect",
)


def _why(exc: SQLAlchemyError) -> str:
    text = str(getattr(exc, "orig", None) or exc).lower()
    kind = type(getattr(exc, "orig", None)).__name__.lower()
    if any(p in text for p in _AUTH):
        return "is refusing the credentials (authentication failed): check ORCH_DATABASE_URL"
    if "role" in text and ("does not exist" in text or "not permitted to log in" in text):
        return "is refusing the credentials (no such user): check ORCH_DATABASE_URL"
    if "database" in text and "does not exist" in text and "relation" not in text:
        return "has no such database: create it or fix the name in ORCH_DATABASE_URL"
    table_missing = kind == "undefinedtable" or "no such table" in text
    if table_missing or (isinstance(exc, ProgrammingError) and "relation" in text):
        return "is not migrated: run `orchestrator db upgrade`"
    # A column this code reads and the store lacks: a schema older than the code (the package
    # upgraded, the store not yet).
    column_missing = kind == "undefinedcolumn" or "no such column" in text
    if column_missing or ("column" in text and "does not exist" in text):
        return "is not migrated to this code's schema: run `orchestrator db upgrade`"
    if any(p in text for p in _HOST):
        return "is unavailable (cannot reach the database host): is it running?"
    if "unable to open database file" in text:
        return "is unavailable (cannot open the SQLite file): check ORCH_HOME"
    if isinstance(exc, OperationalError):
        return "is unavailable"
    return "failed"


def describe_store_error(exc: SQLAlchemyError) -> str:
    """`the store at URL <what is wrong> (<driver's first line>)`, password masked."""
    store = safe_store_url() or "the configured URL"
    return f"the store at {store} {_why(exc)} ({one_line(exc)})"
