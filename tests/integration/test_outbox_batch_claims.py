"""A dispatcher claims a batch of due rows and posts them one after another: only the row it
posts is "being sent now"; the others wait their turn in its batch, and say so.

Before, every row of the batch read `being sent now (attempt 1, held until T)` for as long as
the batch's claim held (in `outbox list`, `outbox show`, `actions show`, `tasks show` and the
409 that refused a retry), while the dispatcher had not posted them: a backend slow on the
first row showed twenty rows "being sent" of which one was. The row records when its attempt
was posted (`sending_since`, migration 0027).

Both stores, a real HTTP backend on loopback that holds the first send, the CLI and the API.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update

from orchestrator.api.app import create_app
from orchestrator.errors import ConflictError
from orchestrator.runtime import Runtime
from orchestrator.services.outbox import OutboxDispatcher
from orchestrator.services.outbox_operations import OutboxService
from orchestrator.store import outbox_sending
from orchestrator.store.outbox import OutboxRow
from orchestrator.store.tables import outbox
from orchestrator.store.types import utcnow
from tests.outbox_support import (
    Recorder,
    approved_action,
    cli_on,
    outbox_runtime,
    running_recorder,
)


@pytest.fixture
def backend() -> Iterator[Recorder]:
    with running_recorder() as recorder:
        yield recorder


@pytest.fixture
def rt(store_url: str, tmp_path: Path, backend: Recorder) -> Iterator[Runtime]:
    with outbox_runtime(
        store_url, tmp_path, backend, webhook_secret="hook-secret", actions_secret="act-secret"
    ) as runtime:
        yield runtime


def _row(rt: Runtime, outbox_id: int) -> OutboxRow:
    [row] = [r for r in OutboxService(rt.db).list(kind="action") if r.outbox_id == outbox_id]
    return row


def test_only_the_row_posted_is_being_sent_the_rest_of_the_batch_waits_its_turn(
    rt: Runtime,
    tmp_path: Path,
    backend: Recorder,
    store_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from orchestrator.cli import main

    for _ in range(2):
        approved_action(rt, tmp_path)
    only_actions = {"webhook_url": None, "outbox_timeout_seconds": 30.0}
    dispatcher = OutboxDispatcher(rt.settings.model_copy(update=only_actions), rt.db, batch=2)
    backend.delay_seconds, backend.slow_path = 30.0, "/actions"  # held until `release`
    sending = threading.Thread(target=dispatcher.run_once)
    sending.start()
    try:
        assert backend.arrived.wait(10)
        [posted] = backend.on("/actions")
        first = int(posted.headers["x-orchestrator-delivery"])
        [second] = [
            r.outbox_id for r in OutboxService(rt.db).list(kind="action") if r.outbox_id != first
        ]
        assert _row(rt, first).sending_since is not None
        waiting = _row(rt, second)
        assert waiting.attempts == 1  # claimed, its attempt counted
        assert waiting.sending_since is None  # not posted

        cli_on(monkeypatch, store_url, tmp_path)
        assert main(["outbox", "list", "--kind", "action"]) == 0
        lines = capsys.readouterr().out.splitlines()
        [posted_line] = [x for x in lines if x.lstrip().startswith(f"{first} ")]
        [waiting_line] = [x for x in lines if x.lstrip().startswith(f"{second} ")]
        assert "  being sent now" in posted_line
        assert "being sent" not in waiting_line
        assert "  claimed by a dispatcher: waits its turn in its batch" in waiting_line

        assert main(["outbox", "show", str(first)]) == 0
        shown = capsys.readouterr().out
        assert "  being sent now (attempt 1, held until " in shown
        assert ", posted at " in shown
        assert main(["outbox", "show", str(second)]) == 0
        shown = capsys.readouterr().out
        assert "being sent" not in shown
        assert (
            "  claimed by a dispatcher, not sent yet: it waits its turn in the batch the "
            "dispatcher sends (attempt 1, held until "
        ) in shown
        # A discard is not refused for it (the dispatcher skips it at its turn): not told to wait.
        assert shown.rstrip().endswith(
            "; a retry waits until its answer is recorded, a discard settles it now (the "
            "dispatcher then skips it)"
        ), shown
        assert main(["actions", "show", str(waiting.action_id)]) == 0
        [delivery] = [x for x in capsys.readouterr().out.splitlines() if "delivery:" in x]
        assert (
            ", claimed by a dispatcher, waiting its turn in its batch (attempt 1, held until "
            in (delivery)
        )

        with pytest.raises(ConflictError) as refused:  # still refused: the batch will send it
            OutboxService(rt.db).retry(second, by="kim")
        assert refused.value.code == "being_sent"
        assert str(refused.value).startswith(
            f"outbox row {second} is claimed by a dispatcher and waits its turn in the batch it "
            "sends (attempt 1, held until "
        )
        with TestClient(create_app(rt.settings, db=rt.db)) as client:
            listed = client.get("/api/v1/outbox?kind=action").json()["items"]
        by_id = {item["outbox_id"]: item for item in listed}
        assert by_id[first]["sending_since"] is not None
        assert by_id[second]["sending_since"] is None
        assert by_id[second]["claimed_until"] is not None
    finally:
        backend.release.set()
        sending.join(30)
        dispatcher.close()
    assert {_row(rt, n).status for n in (first, second)} == {"delivered"}
    assert {_row(rt, n).sending_since for n in (first, second)} == {None}
    assert main(["outbox", "show", str(second), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["sending_since"] is None


def test_a_row_discarded_before_its_turn_keeps_no_attempt_for_that_claim(
    rt: Runtime,
    tmp_path: Path,
    store_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A batch's claim counts each row's attempt; a row an operator discards before its turn
    is never posted (the dispatcher's compare-and-set before the post finds it discarded). It
    kept the attempt of that claim, and read as tried: `attempts 1` for a row never sent, one
    more than the posts of a row that had failed before. The discard takes that claim's
    attempt back; a row posted (or tried before) keeps its posts."""
    from orchestrator.cli import main

    _, tried_action = approved_action(rt, tmp_path)
    with rt.db.transaction() as conn:  # posted once, failed
        [first] = outbox_sending.claim_due(conn, ("action",), limit=1, hold_seconds=60)
        assert outbox_sending.start_send(conn, first, hold_seconds=60)
        assert outbox_sending.mark_failed(
            conn, first, "HTTP 500", retry_at=first.created_at, dead=False
        )
    _, fresh_action = approved_action(rt, tmp_path)
    with rt.db.transaction() as conn:  # a batch of both, neither posted yet
        batch = outbox_sending.claim_due(conn, ("action",), limit=2, hold_seconds=60)
    assert sorted(row.attempts for row in batch) == [1, 2]
    for row in batch:
        OutboxService(rt.db).discard(row.outbox_id, reason="done by phone", by="kim")
    with rt.db.transaction() as conn:  # their turn comes: neither is posted
        assert not any(outbox_sending.start_send(conn, row, hold_seconds=60) for row in batch)

    tried = OutboxService(rt.db).shown(first.outbox_id)
    [fresh_id] = {row.outbox_id for row in batch} - {first.outbox_id}
    fresh = OutboxService(rt.db).shown(fresh_id)
    assert (tried["action_id"], fresh["action_id"]) == (tried_action, fresh_action)
    assert (tried["status"], tried["attempts"], tried["last_error"]) == (
        "discarded",
        1,
        "HTTP 500",
    )
    assert (fresh["status"], fresh["attempts"], fresh["last_error"]) == ("discarded", 0, None)
    with TestClient(create_app(rt.settings, db=rt.db)) as client:
        listed = client.get("/api/v1/outbox?kind=action&status=discarded").json()["items"]
    assert {item["outbox_id"]: item["attempts"] for item in listed} == {
        first.outbox_id: 1,
        fresh_id: 0,
    }
    cli_on(monkeypatch, store_url, tmp_path)
    assert main(["outbox", "show", str(fresh_id)]) == 0
    assert "  attempts 0 (throttled 0)\n" in capsys.readouterr().out


def test_a_claim_its_dispatcher_never_posted_still_counts_toward_the_webhook_limit(
    rt: Runtime, tmp_path: Path, backend: Recorder
) -> None:
    """A dispatcher killed between its claim and the post leaves the row's attempt counted
    (the hold runs out, and the row is due again): a row that kills its dispatchers is not
    claimed for ever without nearing ORCH_WEBHOOK_MAX_ATTEMPTS (3 here). Two such claims and
    one failed post dead-letter a task event; only an operator's discard takes a claim's
    attempt back."""
    task_id, _ = approved_action(rt, tmp_path)
    for killed in (1, 2):  # claimed, never posted: its dispatcher died, its hold ran out
        with rt.db.transaction() as conn:
            [claimed] = outbox_sending.claim_due(conn, ("webhook",), limit=1, hold_seconds=0)
        assert (claimed.task_id, claimed.attempts) == (task_id, killed)
    backend.always_fail = True
    only_webhooks = rt.settings.model_copy(update={"actions_url": None})
    dispatcher = OutboxDispatcher(only_webhooks, rt.db)
    try:
        report = dispatcher.run_once()
    finally:
        dispatcher.close()
    assert report.dead == [claimed.outbox_id]
    assert len(backend.on("/hooks")) == 1
    row = OutboxService(rt.db).shown(claimed.outbox_id)
    assert (row["status"], row["attempts"], row["dead_reason"]) == ("dead", 3, "max_attempts")


def test_the_rows_waiting_their_turn_are_held_as_the_batch_is_posted(
    rt: Runtime, tmp_path: Path
) -> None:
    """A batch's waiting rows are held again with each row posted and each renewal of its
    hold (one statement): their hold no longer runs out while the dispatcher lives, for
    another dispatcher to claim them and count an attempt never posted. Each is held under its
    own claim only: one an operator discarded, or one another claim took, is left alone."""
    for _ in range(4):
        approved_action(rt, tmp_path)
    with rt.db.transaction() as conn:  # the holds run out at once: as if the sends were slow
        first, *waiting = outbox_sending.claim_due(conn, ("action",), limit=4, hold_seconds=0)
    discarded, taken, kept = waiting
    OutboxService(rt.db).discard(discarded.outbox_id, reason="done by phone", by="kim")
    with rt.db.transaction() as conn:  # another dispatcher's claim of it: its attempt counted
        conn.execute(
            update(outbox)
            .where(outbox.c.outbox_id == taken.outbox_id)
            .values(attempts=outbox.c.attempts + 1)
        )

    with rt.db.transaction() as conn:
        assert outbox_sending.start_send(conn, first, hold_seconds=60, waiting=waiting)
    with rt.db.transaction() as conn:  # nothing of the batch is due for another dispatcher
        [claimed] = outbox_sending.claim_due(conn, ("action",), limit=4, hold_seconds=60)
    assert claimed.outbox_id == taken.outbox_id  # the other claim's, its hold run out
    now = utcnow()
    held = _row(rt, kept.outbox_id)
    assert held.being_sent(now)  # held,
    assert not held.posting(now)  # waiting its turn
    assert (held.attempts, held.sending_since) == (1, None)
    assert _row(rt, first.outbox_id).posting(now)
    assert (_row(rt, discarded.outbox_id).status, _row(rt, discarded.outbox_id).claimed_until) == (
        "discarded",
        None,
    )
    assert _row(rt, taken.outbox_id).attempts == 3  # the other claim's was not held by the batch

    with rt.db.transaction() as conn:  # a renewal mid-send holds them too
        assert outbox_sending.renew_claim(conn, first, hold_seconds=120, waiting=waiting)
    renewed = _row(rt, kept.outbox_id)
    assert renewed.claimed_until is not None
    assert held.claimed_until is not None
    assert renewed.claimed_until > held.claimed_until
    assert _row(rt, taken.outbox_id).claimed_until == claimed.claimed_until
