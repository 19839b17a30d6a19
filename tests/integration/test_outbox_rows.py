"""One outbox row's whole state, where an operator reads it.

Why a dead letter is dead: out of ORCH_WEBHOOK_MAX_ATTEMPTS or refused for good (the row showed
only its last error, `HTTP 503`, which read as one more failure to be retried; the log line alone
said it was dead-lettered).

Both stores, a real HTTP backend on loopback, the API's routes and the CLI.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, insert, select

from orchestrator.api.app import create_app
from orchestrator.runtime import Runtime
from orchestrator.services.outbox import OutboxDispatcher
from orchestrator.services.outbox_operations import OutboxService
from orchestrator.store.tables import outbox
from orchestrator.store.types import utcnow
from tests.integration.test_operator_accounts import bearer, operators_file
from tests.outbox_support import Recorder, outbox_runtime, running_recorder, waiting_task


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


@pytest.fixture
def dispatcher(rt: Runtime) -> Iterator[OutboxDispatcher]:
    sender = OutboxDispatcher(rt.settings, rt.db)
    yield sender
    sender.close()


@pytest.fixture
def client(rt: Runtime, tmp_path: Path) -> Iterator[TestClient]:
    """The API with operator accounts (vera viewer, otto operator) and the shared token."""
    settings = rt.settings.model_copy(
        update={"operators": operators_file(tmp_path), "api_token": "shared-token"}
    )
    with TestClient(create_app(settings, db=rt.db)) as api:
        yield api


@pytest.fixture
def cli(store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI, run in process by a test, on this store (its home in the test's folder)."""
    monkeypatch.setenv("ORCH_DATABASE_URL", store_url)
    monkeypatch.setenv("ORCH_HOME", str(tmp_path / "home"))


def _dead_after_the_limit(
    rt: Runtime, tmp_path: Path, backend: Recorder, sender: OutboxDispatcher
) -> tuple[str, int]:
    """A waiting task whose first webhook failed (503) its 3 allowed attempts: (task, row)."""
    task_id, _ = waiting_task(rt, tmp_path)
    backend.always_fail = True
    for _ in range(rt.settings.webhook_max_attempts):
        for row in OutboxService(rt.db).list(task_id=task_id, status="pending"):
            _due_now(rt, row.outbox_id)
        sender.run_once()
    backend.always_fail = False
    [dead] = OutboxService(rt.db).list(task_id=task_id, status="dead")
    assert (dead.last_error, dead.attempts) == ("HTTP 503", rt.settings.webhook_max_attempts)
    return task_id, dead.outbox_id


def _due_now(rt: Runtime, outbox_id: int) -> None:
    from sqlalchemy import update

    from orchestrator.store.tables import outbox
    from orchestrator.store.types import utcnow

    with rt.db.transaction() as conn:
        conn.execute(
            update(outbox).where(outbox.c.outbox_id == outbox_id).values(next_attempt_at=utcnow())
        )


def test_a_dead_letter_says_why_it_is_dead_where_it_is_listed(
    rt: Runtime,
    tmp_path: Path,
    backend: Recorder,
    dispatcher: OutboxDispatcher,
    client: TestClient,
    cli: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Out of attempts or refused for good: `dead_reason` in the API (the list, the task's
    view), and the CLI's lines say it where the error does not."""
    from orchestrator.cli import main

    limit_task, limit_id = _dead_after_the_limit(rt, tmp_path, backend, dispatcher)
    refused_task, _ = waiting_task(rt, tmp_path)
    backend.answers = [422]
    dispatcher.run_once()
    [refused] = OutboxService(rt.db).list(task_id=refused_task, status="dead")
    listed = client.get(
        "/api/v1/outbox", params={"status": "dead"}, headers=bearer("viewer-token")
    ).json()["items"]
    assert {i["outbox_id"]: i["dead_reason"] for i in listed} == {
        limit_id: "max_attempts",
        refused.outbox_id: "refused",
    }
    pending = client.get(
        "/api/v1/outbox", params={"status": "pending"}, headers=bearer("viewer-token")
    ).json()["items"]
    assert pending
    assert {i["dead_reason"] for i in pending} == {None}
    view = client.get(f"/api/v1/tasks/{limit_task}", headers=bearer("viewer-token")).json()
    [shown] = [x for x in view["deliveries"]["undelivered"] if x["status"] == "dead"]
    assert shown["dead_reason"] == "max_attempts"
    said = "dead-lettered: out of attempts (3 failed, ORCH_WEBHOOK_MAX_ATTEMPTS)"
    assert main(["outbox", "list", "--status", "dead"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.endswith(said) for line in lines] == [True, False]
    assert lines[1].endswith("last error: HTTP 422 (a permanent refusal, not retried)")
    assert main(["tasks", "show", limit_task]) == 0
    assert said in capsys.readouterr().out
    # Discarded, it still says why it was dead; retried, it is not dead any more.
    OutboxService(rt.db).discard(refused.outbox_id, reason="told them", by="ops")
    OutboxService(rt.db).retry(limit_id, by="ops")
    assert main(["outbox", "list", "--json"]) == 0
    rows = {r["outbox_id"]: r["dead_reason"] for r in json.loads(capsys.readouterr().out)}
    assert (rows[limit_id], rows[refused.outbox_id]) == (None, "refused")


def test_an_event_behind_an_earlier_one_being_retried_says_so_as_the_console_does(
    rt: Runtime,
    tmp_path: Path,
    backend: Recorder,
    dispatcher: OutboxDispatcher,
    client: TestClient,
    cli: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The console's deliveries view says `waits behind delivery N, being retried` of a pending
    event whose task's earlier event keeps failing (not dead yet); the API and the CLI said
    nothing, and the held event read due and never attempted, as a stuck dispatcher leaves it.
    One behind an earlier event not tried yet (just written) is merely in order: nothing."""
    from orchestrator.cli import main

    task_id, _ = waiting_task(rt, tmp_path)
    backend.always_fail = True
    dispatcher.run_once()
    first, *later = OutboxService(rt.db).list(task_id=task_id, status="pending")
    assert (first.attempts, [r.attempts for r in later]) == (1, [0] * len(later))
    assert later
    other_task, _ = waiting_task(rt, tmp_path)  # written, not tried yet: in order, not held
    listed = client.get(
        "/api/v1/outbox", params={"status": "pending"}, headers=bearer("viewer-token")
    ).json()["items"]
    held = {i["outbox_id"]: (i["waits_behind"], i["waits_behind_retried"]) for i in listed}
    assert held[first.outbox_id] == (None, None)
    assert {held[r.outbox_id] for r in later} == {(None, first.outbox_id)}
    assert {
        v for i, v in held.items() if i not in {first.outbox_id, *(r.outbox_id for r in later)}
    } == {(None, None)}
    view = client.get(f"/api/v1/tasks/{task_id}", headers=bearer("viewer-token")).json()
    undelivered = view["deliveries"]["undelivered"]
    shown = {x["outbox_id"]: x.get("waits_behind_retried") for x in undelivered}
    assert shown == {first.outbox_id: None, **{r.outbox_id: first.outbox_id for r in later}}
    said = f"waits behind outbox {first.outbox_id}, being retried"
    assert main(["outbox", "list", "--status", "pending", "--task", task_id]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.endswith(said) for line in lines] == [False] + [True] * len(later)
    assert main(["outbox", "list", "--status", "pending", "--task", other_task]) == 0
    assert "waits behind" not in capsys.readouterr().out
    assert main(["tasks", "show", task_id]) == 0
    assert said in capsys.readouterr().out
    backend.always_fail = False
    _due_now(rt, first.outbox_id)
    dispatcher.run_once()
    assert not OutboxService(rt.db).list(task_id=task_id, status="pending")


def test_one_delivery_is_shown_whole_by_its_id_and_an_unknown_id_is_a_clear_404(
    rt: Runtime,
    tmp_path: Path,
    backend: Recorder,
    dispatcher: OutboxDispatcher,
    client: TestClient,
    cli: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A log line, an alert or `X-Orchestrator-Delivery` names a row by its id: there was no
    `outbox show ID` nor `GET /api/v1/outbox/{id}` (`outbox list --after N-1 --limit 1` was the
    way). Each says the row's whole state as the list does; an unknown id is a 404 `not_found`
    and one CLI line with exit 1."""
    from orchestrator.cli import main

    task_id, dead_id = _dead_after_the_limit(rt, tmp_path, backend, dispatcher)
    [held] = OutboxService(rt.db).list(task_id=task_id, status="pending")
    viewer = bearer("viewer-token")
    dead = client.get(f"/api/v1/outbox/{dead_id}", headers=viewer)
    assert dead.status_code == 200, dead.text
    assert {k: dead.json()[k] for k in ("status", "attempts", "last_error", "dead_reason")} == {
        "status": "dead",
        "attempts": 3,
        "last_error": "HTTP 503",
        "dead_reason": "max_attempts",
    }
    assert dead.json()["next_attempt_at"] is None
    assert (
        client.get(f"/api/v1/outbox/{held.outbox_id}", headers=viewer).json()["waits_behind"]
        == dead_id
    )
    for unknown in (999999, 2**63 - 1):
        missing = client.get(f"/api/v1/outbox/{unknown}", headers=viewer)
        error = missing.json()["error"]
        assert (missing.status_code, error["code"]) == (404, "not_found")
        assert error["message"] == f"outbox row {unknown} does not exist"
    assert client.get("/api/v1/outbox/0", headers=viewer).status_code == 422
    assert main(["outbox", "show", str(dead_id)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"outbox {dead_id}  dead  task event {task_id}:")
    assert "  last error: HTTP 503\n" in out
    assert "  dead-lettered: out of attempts (3 failed, ORCH_WEBHOOK_MAX_ATTEMPTS)\n" in out
    assert f"`orchestrator outbox retry {dead_id}`" in out
    assert main(["outbox", "show", str(held.outbox_id)]) == 0
    out = capsys.readouterr().out
    assert f"waits behind dead letter outbox {dead_id} (outbox retry or discard it)" in out
    assert "next attempt" not in out  # held: its own time means nothing until then
    OutboxService(rt.db).discard(dead_id, reason="phoned\nthe crew", by="ops")
    assert main(["outbox", "show", str(dead_id), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["status"], shown["discarded_by"], shown["dead_reason"]) == (
        "discarded",
        "ops",
        "max_attempts",
    )
    assert main(["outbox", "show", str(dead_id)]) == 0
    assert "  discarded by ops at " in capsys.readouterr().out
    assert main(["outbox", "show", "999999"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.strip() == "orchestrator: not_found: outbox row 999999 does not exist"


def test_show_says_when_an_operator_released_a_row(
    rt: Runtime,
    tmp_path: Path,
    backend: Recorder,
    dispatcher: OutboxDispatcher,
    client: TestClient,
    cli: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An operator's retry of a dead letter (or a discard) releases it and the events of its
    task it held back (`released_at`, migration 0024): the oldest-pending gauge counts their
    wait from then. `outbox show` and the API did not say it, so a row written days ago and
    read against the gauge looked days late; now it says when, and why."""
    from orchestrator.cli import main

    task_id, dead_id = _dead_after_the_limit(rt, tmp_path, backend, dispatcher)
    [held] = OutboxService(rt.db).list(task_id=task_id, status="pending")
    assert main(["outbox", "show", str(dead_id)]) == 0
    assert "due again from" not in capsys.readouterr().out  # never released: nothing to say
    operator = bearer("operator-token")
    client.post(f"/api/v1/outbox/{dead_id}/retry", headers=operator).raise_for_status()
    why = {  # in plain words: which retry or discard, and what the gauge makes of it
        dead_id: "when an operator's retry took it out of the dead letters (fresh counts)",
        held.outbox_id: "when an operator retried or discarded an earlier event of its task "
        "that held it back (a task's events go in order)",
    }
    for number in (dead_id, held.outbox_id):
        assert main(["outbox", "show", str(number)]) == 0
        [released] = [x for x in capsys.readouterr().out.splitlines() if "  due again " in x]
        at = OutboxService(rt.db).shown(number)["released_at"].isoformat(timespec="seconds")
        assert released == (
            f"  due again from {at}, {why[number]}: "
            "orchestrator_outbox_oldest_pending_seconds times its wait from then, not from "
            "when it was written"
        )
        shown = client.get(f"/api/v1/outbox/{number}", headers=operator).json()
        assert shown["released_at"] is not None
        assert shown["released_at"] > shown["created_at"]
        assert main(["outbox", "show", str(number), "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["released_at"] == shown["released_at"]
    dispatcher.run_once()  # delivered: when it was released stays on the row
    assert main(["outbox", "show", str(dead_id)]) == 0
    out = capsys.readouterr().out
    assert f"outbox {dead_id}  delivered" in out
    assert "  due again from " in out


def test_the_delivery_list_has_an_etag_that_every_write_to_a_listed_row_changes(
    rt: Runtime,
    tmp_path: Path,
    backend: Recorder,
    dispatcher: OutboxDispatcher,
    client: TestClient,
) -> None:
    """The console's deliveries view polls `GET /api/v1/outbox` every 6 s and nearly always
    nothing changed: `If-None-Match` with the page's `ETag` is a `304` with no body while it
    holds. A new event, a delivery attempt, a dead letter, a retry and a discard each change
    the tag (a client holding the old page must not be told it is current)."""
    operator = bearer("operator-token")
    tags: list[str] = []

    def changed() -> None:
        """The page's tag is new, and asking with it is a 304 with no body and the tag."""
        page = client.get("/api/v1/outbox", params={"limit": 200}, headers=operator)
        assert page.status_code == 200, page.text
        tag = page.headers["ETag"]
        assert tag not in tags
        tags.append(tag)
        again = client.get(
            "/api/v1/outbox", params={"limit": 200}, headers={**operator, "If-None-Match": tag}
        )
        assert (again.status_code, again.content, again.headers["ETag"]) == (304, b"", tag)

    changed()  # nothing in the outbox yet
    task_id, _ = waiting_task(rt, tmp_path)
    changed()  # new events
    backend.always_fail = True
    dispatcher.run_once()
    changed()  # an attempt: its count, error and next attempt
    [first, *_] = OutboxService(rt.db).list(task_id=task_id, status="pending")
    backend.answers = [422]
    _due_now(rt, first.outbox_id)
    dispatcher.run_once()
    changed()  # dead-lettered: the later events now wait behind it
    client.post(f"/api/v1/outbox/{first.outbox_id}/retry", headers=operator).raise_for_status()
    changed()  # due again with fresh counts
    backend.answers = [422]
    dispatcher.run_once()
    changed()  # dead again
    # A page of another filter is another answer: its tag is not this one's.
    dead = client.get("/api/v1/outbox", params={"status": "dead"}, headers=operator)
    assert [i["outbox_id"] for i in dead.json()["items"]] == [first.outbox_id]
    assert dead.headers["ETag"] not in tags
    client.post(
        f"/api/v1/outbox/{first.outbox_id}/discard", json={"reason": "by phone"}, headers=operator
    ).raise_for_status()
    changed()  # settled by hand: the later events go on


def test_the_list_says_when_a_pending_row_is_tried_next(
    rt: Runtime, tmp_path: Path, cli: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """`outbox list` printed no next attempt (only `outbox show` and `--json` did): an operator
    watching a failing receiver could not see when it is tried again, nor tell a row due long
    ago (no dispatcher sending) from one backing off."""
    import re
    from datetime import timedelta

    from sqlalchemy import update

    from orchestrator.cli import main
    from orchestrator.store.tables import outbox
    from orchestrator.store.types import utcnow

    failing, _ = waiting_task(rt, tmp_path)
    overdue, _ = waiting_task(rt, tmp_path)
    [backing_off, held] = OutboxService(rt.db).list(task_id=failing)[:2]
    [stuck, *_] = OutboxService(rt.db).list(task_id=overdue)
    now = utcnow()
    with rt.db.transaction() as conn:
        conn.execute(  # failed once, backing off five minutes
            update(outbox)
            .where(outbox.c.outbox_id == backing_off.outbox_id)
            .values(attempts=1, last_error="HTTP 503", next_attempt_at=now + timedelta(minutes=5))
        )
        conn.execute(  # due ten minutes ago, and not sent
            update(outbox)
            .where(outbox.c.outbox_id == stuck.outbox_id)
            .values(next_attempt_at=now - timedelta(minutes=10))
        )
    assert main(["outbox", "list", "--status", "pending"]) == 0
    lines = {int(line.split()[0]): line for line in capsys.readouterr().out.splitlines()}
    assert re.search(
        r"  next attempt in 4m5\ds  last error: HTTP 503$", lines[backing_off.outbox_id]
    )
    assert re.search(r"  next attempt due 10m0\ds ago$", lines[stuck.outbox_id])
    # Held behind the one backing off: its own time means nothing until that one goes.
    assert "next attempt" not in lines[held.outbox_id]
    assert lines[held.outbox_id].endswith(
        f"waits behind outbox {backing_off.outbox_id}, being retried"
    )


def test_tasks_show_lists_a_dead_row_wherever_it_is_and_says_what_it_leaves_out(
    rt: Runtime, tmp_path: Path, cli: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """A task's first 20 undelivered rows were listed, in order: a dead row after them was left
    out (`tasks show` put dead ones first only among those), and nothing said rows were."""
    from orchestrator.cli import main

    task_id, _ = waiting_task(rt, tmp_path)
    now = utcnow()
    row = {"kind": "webhook", "task_id": task_id, "body": "{}", "attempts": 0, "throttled": 0}
    with rt.db.transaction() as conn:
        for seq in range(100, 125):
            conn.execute(
                insert(outbox).values(
                    **row, event_seq=seq, status="pending", next_attempt_at=now, created_at=now
                )
            )
        dead_id = conn.execute(
            insert(outbox)
            .values(
                **row | {"attempts": 3},
                event_seq=200,
                status="dead",
                last_error="HTTP 503",
                next_attempt_at=now,
                created_at=now,
            )
            .returning(outbox.c.outbox_id)
        ).scalar_one()
        undelivered = conn.execute(
            select(func.count())
            .select_from(outbox)
            .where(outbox.c.task_id == task_id, outbox.c.status.in_(["pending", "dead"]))
        ).scalar_one()
    assert main(["tasks", "show", task_id]) == 0
    out = capsys.readouterr().out
    assert f"DEAD  outbox {dead_id}  webhook" in out
    assert (
        f"... 20 of the {undelivered} not delivered shown (dead ones first): "
        f"`orchestrator outbox list --task {task_id}` lists them all"
    ) in out


def _events_as(rt: Runtime, task_id: str, *states: tuple[str, int]) -> list[int]:
    """The task's webhooks so far delivered, and one more for each (status, attempts) of
    `states`, in event order (a failed one's error `HTTP 503`, backing off): their ids."""
    from sqlalchemy import update

    now = utcnow()
    with rt.db.transaction() as conn:
        conn.execute(
            update(outbox)
            .where(outbox.c.task_id == task_id, outbox.c.kind == "webhook")
            .values(status="delivered", delivered_at=now)
        )
        last = conn.execute(
            select(func.max(outbox.c.event_seq)).where(outbox.c.task_id == task_id)
        ).scalar_one()
        return [
            conn.execute(
                insert(outbox)
                .values(
                    kind="webhook",
                    task_id=task_id,
                    event_seq=last + number,
                    body="{}",
                    status=status,
                    attempts=attempts,
                    throttled=0,
                    last_error="HTTP 503" if attempts else None,
                    next_attempt_at=now + timedelta(minutes=5) if attempts else now,
                    created_at=now,
                )
                .returning(outbox.c.outbox_id)
            ).scalar_one()
            for number, (status, attempts) in enumerate(states, start=1)
        ]


def test_a_held_event_names_the_earliest_unsent_event_before_it_in_both_views(
    rt: Runtime, tmp_path: Path, client: TestClient
) -> None:
    """What a pending event waits behind is the earliest event of its task not yet delivered
    or discarded that comes before it: the dispatcher sends a task's events in that order. The
    task's view took the first row it lists (dead ones first) as the one every later event
    waits behind, and `GET /api/v1/outbox` the first earlier one tried: a dead letter listed
    first named itself the head of an event sent before it, and an event behind one never
    tried named a dead letter further on. Both views now ask one function."""
    failing_first, _ = waiting_task(rt, tmp_path)
    retried, dead, held = _events_as(rt, failing_first, ("pending", 1), ("dead", 3), ("pending", 0))
    untried_first, _ = waiting_task(rt, tmp_path)
    next_one, later_dead, in_order = _events_as(
        rt, untried_first, ("pending", 0), ("dead", 3), ("pending", 0)
    )
    viewer = bearer("viewer-token")

    def waits(item: dict[str, object]) -> tuple[object, object]:
        return item.get("waits_behind"), item.get("waits_behind_retried")

    for task_id, expected in (
        # The first of its task not sent waits behind nothing; the one after the dead letter
        # waits behind the failing one, sent before the dead letter.
        (failing_first, {retried: (None, None), dead: (None, None), held: (None, retried)}),
        # Behind one not tried yet: in order, not held.
        (untried_first, {next_one: (None, None), later_dead: (None, None), in_order: (None, None)}),
    ):
        view = client.get(f"/api/v1/tasks/{task_id}", headers=viewer).json()
        shown = {x["outbox_id"]: waits(x) for x in view["deliveries"]["undelivered"]}
        assert {k: v for k, v in shown.items() if k in expected} == expected
        listed = client.get(
            "/api/v1/outbox", params={"task_id": task_id, "status": "pending"}, headers=viewer
        ).json()["items"]
        pending = {k: v for k, v in expected.items() if k not in (dead, later_dead)}
        assert {item["outbox_id"]: waits(item) for item in listed} == pending
    refused = client.post(f"/api/v1/outbox/{held}/retry", headers=bearer("operator-token"))
    assert (refused.status_code, refused.json()["error"]["code"]) == (409, "waits_behind")
    assert (
        f"waits behind outbox {retried}, an earlier event being retried"
        in (refused.json()["error"]["message"])
    )
