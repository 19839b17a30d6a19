"""The harness itself: the servers are the real ones, at the versions the product targets."""

from __future__ import annotations

import redis
from sqlalchemy import text

from orchestrator.store import Database
from tests.services import PostgresServer, RedisServer


def test_postgres_is_real_and_version_15_or_later(postgres: PostgresServer, pg_url: str) -> None:
    assert int(postgres.version.split(".")[0]) >= 15
    database = Database.from_url(pg_url)
    with database.transaction() as conn:
        assert conn.execute(text("select count(*) from tasks")).scalar_one() == 0
    database.dispose()


def test_redis_is_real_and_version_7_or_later(redis_server: RedisServer, redis_url: str) -> None:
    assert int(redis_server.version.split(".")[0]) >= 7
    client = redis.Redis.from_url(redis_url)
    client.set("probe", "1")
    assert client.get("probe") == b"1"
    client.close()
