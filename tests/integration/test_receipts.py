"""The receipt ledger on Postgres and SQLite: one grant per identity, token fencing, retention."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any, ClassVar

import pytest
from sqlalchemy import delete, select, update

from orchestrator.agent.host import ToolHost
from orchestrator.domain.fingerprints import fingerprint
from orchestrator.domain.outcomes import summary_for
from orchestrator.errors import ConflictError, StaleGeneration
from orchestrator.store import Database
from orchestrator.store.receipts import Claim, ReceiptLedger
from orchestrator.store.tables import invocation_receipts, sessions, tasks
from orchestrator.store.types import utcnow
from orchestrator.tools.base import (
    Tool,
    ToolArguments,
    ToolCall,
    ToolCancelled,
    ToolContext,
    ToolResult,
)
from tests.integration.receipt_rows import (
    DIGEST,
    chat_session,
    claim_arguments,
    dump_database,
    running_task,
    supersede,
)
from tests.processes import preloaded_context
from tests.tool_threads import join_tool_threads

OTHER_DIGEST = fingerprint({"value": 2})
CLAIMERS = 16


def _claim(ledger: ReceiptLedger, session_id: str | None, **overrides: Any) -> Claim:
    return ReceiptLedger(ledger.db).claim(**claim_arguments(session_id, **overrides))


def test_sixteen_threads_one_grant_same_token(db: Database) -> None:
    session_id = chat_session(db)
    ledger = ReceiptLedger(db)
    barrier = threading.Barrier(CLAIMERS)
    claims: list[Claim] = []
    lock = threading.Lock()

    def claimer() -> None:
        barrier.wait()
        claim = _claim(ledger, session_id)
        with lock:
            claims.append(claim)

    threads = [threading.Thread(target=claimer) for _ in range(CLAIMERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(claims) == CLAIMERS
    assert sum(claim.granted for claim in claims) == 1
    assert len({claim.receipt.claim_token for claim in claims}) == 1
    assert len({claim.receipt.invocation_id for claim in claims}) == 1


def _claim_in_process(url: str, session_id: str, barrier: Any, out: Any) -> None:
    database = Database.from_url(url)
    try:
        barrier.wait()
        claim = _claim(ReceiptLedger(database), session_id)
        out.put((claim.granted, claim.receipt.claim_token, claim.receipt.invocation_id))
    finally:
        database.dispose()


@pytest.mark.slow
def test_sixteen_processes_one_grant_same_token(db: Database, store_url: str) -> None:
    session_id = chat_session(db)
    context = preloaded_context(__name__)
    barrier = context.Barrier(CLAIMERS)
    out = context.Queue()
    processes = [
        context.Process(target=_claim_in_process, args=(store_url, session_id, barrier, out))
        for _ in range(CLAIMERS)
    ]
    for process in processes:
        process.start()
    seen = [out.get(timeout=60) for _ in range(CLAIMERS)]
    for process in processes:
        process.join(timeout=60)
        assert process.exitcode == 0
    assert sum(granted for granted, _, _ in seen) == 1
    assert len({token for _, token, _ in seen}) == 1
    assert len({invocation for _, _, invocation in seen}) == 1


def test_same_identity_other_digest_or_tool_is_a_conflict(db: Database) -> None:
    session_id = chat_session(db)
    ledger = ReceiptLedger(db)
    first = _claim(ledger, session_id)
    assert first.granted
    with pytest.raises(ConflictError) as digest_conflict:
        _claim(ledger, session_id, args_digest=OTHER_DIGEST)
    assert digest_conflict.value.code == "invocation_conflict"
    with pytest.raises(ConflictError) as tool_conflict:
        _claim(ledger, session_id, tool_name="execute_command")
    assert tool_conflict.value.code == "invocation_conflict"
    assert len(ledger.list_for_owner("alice")) == 1


def test_owners_and_sessions_are_isolated(db: Database) -> None:
    alice = chat_session(db, "alice")
    alice_other = chat_session(db, "alice")
    bob = chat_session(db, "bob")
    ledger = ReceiptLedger(db)
    assert _claim(ledger, alice).granted
    assert _claim(ledger, bob, owner="bob").granted
    # One identity key, two owners: two grants, two tokens.
    assert len(ledger.list_for_owner("alice")) == 1
    assert len(ledger.list_for_owner("bob")) == 1
    found = ledger.find_unresolved(
        owner="alice", tool_name="call_api", args_digest=DIGEST, session_id=alice
    )
    assert found is not None
    assert found.session_id == alice
    assert (
        ledger.find_unresolved(
            owner="alice", tool_name="call_api", args_digest=DIGEST, session_id=alice_other
        )
        is None
    )
    assert ledger.find_unresolved(owner="carol", tool_name="call_api", args_digest=DIGEST) is None


def test_cold_start_fences_the_old_finisher(db: Database) -> None:
    session_id = chat_session(db)
    ledger = ReceiptLedger(db)
    claim = _claim(ledger, session_id)
    second = _claim(ledger, session_id, identity_key="intent:other")
    assert ledger.cold_start() == 2
    after = ledger.get(claim.receipt.invocation_id)
    assert after is not None
    assert after.status == "unknown"
    assert after.claim_token != claim.receipt.claim_token
    assert not ledger.finish(
        claim.receipt.invocation_id, claim.receipt.claim_token, status="succeeded", summary="x"
    )
    assert not ledger.finish(
        second.receipt.invocation_id, second.receipt.claim_token, status="failed", summary="x"
    )
    still = ledger.get(claim.receipt.invocation_id)
    assert still is not None
    assert still.status == "unknown"
    assert ledger.cold_start() == 0


def test_unknown_is_never_claimed_again(db: Database) -> None:
    session_id = chat_session(db)
    ledger = ReceiptLedger(db)
    first = _claim(ledger, session_id)
    ledger.cold_start()
    again = _claim(ledger, session_id)
    assert not again.granted
    assert again.receipt.invocation_id == first.receipt.invocation_id
    assert again.receipt.status == "unknown"


def test_pending_survives_a_restart(db: Database, store_url: str) -> None:
    session_id = chat_session(db)
    ledger = ReceiptLedger(db)
    claim = _claim(ledger, session_id)
    assert ledger.finish(
        claim.receipt.invocation_id, claim.receipt.claim_token, status="pending", summary="s"
    )
    db.dispose()
    restarted = ReceiptLedger(Database.from_url(store_url))
    try:
        assert restarted.cold_start() == 0
        receipt = restarted.get(claim.receipt.invocation_id)
        assert receipt is not None
        assert receipt.status == "pending"
        again = _claim(restarted, session_id)
        assert not again.granted
        assert again.receipt.status == "pending"
    finally:
        restarted.db.dispose()


def test_claim_and_finish_of_a_superseded_generation_are_refused(db: Database) -> None:
    task_id, session_id, fence = running_task(db)
    ledger = ReceiptLedger(db)
    owner = f"task:{task_id}"
    claim = _claim(ledger, session_id, owner=owner, fence=fence)
    assert claim.granted
    supersede(db, fence)
    with pytest.raises(StaleGeneration):
        ledger.finish(
            claim.receipt.invocation_id,
            claim.receipt.claim_token,
            status="succeeded",
            summary="s",
            fence=fence,
        )
    with pytest.raises(StaleGeneration):
        _claim(ledger, session_id, owner=owner, identity_key="intent:new", fence=fence)
    assert [r.status for r in ledger.list_for_owner(owner)] == ["running"]


def _age(db: Database, invocation_id: str, days: int) -> None:
    with db.transaction() as conn:
        conn.execute(
            update(invocation_receipts)
            .where(invocation_receipts.c.invocation_id == invocation_id)
            .values(updated_at=utcnow() - timedelta(days=days))
        )


def _orphan(ledger: ReceiptLedger, key: str, status: str, days: int) -> str:
    claim = _claim(ledger, None, owner="background", identity_key=key)
    if status != "running":
        ledger.finish(
            claim.receipt.invocation_id, claim.receipt.claim_token, status=status, summary="s"
        )
    _age(ledger.db, claim.receipt.invocation_id, days)
    return claim.receipt.invocation_id


def _task_receipt(
    ledger: ReceiptLedger, task_id: str, session_id: str, key: str, status: str, days: int
) -> str:
    claim = _claim(ledger, session_id, owner=f"task:{task_id}", identity_key=key)
    if status == "unknown":
        with ledger.db.transaction() as conn:
            conn.execute(
                update(invocation_receipts)
                .where(invocation_receipts.c.invocation_id == claim.receipt.invocation_id)
                .values(status="unknown")
            )
    elif status != "running":
        ledger.finish(
            claim.receipt.invocation_id, claim.receipt.claim_token, status=status, summary="s"
        )
    _age(ledger.db, claim.receipt.invocation_id, days)
    return claim.receipt.invocation_id


def _set_task(db: Database, task_id: str, status: str, days: int) -> None:
    with db.transaction() as conn:
        conn.execute(
            update(tasks)
            .where(tasks.c.task_id == task_id)
            .values(status=status, updated_at=utcnow() - timedelta(days=days))
        )


@pytest.mark.parametrize(
    ("enabled", "days", "expect_deleted"),
    [(True, 30, True), (True, 0, False), (False, 30, False)],
    ids=["enabled", "zero-days", "disabled"],
)
def test_cleanup_matrix(db: Database, enabled: bool, days: int, expect_deleted: bool) -> None:
    ledger = ReceiptLedger(db)
    old = {s: _orphan(ledger, f"k-old-{s}", s, 40) for s in ("succeeded", "failed", "pending")}
    recent = _orphan(ledger, "k-recent", "succeeded", 5)
    keep_unknown = _orphan(ledger, "k-unknown", "running", 400)
    ledger.cold_start()
    _age(db, keep_unknown, 400)
    keep_running = _orphan(ledger, "k-running", "running", 400)
    # A chat's receipts go with the chat session, never for age.
    session_id = chat_session(db)
    in_chat = _claim(ledger, session_id, owner="alice")
    ledger.finish(
        in_chat.receipt.invocation_id, in_chat.receipt.claim_token, status="succeeded", summary="s"
    )
    _age(db, in_chat.receipt.invocation_id, 400)
    # A background execution of a task finished long ago: its finished receipts expire.
    done_task, done_session, _ = running_task(db)
    _set_task(db, done_task, "completed", 40)
    expired_of_task = [
        _task_receipt(ledger, done_task, done_session, f"t-{status}", status, 40)
        for status in ("succeeded", "failed", "pending")
    ]
    kept_of_done_task = [
        _task_receipt(ledger, done_task, done_session, "t-unknown", "unknown", 400),
        _task_receipt(ledger, done_task, done_session, "t-running", "running", 400),
        _task_receipt(ledger, done_task, done_session, "t-recent", "succeeded", 5),
    ]
    # Old receipts of a task still running, and of a task that finished only recently, stay.
    live_task, live_session, _ = running_task(db)
    _set_task(db, live_task, "running", 40)
    of_live_task = _task_receipt(ledger, live_task, live_session, "l", "succeeded", 40)
    fresh_task, fresh_session, _ = running_task(db)
    _set_task(db, fresh_task, "failed", 1)
    of_fresh_task = _task_receipt(ledger, fresh_task, fresh_session, "f", "succeeded", 40)

    result = ledger.delete_expired(retention_days=days, enabled=enabled, batch_size=2)

    assert result.enabled is expect_deleted
    assert result.deleted == (6 if expect_deleted else 0)
    assert (result.orphans, result.of_finished_tasks) == ((3, 3) if expect_deleted else (0, 0))
    for invocation_id in [*old.values(), *expired_of_task]:
        assert (ledger.get(invocation_id) is None) is expect_deleted
    for invocation_id in (
        recent,
        keep_unknown,
        keep_running,
        in_chat.receipt.invocation_id,
        *kept_of_done_task,
        of_live_task,
        of_fresh_task,
    ):
        assert ledger.get(invocation_id) is not None
    if expect_deleted:
        assert result.batches == 4  # 3 orphans and 3 task receipts, in batches of 2


def test_finished_receipts_go_with_their_session_running_and_unknown_stay(db: Database) -> None:
    ledger = ReceiptLedger(db)
    session_id = chat_session(db)
    other_session = chat_session(db)
    ids: dict[str, str] = {}
    for status in ("succeeded", "failed", "pending", "running", "unknown"):
        claim = _claim(ledger, session_id, identity_key=f"k-{status}")
        if status in ("succeeded", "failed", "pending"):
            ledger.finish(
                claim.receipt.invocation_id, claim.receipt.claim_token, status=status, summary="s"
            )
        ids[status] = claim.receipt.invocation_id
    with db.transaction() as conn:
        conn.execute(
            update(invocation_receipts)
            .where(invocation_receipts.c.invocation_id == ids["unknown"])
            .values(status="unknown")
        )
    other = _claim(ledger, other_session, identity_key="k-other").receipt
    ledger.finish(other.invocation_id, other.claim_token, status="succeeded", summary="s")
    elsewhere = other.invocation_id

    assert ledger.delete_session(session_id) == 3

    for status in ("succeeded", "failed", "pending"):
        assert ledger.get(ids[status]) is None
    for status in ("running", "unknown"):
        kept = ledger.get(ids[status])
        assert kept is not None
        assert (kept.session_id, kept.status) == (None, status)
    assert ledger.get(elsewhere) is not None
    with db.transaction() as conn:
        assert conn.execute(select(sessions).where(sessions.c.session_id == session_id)).all() == []
    # Now orphans, they are still never deleted for age.
    for status in ("running", "unknown"):
        _age(db, ids[status], 4000)
    assert ledger.delete_expired(retention_days=1).deleted == 0
    assert ledger.get(ids["running"]) is not None
    assert ledger.get(ids["unknown"]) is not None


def test_deleting_a_session_row_orphans_running_receipts(db: Database) -> None:
    """The foreign key sets NULL: a running receipt outlives its session's row."""
    ledger = ReceiptLedger(db)
    session_id = chat_session(db)
    running = _claim(ledger, session_id).receipt.invocation_id
    with db.transaction() as conn:
        conn.execute(delete(sessions).where(sessions.c.session_id == session_id))
    kept = ledger.get(running)
    assert kept is not None
    assert (kept.session_id, kept.status) == (None, "running")


def test_unknown_for_owner_filters_in_sql_newest_first(db: Database) -> None:
    ledger = ReceiptLedger(db)
    session_id = chat_session(db)
    # More than the limit of older receipts in other states, which must not crowd them out.
    for index in range(5):
        claim = _claim(ledger, session_id, owner="task:x", identity_key=f"done-{index}")
        ledger.finish(
            claim.receipt.invocation_id, claim.receipt.claim_token, status="succeeded", summary="s"
        )
        _age(db, claim.receipt.invocation_id, 10)
    unknown = []
    for index in range(3):
        claim = _claim(ledger, session_id, owner="task:x", identity_key=f"u-{index}")
        unknown.append(claim.receipt.invocation_id)
    _claim(ledger, session_id, owner="task:y", identity_key="u-other")
    ledger.cold_start()
    with db.transaction() as conn:
        for age, invocation_id in enumerate(unknown):
            conn.execute(
                update(invocation_receipts)
                .where(invocation_receipts.c.invocation_id == invocation_id)
                .values(created_at=utcnow() - timedelta(hours=age + 1))
            )
    still_running = _claim(ledger, session_id, owner="task:x", identity_key="r").receipt
    assert still_running.status == "running"

    found = ledger.unknown_for_owner("task:x", limit=2)
    assert [receipt.invocation_id for receipt in found] == unknown[:2]  # newest first
    assert all(receipt.status == "unknown" for receipt in found)
    assert len(ledger.unknown_for_owner("task:x", limit=100)) == 3
    assert ledger.unknown_for_owner("task:z") == []


SENTINEL = "sentinel-secret-9f2c1e"


class _Args(ToolArguments):
    name: str
    password: str
    retries: int = 3


class _SecretWrite(Tool):
    name = "set_credentials"
    description = "writes a credential"
    effect = "write"
    identity: ClassVar[Any] = "intent"
    arguments = _Args

    def run(self, ctx: ToolContext, args: Any) -> ToolResult:
        return ToolResult.ok({"echo": args.password})


def test_a_secret_in_arguments_never_reaches_the_database(db: Database) -> None:
    session_id = chat_session(db)
    host = ToolHost([_SecretWrite()], ledger=ReceiptLedger(db))
    ctx = ToolContext(owner="alice", session_id=session_id, round_id="r1")
    arguments = {"name": "svc", "password": SENTINEL}
    results = host.run_turn(ctx, [ToolCall("c1", "set_credentials", arguments)])
    assert results[0].status == "succeeded"
    assert results[0].invocation_id is not None
    receipt = ReceiptLedger(db).get(results[0].invocation_id)
    assert receipt is not None
    assert receipt.args_digest == fingerprint({"name": "svc", "password": SENTINEL, "retries": 3})
    dump = dump_database(db)
    assert results[0].invocation_id in dump  # the dump does contain the receipt
    assert SENTINEL not in dump
    assert "svc" not in dump


class _RestartsMidCall(_SecretWrite):
    """A write during which the host restarts: the cold start fences its finisher."""

    name = "restarting_write"

    def __init__(self, ledger: ReceiptLedger) -> None:
        self.ledger = ledger

    def run(self, ctx: ToolContext, args: Any) -> ToolResult:
        self.ledger.cold_start()
        return ToolResult.ok("done")


def test_an_outcome_that_cannot_be_recorded_is_unknown(db: Database) -> None:
    ledger = ReceiptLedger(db)
    host = ToolHost([_RestartsMidCall(ledger)], ledger=ledger)
    ctx = ToolContext("alice", chat_session(db), "r1")
    arguments = {"name": "svc", "password": "p"}
    result = host.run_turn(ctx, [ToolCall("c1", "restarting_write", arguments)])[0]
    assert result.status == "unknown"
    assert result.code == "record_failed"
    assert result.invocation_id is not None
    receipt = ledger.get(result.invocation_id)
    assert receipt is not None
    assert receipt.status == "unknown"  # what the cold start made of it, not "succeeded"


class _HangingWrite(_SecretWrite):
    """A write whose backend never answers until the test lets it go; then it succeeds."""

    name = "hanging_write"

    def __init__(self) -> None:
        self.release = threading.Event()
        self.returned = threading.Event()

    def run(self, ctx: ToolContext, args: Any) -> ToolResult:
        self.release.wait(30)
        self.returned.set()
        return ToolResult.ok("done")


def test_a_write_past_its_time_limit_is_unknown_and_a_late_success_changes_nothing(
    db: Database,
) -> None:
    """Before, the turn waited for as long as the write hung; its late end decided the receipt."""
    ledger = ReceiptLedger(db)
    tool = _HangingWrite()
    host = ToolHost([tool], ledger=ledger, call_timeout=0.3)
    ctx = ToolContext("alice", chat_session(db), "r1", cancel=threading.Event())
    try:
        call = ToolCall("c1", "hanging_write", {"name": "svc", "password": "p"})
        (result,) = host.run_turn(ctx, [call])
        assert result.status == "unknown"
        assert result.code == "tool_timeout"
        assert "ORCH_TOOL_TIMEOUT_SECONDS" in (result.message or "")
        assert "read-only" in (result.message or "")  # verify before any retry (seed 000)
        assert result.invocation_id is not None
        receipt = ledger.get(result.invocation_id)
        assert receipt is not None
        assert receipt.status == "unknown"  # at once, not when the generation ends
        assert receipt.summary == summary_for("time_limit")
        assert "ancel" not in receipt.summary  # not told as a cancel
        tool.release.set()  # the backend answers late, with a success
        assert tool.returned.wait(5)
        join_tool_threads("hanging_write")  # what it would record is done by now
        after = ledger.get(result.invocation_id)
        assert after is not None
        assert (after.status, after.summary, after.claim_token) == (
            "unknown",
            summary_for("time_limit"),
            receipt.claim_token,
        )
        # The same write again is verified first, never sent again because time passed.
        (again,) = host.run_turn(ctx, [ToolCall("c2", "hanging_write", call.arguments)])
        assert again.code == "verify_first"
    finally:
        tool.release.set()


class _SlowClaims(ReceiptLedger):
    """A store that commits a claim only after the call's time limit has passed."""

    def claim(self, **kwargs: Any) -> Claim:  # type: ignore[override]
        claim = super().claim(**kwargs)
        time.sleep(0.5)
        return claim


def test_a_write_given_up_while_its_receipt_was_claimed_never_runs(db: Database) -> None:
    ledger = _SlowClaims(db)
    tool = _HangingWrite()
    tool.release.set()  # it would answer at once, if it ran
    host = ToolHost([tool], ledger=ledger, call_timeout=0.2)
    ctx = ToolContext("alice", chat_session(db), "r1")
    (result,) = host.run_turn(
        ctx, [ToolCall("c1", "hanging_write", {"name": "n", "password": "p"})]
    )
    assert (result.status, result.code) == ("unknown", "tool_timeout")
    join_tool_threads("hanging_write")  # the claim commits; the call sees it was given up
    assert not tool.returned.is_set()  # never ran
    (receipt,) = ledger.list_for_owner("alice")
    # The host held the call between its claim and its run: it knows it never ran, so the
    # receipt does not hold the task back as an unknown write would.
    assert (receipt.status, receipt.summary) == ("failed", summary_for("not_started"))


class _StopsAtClaim(ReceiptLedger):
    """A store whose claim commits just as the round is stopped (a cancel, a lease in doubt)."""

    def __init__(self, db: Database, stop: threading.Event) -> None:
        super().__init__(db)
        self.stop = stop

    def claim(self, **kwargs: Any) -> Claim:  # type: ignore[override]
        claim = super().claim(**kwargs)
        self.stop.set()
        return claim


def test_a_write_claimed_as_the_round_stops_is_never_run(db: Database) -> None:
    # Before, nothing looked at the stop between the claim and the run: the side effect
    # started after the round was cancelled or its lease came into doubt.
    stop = threading.Event()
    tool = _HangingWrite()
    tool.release.set()  # it would answer at once, if it ran
    ledger = _StopsAtClaim(db, stop)
    ctx = ToolContext("alice", chat_session(db), "r1", cancel=stop)
    with pytest.raises(ToolCancelled, match="before the write started"):
        ToolHost([tool], ledger=ledger).run_turn(
            ctx, [ToolCall("c1", "hanging_write", {"name": "n", "password": "p"})]
        )
    join_tool_threads("hanging_write")
    assert not tool.returned.is_set()  # never ran
    (receipt,) = ledger.list_for_owner("alice")
    assert (receipt.status, receipt.summary) == ("failed", summary_for("not_started"))


class _StartedHangingWrite(_HangingWrite):
    name = "started_hanging_write"

    def __init__(self) -> None:
        super().__init__()
        self.started = threading.Event()

    def run(self, ctx: ToolContext, args: Any) -> ToolResult:
        self.started.set()
        return super().run(ctx, args)


def test_a_write_given_up_after_its_generation_was_superseded_ends_the_turn_stale(
    db: Database,
) -> None:
    """Before, the turn gave the hung write up, its `unknown` was refused by the fence, and the
    turn then waited without a bound for the hung call's thread (its result was never used):
    the round, its worker slot and the task's lease stayed held for as long as the tool hung."""
    task_id, session_id, fence = running_task(db)
    tool = _StartedHangingWrite()
    host = ToolHost([tool], ledger=ReceiptLedger(db), call_timeout=1)
    ctx = ToolContext(
        f"task:{task_id}", session_id, "r1", task_id=task_id, generation=1, fence=fence
    )
    raised: list[BaseException] = []

    def turn() -> None:
        try:
            host.run_turn(ctx, [ToolCall("c1", tool.name, {"name": "n", "password": "p"})])
        except BaseException as error:
            raised.append(error)

    runner = threading.Thread(target=turn, daemon=True)
    try:
        runner.start()
        assert tool.started.wait(5)
        supersede(db, fence)  # a sweep ends the generation while the write hangs
        runner.join(timeout=10)  # the 1 s limit, not the tool's 30 s
        assert not runner.is_alive(), "the turn waited for the given-up call"
        assert [type(error) for error in raised] == [StaleGeneration]
    finally:
        tool.release.set()
