"""Wake-ups are announced after their unit of work commits, never for one that failed, and a
failing announcer never turns a committed write into an error."""

from __future__ import annotations

import time
from collections.abc import Collection

import pytest
from sqlalchemy import text

from orchestrator.store.db import Database, wake_after_commit


class Recorder:
    def __init__(self, db: Database) -> None:
        self.db = db
        self.calls: list[tuple[set[str], int]] = []

    def __call__(self, keys: Collection[str]) -> None:
        # What a stream woken now would read: the committed row count.
        with self.db.transaction(readonly=True) as conn:
            count = conn.execute(text("SELECT count(*) FROM wake_probe")).scalar_one()
        self.calls.append((set(keys), int(count)))


@pytest.fixture
def probe(db: Database) -> Recorder:
    with db.transaction() as conn:
        conn.execute(text("CREATE TABLE wake_probe (n integer)"))
    recorder = Recorder(db)
    db.after_commit = recorder
    return recorder


def test_keys_are_announced_once_the_write_is_visible(db: Database, probe: Recorder) -> None:
    with db.transaction() as conn:
        conn.execute(text("INSERT INTO wake_probe VALUES (1)"))
        wake_after_commit(conn, "task:a")
        wake_after_commit(conn, "task:b")
        wake_after_commit(conn, "task:a")
    with db.transaction() as conn:  # the next unit of work: its own keys, its own write
        conn.execute(text("INSERT INTO wake_probe VALUES (2)"))
        wake_after_commit(conn, "task:c")
    with db.transaction(readonly=True) as conn:  # marks nothing: announces nothing
        conn.execute(text("SELECT 1"))
    assert probe.calls == [({"task:a", "task:b"}, 1), ({"task:c"}, 2)]


def test_a_failed_unit_of_work_announces_nothing_and_leaves_nothing_behind(
    db: Database, probe: Recorder
) -> None:
    with pytest.raises(RuntimeError), db.transaction() as conn:
        conn.execute(text("INSERT INTO wake_probe VALUES (1)"))
        wake_after_commit(conn, "task:rolled-back")
        raise RuntimeError("the unit of work fails")
    # The pooled connection comes back clean: the next unit announces only its own keys.
    with db.transaction() as conn:
        conn.execute(text("INSERT INTO wake_probe VALUES (2)"))
        wake_after_commit(conn, "task:next")
    assert probe.calls == [({"task:next"}, 1)]


def test_a_failing_announcer_does_not_fail_the_committed_write(db: Database) -> None:
    with db.transaction() as conn:
        conn.execute(text("CREATE TABLE wake_probe (n integer)"))

    def broken(_keys: Collection[str]) -> None:
        raise OSError("the broker is gone")

    db.after_commit = broken
    with db.transaction() as conn:
        conn.execute(text("INSERT INTO wake_probe VALUES (1)"))
        wake_after_commit(conn, "task:a")
    with db.transaction(readonly=True) as conn:
        assert conn.execute(text("SELECT count(*) FROM wake_probe")).scalar_one() == 1


@pytest.mark.parametrize("keys", [["task:one"], ["task:a", "task:b", "task:c"]])
def test_the_redis_notifier_publishes_each_key_once(redis_url: str, keys: list[str]) -> None:
    import redis

    from orchestrator.events import RedisNotifier
    from orchestrator.leases.keys import PLAN_CHANNEL_PREFIX

    listener = redis.Redis.from_url(redis_url)
    subscription = listener.pubsub(ignore_subscribe_messages=True)
    subscription.subscribe(*(f"{PLAN_CHANNEL_PREFIX}{key}" for key in keys))
    for _ in keys:  # the confirmations: subscribed before anything is published
        subscription.get_message(timeout=5)
    notifier = RedisNotifier(redis_url)
    try:
        notifier.wake_keys(keys)
        heard: list[str] = []
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # None for a subscribe confirmation, or nothing
            message = subscription.get_message(timeout=0.2)
            if message is not None:
                heard.append(message["channel"].decode()[len(PLAN_CHANNEL_PREFIX) :])
            elif len(heard) >= len(keys):
                break
        assert sorted(heard) == sorted(keys)
    finally:
        notifier.close()
        subscription.close()
        listener.close()


@pytest.mark.parametrize("keys", [["task:one"], ["task:a", "ended:a"]])
def test_change_notices_redis_refused_are_not_called_task_wake_ups(
    keys: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    """Redis away: one line that says what was not published. Before, "2 wake-ups not
    published" after an operator's requeue read as the task's own wake-up lost."""
    from orchestrator.events import RedisNotifier
    from tests.services import refused_port

    notifier = RedisNotifier(f"redis://127.0.0.1:{refused_port()}/0")
    try:
        notifier.wake_keys(keys)
    finally:
        notifier.close()
    [record] = [r for r in caplog.records if r.name == "orchestrator.events"]
    message = record.getMessage()
    assert "wake-up" not in message
    assert f"{len(keys)} change notice(s) for streams and running rounds" in message
    assert "\n" not in message
