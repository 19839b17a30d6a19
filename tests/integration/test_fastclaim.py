"""The claim's answer is the stored receipt on every path; the Postgres fast claim's retry."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC
from typing import Any

import psycopg
import pytest
import sqlalchemy.exc

from orchestrator.domain.fingerprints import fingerprint
from orchestrator.errors import ConflictError
from orchestrator.store import Database, driver_psycopg
from orchestrator.store import driver as driver_module
from orchestrator.store.receipts import Claim, Receipt, ReceiptLedger
from tests.integration.receipt_rows import chat_session, claim_arguments


def _claim(ledger: ReceiptLedger, session_id: str | None, **overrides: Any) -> Claim:
    return ledger.claim(**claim_arguments(session_id, **overrides))


def _assert_well_formed(receipt: Receipt) -> None:
    assert str(uuid.UUID(receipt.invocation_id)) == receipt.invocation_id
    assert uuid.UUID(receipt.invocation_id).version == 4
    assert len(receipt.claim_token) == 32
    int(receipt.claim_token, 16)
    assert receipt.created_at.tzinfo is UTC
    assert receipt.updated_at.tzinfo is UTC


def test_winner_and_loser_get_the_stored_receipt(db: Database) -> None:
    session_id = chat_session(db)
    ledger = ReceiptLedger(db)
    winner = _claim(ledger, session_id)
    loser = _claim(ledger, session_id)
    stored = ledger.get(winner.receipt.invocation_id)
    assert (winner.granted, loser.granted) == (True, False)
    assert winner.receipt == stored
    assert loser.receipt == stored
    assert stored is not None
    assert (stored.status, stored.session_id, stored.tool_name) == (
        "running",
        session_id,
        "call_api",
    )
    _assert_well_formed(winner.receipt)
    _assert_well_formed(loser.receipt)


def test_ids_and_tokens_are_fresh_per_claim(db: Database) -> None:
    ledger = ReceiptLedger(db)
    claims = [_claim(ledger, None, identity_key=f"key-{i}") for i in range(200)]
    assert len({claim.receipt.invocation_id for claim in claims}) == 200
    assert len({claim.receipt.claim_token for claim in claims}) == 200


class _LosesTheAnswer:
    """A cursor whose statement runs (and commits: autocommit) but whose answer is lost."""

    def __init__(self, cursor: Any) -> None:
        self.cursor = cursor
        self.connection = cursor.connection

    def execute(self, query: str, params: Any) -> Any:
        self.cursor.execute(query, params)
        raise psycopg.OperationalError("server closed the connection unexpectedly")


@pytest.fixture
def pg_db(pg_url: str) -> Iterator[Database]:
    database = Database.from_url(pg_url)
    yield database
    database.dispose()


def _lose_answers(monkeypatch: pytest.MonkeyPatch, count: int) -> list[_LosesTheAnswer]:
    take = driver_psycopg._Connections.take
    lost: list[_LosesTheAnswer] = []

    def losing_take(self: Any) -> tuple[Any, int]:
        cursor, epoch = take(self)
        if len(lost) < count:
            lost.append(_LosesTheAnswer(cursor))
            return lost[-1], epoch
        return cursor, epoch

    monkeypatch.setattr(driver_psycopg._Connections, "take", losing_take)
    return lost


def test_a_lost_answer_is_retried_once_and_grants_once(
    pg_db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    session_id = chat_session(pg_db)
    ledger = ReceiptLedger(pg_db)
    lost = _lose_answers(monkeypatch, 1)
    claim = _claim(ledger, session_id)
    assert len(lost) == 1
    assert lost[0].connection.closed  # a connection that lost an answer is not kept
    # The retry sent the same row: it found its own committed insert and was granted.
    assert claim.granted
    assert claim.receipt == ledger.get(claim.receipt.invocation_id)
    _assert_well_formed(claim.receipt)
    assert len(ledger.list_for_owner("alice")) == 1
    again = _claim(ledger, session_id)
    assert not again.granted
    assert again.receipt == claim.receipt


def test_two_lost_answers_raise(pg_db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    ledger = ReceiptLedger(pg_db)
    _lose_answers(monkeypatch, 2)
    # SQLAlchemy's class, as every other store failure: the rounds tell infrastructure by it.
    with pytest.raises(sqlalchemy.exc.OperationalError) as raised:
        _claim(ledger, None)
    assert isinstance(raised.value.orig, psycopg.OperationalError)
    monkeypatch.undo()
    # The first attempt committed: the identity stays claimed by it, never granted to another.
    after = _claim(ledger, None)
    assert not after.granted


def test_fast_claim_conflict_names_the_standing_invocation(pg_db: Database) -> None:
    ledger = ReceiptLedger(pg_db)
    first = _claim(ledger, None)
    with pytest.raises(ConflictError) as conflict:
        _claim(ledger, None, args_digest=fingerprint({"value": 2}))
    assert conflict.value.code == "invocation_conflict"
    assert conflict.value.details == [
        {"code": "invocation_conflict", "invocation_id": first.receipt.invocation_id}
    ]


def test_dispose_closes_the_kept_connections(pg_db: Database) -> None:
    ledger = ReceiptLedger(pg_db)
    _claim(ledger, None)
    cache = driver_module.connections_for(pg_db.engine)
    kept = list(cache.idle)
    assert kept
    pg_db.dispose()
    assert not cache.idle
    assert all(cursor.connection.closed for cursor in kept)
    assert not _claim(ledger, None).granted  # a new connection after the dispose


def test_many_claiming_threads_open_at_most_the_pool_size_of_connections(
    pg_db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A threads-pool worker: many executions claim at once through one process's cache.
    import threading

    cache = driver_module.connections_for(pg_db.engine)
    opened: list[int] = []
    connect = driver_psycopg.psycopg.connect

    def counting_connect(*args: Any, **kwargs: Any) -> Any:
        opened.append(1)
        return connect(*args, **kwargs)

    monkeypatch.setattr(driver_psycopg.psycopg, "connect", counting_connect)
    ledger = ReceiptLedger(pg_db)
    barrier = threading.Barrier(40)
    granted: list[bool] = []

    def claim_some(n: int) -> None:
        barrier.wait(timeout=30)
        for i in range(3):
            granted.append(_claim(ledger, None, identity_key=f"t{n}-{i}").granted)

    threads = [threading.Thread(target=claim_some, args=(n,)) for n in range(40)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert granted == [True] * 120
    assert len(opened) <= cache.size  # never a connection per thread
    assert len(cache.idle) <= cache.size
