"""Shared fixtures: real Postgres and Redis servers, a migrated database of each test's own, as
new (`tests.databases`).

A missing server binary skips the tests that need it locally, and fails them when `CI` is set.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from orchestrator.agent.openai_model import close_clients
from orchestrator.store import Database
from orchestrator.store.migrations import upgrade
from tests import leaks
from tests.databases import TemplateCopies
from tests.openai_server import OpenAIServer
from tests.services import PostgresServer, RedisServer, ServiceMissing, service_unavailable

_STARTED: dict[str, str] = {}

#: The processes the tests start (workers, the API, the CLI) import this checkout's code, not
#: the checkout the virtualenv's editable install points at (another git worktree).
ROOT = Path(__file__).resolve().parent.parent
os.environ["PYTHONPATH"] = os.pathsep.join(
    part for part in (str(ROOT), os.environ.get("PYTHONPATH")) if part
)

leaks.watch_psycopg()


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """A real Postgres server for the whole session, with a migrated template database."""
    server = PostgresServer()
    try:
        server.start()
    except ServiceMissing as exc:
        server.stop()
        service_unavailable(str(exc))
    _STARTED["Postgres"] = server.version
    with server.connect() as conn:
        conn.execute("CREATE DATABASE orch_template")
    upgrade(server.url("orch_template"))
    with server.connect() as conn:
        conn.execute("ALTER DATABASE orch_template WITH IS_TEMPLATE true")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def _template_copies(postgres: PostgresServer) -> Iterator[TemplateCopies]:
    copies = TemplateCopies(postgres, "orch_template")
    yield copies
    copies.close()


@pytest.fixture
def pg_url(postgres: PostgresServer, _template_copies: TemplateCopies) -> Iterator[str]:
    """A database of the test's own, migrated to head, as a new copy of the template is (one a
    test before it gave back emptied, or a new copy: `tests.databases`)."""
    name = _template_copies.take()
    yield postgres.url(name)
    _template_copies.give_back(name)


@pytest.fixture
def pg_empty_url(postgres: PostgresServer) -> Iterator[str]:
    """A fresh empty database (no schema), dropped after the test."""
    name = postgres.create_database()
    yield postgres.url(name)
    postgres.drop_database(name)


@pytest.fixture(params=["sqlite", "postgres"])
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty store (no schema) on each database: what the migration tests build on."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'empty.db'}"
    return str(request.getfixturevalue("pg_empty_url"))


@pytest.fixture(scope="session")
def _sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sqlite-template") / "template.db"
    upgrade(f"sqlite:///{path}")
    return path


@pytest.fixture
def sqlite_url(_sqlite_template: Path, tmp_path: Path) -> str:
    """A fresh SQLite file migrated to head."""
    path = tmp_path / "store.db"
    shutil.copyfile(_sqlite_template, path)
    return f"sqlite:///{path}"


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest) -> str:
    """The same test against both stores."""
    fixture = "sqlite_url" if request.param == "sqlite" else "pg_url"
    return str(request.getfixturevalue(fixture))


@pytest.fixture
def db(store_url: str) -> Iterator[Database]:
    database = Database.from_url(store_url)
    yield database
    database.dispose()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """A real redis-server for the whole session (no persistence)."""
    server = RedisServer()
    try:
        server.start()
    except ServiceMissing as exc:
        service_unavailable(str(exc))
    _STARTED["Redis"] = server.version
    yield server
    server.close()


@pytest.fixture
def redis_of_its_own() -> Iterator[RedisServer]:
    """A redis-server of the test's own, which it may stop and start (an outage)."""
    server = RedisServer()
    try:
        server.start()
    except ServiceMissing as exc:
        service_unavailable(str(exc))
    yield server
    server.close()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """The session's Redis, emptied for this test."""
    if redis_server.process is None or redis_server.process.poll() is not None:
        redis_server.start()
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    return redis_server.url


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Once the last test of a file and the file's fixtures are torn down, what its tests left
    open for the garbage collector fails that test here (`tests.leaks`), not whichever later
    test the collector's warning would have failed."""
    try:
        return (yield)
    finally:
        if nextitem is None or nextitem.path != item.path:
            _locate_leaks(item, last=nextitem is None)


def _locate_leaks(item: pytest.Item, *, last: bool) -> None:
    # pytest lets go of the fixtures' values, and of a failed test's frames, only after this
    # hook: let go of them first, or what they hold is found after the next file instead.
    if hasattr(item, "funcargs"):
        item.funcargs = {}
    for name in ("last_type", "last_value", "last_traceback", "last_exc"):
        if hasattr(sys, name):
            delattr(sys, name)
    found = leaks.check(last=last)
    if found:
        listed = "\n".join(f"  - {line}" for line in found)
        pytest.fail(
            f"the tests of {item.path.name} left open for the garbage collector, which would "
            f"have failed whichever test ran when it came to it:\n{listed}",
            pytrace=False,
        )


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Under pytest-xdist, a test process hands what it started to the controller; pytest's
    own last garbage collection sees every object (the leak locator froze those it kept)."""
    leaks.unfreeze()
    output = getattr(session.config, "workeroutput", None)
    if output is not None:
        output["orch_started"] = dict(_STARTED)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """The controller (pytest-xdist) collects what each test process started."""
    _STARTED.update(getattr(node, "workeroutput", {}).get("orch_started", {}))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _STARTED:
        listed = ", ".join(f"{name} {version}" for name, version in sorted(_STARTED.items()))
        terminalreporter.write_line(f"real services used by this run: {listed}")


@pytest.fixture(autouse=True)
def _close_model_clients() -> Iterator[None]:
    """Tests start model servers of their own: close the process's shared clients after each
    test, so no pooled socket is left for the garbage collector to warn about in a later one."""
    yield
    close_clients()


@pytest.fixture(autouse=True)
def _keep_logging() -> Iterator[None]:
    """A command run in process (`outbox dispatch --once`, the sweeper's) configures the
    process's logging: give the root logger back after each test, and stop capturing warnings
    into it. Left capturing, `logging` takes a later `captureWarnings(True)` for done and a
    warning goes to pytest instead of the log line a test reads. The project's own loggers get
    their levels back too: a command quiets a service's logger for the line it says itself
    (`recover` the sweeper's, a write command the dispatcher's), and once quieted in this
    process the sweeper's outage warning never reached a later test that reads it."""
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    levels = _project_levels()
    yield
    root.handlers, root.level = saved
    for name, logger in logging.root.manager.loggerDict.items():
        if isinstance(logger, logging.Logger) and name.startswith(("orchestrator", "workers")):
            logger.setLevel(levels.get(name, logging.NOTSET))
    logging.captureWarnings(False)


def _project_levels() -> dict[str, int]:
    """The levels of the project's loggers as they are set now."""
    return {
        name: logger.level
        for name, logger in logging.root.manager.loggerDict.items()
        if isinstance(logger, logging.Logger) and name.startswith(("orchestrator", "workers"))
    }


@pytest.fixture
def scripts(tmp_path: Path) -> Path:
    """The folder of a test's scripted-model scripts (`ORCH_MODEL=scripted:<it>`)."""
    return tmp_path / "scripts"


@pytest.fixture
def server() -> Iterator[OpenAIServer]:
    """The OpenAI-compatible model server on loopback that the model-client tests talk to."""
    with OpenAIServer() as running:
        yield running
