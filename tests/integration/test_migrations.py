"""Alembic builds exactly the models' schema, and takes it down again, on both databases."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from sqlalchemy import Connection, inspect, text
from sqlalchemy.exc import IntegrityError

from orchestrator.store import executions as execution_store
from orchestrator.store import make_engine, metadata, outbox_operator, outbox_sending, outbox_views
from orchestrator.store import tasks as task_store
from orchestrator.store.lost import Limits, requeue_lost
from orchestrator.store.migrations import current_revision, downgrade, head_revision, upgrade
from orchestrator.store.outbox import OutboxRow
from tests.migration_checks import differences


def _tables(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return set(inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def test_upgrade_builds_the_models_schema_without_difference(empty_url: str) -> None:
    upgrade(empty_url)
    assert current_revision(empty_url) == head_revision()
    assert _tables(empty_url) == set(metadata.tables)
    assert differences(empty_url) == []


def test_downgrade_removes_everything_and_upgrade_again_works(empty_url: str) -> None:
    upgrade(empty_url)
    downgrade(empty_url, "base")
    assert _tables(empty_url) == set()
    assert current_revision(empty_url) is None
    upgrade(empty_url)
    assert _tables(empty_url) == set(metadata.tables)
    assert differences(empty_url) == []


#: When the rows a migration test writes were written (bound as `:now`).
_NOW = "2026-01-01 00:00:00+00:00"


@contextmanager
def _transaction(url: str) -> Iterator[Connection]:
    """One transaction on the store at `url`, its engine disposed after."""
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            yield conn
    finally:
        engine.dispose()


def _write_at(url: str, revision: str, *statements: str) -> None:
    """The store upgraded to `revision`, then rows written in raw SQL of that revision's schema
    (pinned: the models describe the head's), `:now` bound to `_NOW`."""
    upgrade(url, revision)
    with _transaction(url) as conn:
        for statement in statements:
            conn.execute(text(statement), {"now": _NOW})


def _round_trip(url: str, revision: str) -> None:
    """Down to `revision` and up again: the models' schema, without difference."""
    downgrade(url, revision)
    upgrade(url)
    assert differences(url) == []


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
    with _transaction(empty_url) as conn:
        conn.execute(
            text(
                "INSERT INTO sessions (session_id, purpose, owner, title, created_at,"
                " updated_at) VALUES ('s1', 'ordinary_chat', 'alice', 't', :now, :now)"
            ),
            {"now": _NOW},
        )
        conn.execute(
            text(
                "INSERT INTO invocation_receipts (invocation_id, owner, session_id,"
                " tool_name, identity_key, args_digest, claim_token, status, summary,"
                " created_at, updated_at) VALUES ('i1', 'alice', 's1', 'call_api', 'k',"
                " :digest, 'tok', 'unknown', 's', :now, :now)"
            ),
            {"now": _NOW, "digest": "0" * 64},
        )

    upgrade(empty_url)
    assert (_receipt_fk_ondelete(empty_url) or "").upper() == "SET NULL"
    assert "ix_tasks_status_queued_at" in _task_indexes(empty_url)
    assert differences(empty_url) == []
    with _transaction(empty_url) as conn:
        # The rebuilt SQLite table kept its rows; deleting the session orphans the receipt.
        conn.execute(text("DELETE FROM sessions WHERE session_id = 's1'"))
        row = conn.execute(
            text("SELECT session_id, status FROM invocation_receipts WHERE invocation_id='i1'")
        ).one()
    assert tuple(row) == (None, "unknown")

    downgrade(empty_url, "0001")
    assert (_receipt_fk_ondelete(empty_url) or "").upper() == "CASCADE"
    assert "ix_tasks_status_queued_at" not in _task_indexes(empty_url)


def _outbox_id_types(url: str) -> tuple[str, str | None]:
    """The outbox id column's type, and (Postgres) the type of the sequence behind it."""
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            if engine.dialect.name != "postgresql":
                [column] = [
                    c
                    for c in conn.execute(text("PRAGMA table_info(outbox)"))
                    if c[1] == "outbox_id"
                ]
                return str(column[2]).upper(), None
            column_type = conn.execute(
                text(
                    "SELECT data_type FROM information_schema.columns"
                    " WHERE table_name = 'outbox' AND column_name = 'outbox_id'"
                )
            ).scalar_one()
            sequence_type = conn.execute(
                text(
                    "SELECT data_type::text FROM pg_sequences"
                    " WHERE sequencename = 'outbox_outbox_id_seq'"
                )
            ).scalar_one()
            return str(column_type).upper(), str(sequence_type).upper()
    finally:
        engine.dispose()


def _insert_outbox_row(conn: Connection, body: str, outbox_id: int | None = None) -> int:
    columns = "kind, task_id, action_id, body, status, attempts, next_attempt_at, created_at"
    values = "'action', 't1', :action, :body, 'pending', 0, :now, :now"
    if outbox_id is not None:
        columns, values = f"outbox_id, {columns}", f":outbox_id, {values}"
    params = {"action": f"a-{body}", "body": body, "now": _NOW, "outbox_id": outbox_id}
    conn.execute(text(f"INSERT INTO outbox ({columns}) VALUES ({values})"), params)
    return int(
        conn.execute(text("SELECT outbox_id FROM outbox WHERE body = :body"), params).scalar_one()
    )


def test_0012_outbox_ids_are_64_bit_on_postgres_and_keep_their_rows(empty_url: str) -> None:
    upgrade(empty_url, "0011")
    postgres = empty_url.startswith("postgresql")
    assert _outbox_id_types(empty_url) == (
        ("INTEGER", "INTEGER") if postgres else ("INTEGER", None)
    )
    with _transaction(empty_url) as conn:
        conn.execute(
            text(
                "INSERT INTO tasks (task_id, task_type, title, context, trigger_id, origin,"
                " status, generation, created_at, updated_at) VALUES ('t1', 'x', 't', '{}',"
                " 'trig', 'live', 'queued', 1, :now, :now)"
            ),
            {"now": _NOW},
        )
        before = _insert_outbox_row(conn, "before")

    upgrade(empty_url)
    # SQLite's INTEGER PRIMARY KEY is already 64 bits (and the rowid: autoincrement stays).
    assert _outbox_id_types(empty_url) == (("BIGINT", "BIGINT") if postgres else ("INTEGER", None))
    assert differences(empty_url) == []
    with _transaction(empty_url) as conn:
        assert (
            conn.execute(
                text("SELECT body FROM outbox WHERE outbox_id = :id"), {"id": before}
            ).scalar_one()
            == "before"
        )
        after = _insert_outbox_row(conn, "after")  # the sequence goes on where it was
        assert after > before
        if postgres:  # past the 32-bit range: the sequence as well as the column
            conn.execute(text("SELECT setval('outbox_outbox_id_seq', 2147483647)"))
        else:
            _insert_outbox_row(conn, "high", 2**31 - 1)
        assert _insert_outbox_row(conn, "beyond") == 2**31
        conn.execute(text("DELETE FROM outbox WHERE outbox_id >= :low"), {"low": 2**31 - 1})
        if postgres:  # a downgrade is refused while the sequence is past the 32-bit range
            conn.execute(text("SELECT setval('outbox_outbox_id_seq', :id)"), {"id": after})

    downgrade(empty_url, "0011")
    assert _outbox_id_types(empty_url) == (
        ("INTEGER", "INTEGER") if postgres else ("INTEGER", None)
    )
    upgrade(empty_url)
    assert differences(empty_url) == []


def test_0013_rows_of_before_count_no_hand_backs_and_a_loss_is_a_recovery(empty_url: str) -> None:
    _write_at(
        empty_url,
        "0012",
        "INSERT INTO tasks (task_id, task_type, title, context, trigger_id, origin, status,"
        " generation, recoveries, created_at, updated_at) VALUES ('t1', 'x', 't', '{}', 'trig',"
        " 'live', 'running', 1, 2, :now, :now)",
        "INSERT INTO executions (task_id, generation, session_id, lease_token, lease_expires_at,"
        " created_at, started_at) VALUES ('t1', 1, 's1', 'tok', :now, :now, :now)",
    )

    upgrade(empty_url)
    assert differences(empty_url) == []
    with _transaction(empty_url) as conn:
        task = task_store.get_task(conn, "t1")
        execution = execution_store.get_execution(conn, "t1", 1)
        assert task is not None
        assert execution is not None
        assert (task.recoveries, task.handbacks, execution.handed_back_at) == (2, 0, None)
        # The generation a worker of before left running is a lost worker: the third parks.
        batch = requeue_lost(conn, [("t1", 1)], reason="expired", limits=Limits(3, 10))
        assert batch.parked == [("t1", 1)]
        parked = task_store.get_task(conn, "t1")
        assert parked is not None
        assert (parked.status, parked.recoveries, parked.handbacks) == ("failed", 3, 0)
    _round_trip(empty_url, "0012")


def test_0014_outbox_rows_of_before_have_no_throttled_attempts_and_keep_their_count(
    empty_url: str,
) -> None:
    _write_at(
        empty_url,
        "0013",
        "INSERT INTO tasks (task_id, task_type, title, context, trigger_id, origin, status,"
        " generation, created_at, updated_at) VALUES ('t1', 'x', 't', '{}', 'trig', 'live',"
        " 'waiting', 1, :now, :now)",
        "INSERT INTO outbox (kind, task_id, event_seq, body, status, attempts, next_attempt_at,"
        " last_error, created_at) VALUES ('webhook', 't1', 3, '{}', 'pending', 2, :now,"
        " 'HTTP 429', :now)",
    )

    upgrade(empty_url)
    assert differences(empty_url) == []
    with _transaction(empty_url) as conn:
        [row] = outbox_views.list_rows(conn, task_id="t1")
        # Its attempts were counted before, 429s too: they still count toward the limit.
        assert (row.attempts, row.throttled, row.counted) == (2, 0, 2)
        [claimed] = outbox_sending.claim_due(conn, ("webhook",), limit=1, hold_seconds=60)
        assert outbox_sending.mark_failed(
            conn, claimed, "HTTP 429", retry_at=claimed.next_attempt_at, dead=False,
            throttled=True,
        )  # fmt: skip
        assert outbox_views.get_row(conn, row.outbox_id) == OutboxRow(
            **{**claimed.__dict__, "throttled": 1, "last_error": "HTTP 429", "claimed_until": None}
        )
    _round_trip(empty_url, "0013")


def test_0015_outbox_rows_of_before_are_brought_within_their_attempts(empty_url: str) -> None:
    row = (
        "INSERT INTO outbox (kind, task_id, event_seq, body, status, attempts, throttled,"
        " next_attempt_at, created_at) VALUES ('webhook', 't1', {seq}, '{{}}', 'pending',"
        " {attempts}, {throttled}, :now, :now)"
    )
    _write_at(
        empty_url,
        "0014",
        "INSERT INTO tasks (task_id, task_type, title, context, trigger_id, origin, status,"
        " generation, created_at, updated_at) VALUES ('t1', 'x', 't', '{}', 'trig', 'live',"
        " 'waiting', 1, :now, :now)",
        row.format(seq=1, attempts=3, throttled=1),  # within bounds: kept
        row.format(seq=2, attempts=1, throttled=4),  # a hand edit: all its attempts throttled
        row.format(seq=3, attempts=2, throttled=-1),  # a hand edit: none throttled
    )

    upgrade(empty_url)
    assert differences(empty_url) == []
    with _transaction(empty_url) as conn:
        rows = outbox_views.list_rows(conn, task_id="t1")
        assert sorted((r.event_seq, r.attempts, r.throttled) for r in rows) == [
            (1, 3, 1),
            (2, 1, 1),
            (3, 2, 0),
        ]
    with pytest.raises(IntegrityError), _transaction(empty_url) as conn:
        conn.execute(text("UPDATE outbox SET throttled = attempts + 1"))
    _round_trip(empty_url, "0014")
    with pytest.raises(IntegrityError), _transaction(empty_url) as conn:
        conn.execute(text("UPDATE outbox SET throttled = -1"))


def test_0017_every_action_is_listed_from_an_index_and_rows_of_before_stay(
    empty_url: str,
) -> None:
    _write_at(
        empty_url,
        "0016",
        "INSERT INTO tasks (task_id, task_type, title, context, trigger_id, origin, status,"
        " generation, created_at, updated_at) VALUES ('t1', 'x', 't', '{}', 'trig', 'live',"
        " 'waiting', 1, :now, :now)",
        "INSERT INTO sessions (session_id, purpose, task_id, generation, owner, title,"
        " created_at, updated_at) VALUES ('s1', 'task_execution', 't1', 1, 'task:t1', 't',"
        " :now, :now)",
        "INSERT INTO actions (action_id, task_id, generation, session_id, node_id, kind,"
        " payload, status, decided_by, created_at, digest) VALUES ('a1', 't1', 1, 's1', 'n',"
        " 'command', '{}', 'approved', 'ops', :now, 'd')",
    )

    upgrade(empty_url)
    assert differences(empty_url) == []
    engine = make_engine(empty_url)
    try:
        indexes = {i["name"]: i["column_names"] for i in inspect(engine).get_indexes("actions")}
    finally:
        engine.dispose()
    assert indexes["ix_actions_created_at_action_id"] == ["created_at", "action_id"]
    with _transaction(empty_url) as conn:
        rows = conn.execute(text("SELECT action_id FROM actions")).scalars().all()
        assert rows == ["a1"]
    _round_trip(empty_url, "0016")


def test_0018_console_sign_outs_are_kept_until_their_cookie_expires(empty_url: str) -> None:
    _write_at(empty_url, "0017")
    upgrade(empty_url)
    assert differences(empty_url) == []
    engine = make_engine(empty_url)
    try:
        inspector = inspect(engine)
        columns = [c["name"] for c in inspector.get_columns("console_signouts")]
        indexes = {i["name"]: i["column_names"] for i in inspector.get_indexes("console_signouts")}
    finally:
        engine.dispose()
    assert columns[:3] == ["nonce", "expires_at", "signed_out_at"]  # 0020 adds `account`
    assert indexes["ix_console_signouts_expires_at"] == ["expires_at"]
    _round_trip(empty_url, "0017")


def test_0019_a_task_s_evidence_is_listed_from_an_index_and_rows_of_before_stay(
    empty_url: str,
) -> None:
    _write_at(
        empty_url,
        "0018",
        "INSERT INTO tasks (task_id, task_type, title, context, trigger_id, origin, status,"
        " generation, created_at, updated_at) VALUES ('t1', 'x', 't', '{}', 'trig', 'live',"
        " 'completed', 1, :now, :now)",
        "INSERT INTO sessions (session_id, purpose, task_id, generation, owner, title,"
        " created_at, updated_at) VALUES ('s1', 'task_execution', 't1', 1, 'task:t1', 't',"
        " :now, :now)",
        "INSERT INTO evidence (evidence_id, task_id, generation, session_id, source, queried_at,"
        " content_ref, origin, truncated, summary, created_at) VALUES ('e1', 't1', 1, 's1',"
        " 'scada_sim', :now, 'sha256:0', 'synthetic', false, 'read', :now)",
    )

    upgrade(empty_url)
    assert differences(empty_url) == []
    engine = make_engine(empty_url)
    try:
        indexes = {i["name"]: i["column_names"] for i in inspect(engine).get_indexes("evidence")}
    finally:
        engine.dispose()
    assert indexes["ix_evidence_task_id_created_at_evidence_id"] == [
        "task_id",
        "created_at",
        "evidence_id",
    ]
    with _transaction(empty_url) as conn:
        rows = conn.execute(text("SELECT evidence_id FROM evidence")).scalars().all()
        assert rows == ["e1"]
    _round_trip(empty_url, "0018")


def test_0020_sign_outs_name_their_account_and_rows_of_before_stay(empty_url: str) -> None:
    _write_at(
        empty_url,
        "0019",
        "INSERT INTO console_signouts (nonce, expires_at, signed_out_at) VALUES ('n1', :now, :now)",
    )
    upgrade(empty_url)
    assert differences(empty_url) == []
    with _transaction(empty_url) as conn:
        rows = conn.execute(text("SELECT nonce, account FROM console_signouts")).all()
        assert [tuple(row) for row in rows] == [("n1", None)]
        assert conn.execute(text("SELECT count(*) FROM console_account_signouts")).scalar() == 0
    _round_trip(empty_url, "0019")


def test_0021_a_dead_letter_can_be_discarded_and_a_downgrade_makes_it_dead_again(
    empty_url: str,
) -> None:
    _write_at(
        empty_url,
        "0020",
        "INSERT INTO tasks (task_id, task_type, title, context, trigger_id, origin, status,"
        " generation, created_at, updated_at) VALUES ('t1', 'x', 't', '{}', 'trig', 'live',"
        " 'waiting', 1, :now, :now)",
        "INSERT INTO outbox (kind, task_id, event_seq, body, status, attempts, next_attempt_at,"
        " created_at) VALUES ('webhook', 't1', 1, '{}', 'dead', 1, :now, :now)",
    )
    upgrade(empty_url)
    assert differences(empty_url) == []
    with _transaction(empty_url) as conn:
        [row] = outbox_views.list_rows(conn, task_id="t1")
        assert (row.status, row.discarded_by) == ("dead", None)  # a row of before: as it was
        assert outbox_operator.discard(conn, row.outbox_id, by="ops", reason="by phone")
    with pytest.raises(IntegrityError), _transaction(empty_url) as conn:
        conn.execute(text("UPDATE outbox SET status = 'lost'"))
    downgrade(empty_url, "0020")
    with _transaction(empty_url) as conn:
        assert conn.execute(text("SELECT status FROM outbox")).scalar_one() == "dead"
        with pytest.raises(IntegrityError):
            conn.execute(text("UPDATE outbox SET status = 'discarded'"))
    _round_trip(empty_url, "0020")


def test_0022_leaves_an_empty_store_s_tasks_unanalysed(pg_empty_url: str) -> None:
    """Analysed empty, a new store's `tasks` was planned as an empty table: the cached plans of
    every connection (a foreign-key check per transcript entry, event and record; the fenced
    reads) scanned the table as it grew, about 1.5 ms of Postgres's CPU per execution more in
    bench/executions.py. Never analysed, it is planned as a table of some pages, by its indexes;
    autovacuum gathers its statistics as it grows."""
    upgrade(pg_empty_url)
    with _transaction(pg_empty_url) as conn:
        reltuples = conn.execute(
            text("SELECT reltuples FROM pg_class WHERE relname = 'tasks'")
        ).scalar_one()
        statistics = conn.execute(
            text("SELECT count(*) FROM pg_statistic_ext WHERE stxname = 'tasks_status_task_type'")
        ).scalar_one()
    assert reltuples == -1  # never analysed (0 once analysed empty)
    assert statistics == 1  # the pair statistics are declared, for autovacuum to gather
