"""Conditional reads of a task's view and its evidence pages: `ETag`, `If-None-Match`, `304`.

The console polls an open task's view every 3 s and its evidence every 15 s. An unchanged
resource is now answered `304` with no body from one statement (`store.task_versions`); a
changed one is answered as before, with a new tag. The walk below makes the writes a task goes
through, and after each one the tag the client holds must no longer match: a write the view
shows that left the tag unchanged would leave the console showing a stale task.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import insert, select, update

from orchestrator.runtime import Runtime
from orchestrator.services.tasks import Trigger
from orchestrator.store.tables import actions, evidence, invocation_receipts, outbox
from orchestrator.store.types import utcnow
from tests.executions_support import (
    READ_AND_QUERY,
    approve_the_action,
    completing_turns,
    node,
    plan_call,
    report_call,
    runtime_and_api,
    write_script,
)

#: A work order for the plan's `repair` node (the round then reports `waiting`).
PROPOSE = {
    "id": "c2",
    "name": "propose_action",
    "arguments": {"node_id": "repair", "kind": "work_order", "payload": {"crew": "north"}},
}


@pytest.fixture
def env(store_url: str, scripts: Path) -> Iterator[tuple[Runtime, TestClient]]:
    write_script(scripts, "leak", completing_turns())
    with runtime_and_api(store_url, scripts) as both:
        yield both


class Held:
    """What a polling client holds of one resource: its tag and body."""

    def __init__(self, client: TestClient, path: str) -> None:
        self.client, self.path = client, path
        first = client.get(path)
        assert first.status_code == 200, first.text
        self.tag, self.body = first.headers["ETag"], first.json()

    def poll(self) -> int:
        """One conditional read; on a 200 the client holds the new answer."""
        answer = self.client.get(self.path, headers={"If-None-Match": self.tag})
        if answer.status_code == 304:
            assert answer.content == b""
            assert answer.headers["ETag"] == self.tag
        else:
            assert answer.status_code == 200, answer.text
            assert answer.headers["ETag"] != self.tag
            self.tag, self.body = answer.headers["ETag"], answer.json()
        return answer.status_code

    def changed_by(self, what: str) -> None:
        """After a write the view shows: the poll answers the new view, then 304 again."""
        before = self.body
        assert self.client.get(self.path).json() != before, f"{what} changed nothing shown"
        assert self.poll() == 200, f"{what}: the tag still matched a stale view"
        assert self.body == self.client.get(self.path).json()
        assert self.poll() == 304, f"{what}: unchanged since, but not 304"


def test_a_task_s_view_is_304_while_unchanged_and_sent_again_after_each_write(
    env: tuple[Runtime, TestClient],
) -> None:
    rt, client = env
    task_id = rt.tasks.trigger(Trigger(task_type="leak", title="Turbid water")).task.task_id
    view = Held(client, f"/api/v1/tasks/{task_id}")
    assert view.poll() == 304
    assert view.poll() == 304

    rt.executions.run(task_id, 1, worker="w:1")  # plan, evidence, transcript, report
    view.changed_by("a round")
    assert view.body["status"] == "completed"
    session_id = view.body["session_id"]

    rt.tasks.requeue(task_id, "look again", by="ana")
    view.changed_by("a requeue")

    now = utcnow()
    with rt.db.transaction() as conn:
        conn.execute(
            insert(outbox).values(
                kind="webhook", task_id=task_id, event_seq=1, body="{}", status="pending",
                next_attempt_at=now, created_at=now,
            )
        )  # fmt: skip
    view.changed_by("a delivery written")
    with rt.db.transaction() as conn:
        conn.execute(
            update(outbox)
            .where(outbox.c.task_id == task_id)
            .values(attempts=1, last_error="HTTP 503")
        )
    view.changed_by("a delivery attempt")

    with rt.db.transaction() as conn:
        conn.execute(
            insert(invocation_receipts).values(
                invocation_id="inv-1", owner=f"task:{task_id}", session_id=session_id,
                tool_name="create_work_order", identity_key="k1", args_digest="0" * 64,
                claim_token="c", status="unknown", summary="sent, no answer",
                created_at=now, updated_at=now,
            )
        )  # fmt: skip
    view.changed_by("a write of unknown outcome")

    rt.tasks.cancel(task_id, "duplicate", by="ana")
    view.changed_by("a cancel")
    assert view.body["status"] == "cancelled"


def test_a_waiting_task_s_view_is_sent_again_after_an_approval_and_a_person_s_step(
    env: tuple[Runtime, TestClient], scripts: Path
) -> None:
    sample = node("sample", "waiting", actor="human")
    write_script(
        scripts,
        "wo",
        [
            READ_AND_QUERY,
            {
                "tool_calls": [
                    plan_call(
                        "c1", "r1", [node("check", "completed"), sample, node("repair", "waiting")]
                    )
                ]
            },
            {"tool_calls": [PROPOSE]},
            {"tool_calls": [report_call("c3", "waiting")]},
        ],
    )
    rt, client = env
    task_id = rt.tasks.trigger(Trigger(task_type="wo", title="Low pressure")).task.task_id
    assert rt.executions.run(task_id, 1, worker="w").outcome == "waiting"
    view = Held(client, f"/api/v1/tasks/{task_id}")
    assert len(view.body["pending_actions"]) == 1
    assert view.poll() == 304
    approve_the_action(rt, task_id)
    view.changed_by("an approval")
    assert view.body["pending_actions"] == []
    rt.human_steps.close(task_id, "sample", "completed", by="crew", evidence="bottle 7")
    view.changed_by("a person's step")


def test_a_task_s_view_is_sent_again_after_an_action_proposed_and_decided_between_two_polls(
    env: tuple[Runtime, TestClient], scripts: Path
) -> None:
    """The tag counts the task's pending actions and takes its newest one: an action proposed
    and decided between two polls leaves the pending ones as they were, but is the task's
    last write (and one more decided action on its page)."""
    write_script(
        scripts,
        "wo",
        [
            READ_AND_QUERY,
            {"tool_calls": [plan_call("c1", "r1", [node("check", "completed"),
                                                   node("repair", "waiting")])]},
            {"tool_calls": [PROPOSE]},
            {"tool_calls": [report_call("c3", "waiting")]},
        ],
    )  # fmt: skip
    rt, client = env
    task_id = rt.tasks.trigger(Trigger(task_type="wo", title="Low pressure")).task.task_id
    assert rt.executions.run(task_id, 1, worker="w").outcome == "waiting"
    view = Held(client, f"/api/v1/tasks/{task_id}")
    [pending] = view.body["pending_actions"]
    now = utcnow()
    with rt.db.transaction() as conn:
        conn.execute(
            insert(actions).values(
                action_id="a-between", task_id=task_id, generation=1,
                session_id=view.body["session_id"], node_id="repair", kind="command",
                payload={"run": "flush"}, status="pending_approval", created_at=now,
                plan_revision=1, digest="1" * 64,
            )
        )  # fmt: skip
    with rt.db.transaction() as conn:
        conn.execute(
            update(actions)
            .where(actions.c.action_id == "a-between")
            .values(status="approved", decided_by="ana", decided_at=now)
        )
    view.changed_by("an action proposed and decided")
    assert [a["action_id"] for a in view.body["pending_actions"]] == [pending["action_id"]]


def test_an_evidence_page_is_304_while_unchanged_and_sent_again_with_a_new_record(
    env: tuple[Runtime, TestClient],
) -> None:
    rt, client = env
    task_id = rt.tasks.trigger(Trigger(task_type="leak", title="Turbid water")).task.task_id
    rt.executions.run(task_id, 1, worker="w:1")
    page = Held(client, f"/api/v1/tasks/{task_id}/evidence?limit=1")
    (first,) = page.body["items"]
    cited = Held(client, f"/api/v1/tasks/{task_id}/evidence?id={first['evidence_id']}")
    assert page.body["next_cursor"] is None
    assert page.poll() == 304

    record: dict[str, Any] = {
        "evidence_id": "later-1", "task_id": task_id, "generation": 1,
        "session_id": rt.tasks.get(task_id).session_id, "source": "scada_sim",
        "queried_at": utcnow(), "content_ref": "sha256:" + "a" * 64, "origin": "synthetic",
        "truncated": False, "summary": "reading", "created_at": utcnow(),
    }  # fmt: skip
    with rt.db.transaction() as conn:
        conn.execute(insert(evidence).values(**record))
    page.changed_by("a record after the page")  # the page now has a next one
    assert page.body["next_cursor"] is not None
    assert cited.poll() == 304  # the record asked for by id is the same
    # The same tag is no match for another page, another task, or nothing at all.
    second = client.get(
        f"/api/v1/tasks/{task_id}/evidence",
        params={"limit": 1, "cursor": page.body["next_cursor"]},
        headers={"If-None-Match": page.tag},
    )
    assert (second.status_code, second.json()["items"][0]["evidence_id"]) == (200, "later-1")
    missing = client.get("/api/v1/tasks/nope/evidence", headers={"If-None-Match": "*"})
    assert (missing.status_code, missing.json()["error"]["code"]) == (404, "not_found")
    missing = client.get("/api/v1/tasks/nope", headers={"If-None-Match": page.tag})
    assert (missing.status_code, missing.json()["error"]["code"]) == (404, "not_found")


def test_a_transcript_page_is_304_while_unchanged_and_sent_again_as_it_grows(
    env: tuple[Runtime, TestClient],
) -> None:
    """The console reads up to five pages of 200 entries every 15 s per open task."""
    rt, client = env
    task_id = rt.tasks.trigger(Trigger(task_type="leak", title="Turbid water")).task.task_id
    rt.executions.run(task_id, 1, worker="w:1")
    every = Held(client, f"/api/v1/tasks/{task_id}/transcript?limit=200")
    first = Held(client, f"/api/v1/tasks/{task_id}/transcript?generation=1&limit=2")
    assert every.poll() == 304
    assert first.poll() == 304
    rt.tasks.requeue(task_id, "look again", by="ana")
    rt.executions.run(task_id, 2, worker="w:1")  # generation 2's turns, and their tokens
    every.changed_by("a second round")
    assert {entry["generation"] for entry in every.body["items"]} == {1, 2}
    assert first.poll() == 304  # generation 1's page and token usage are as they were
    missing = client.get(
        f"/api/v1/tasks/{task_id}/transcript?generation=9", headers={"If-None-Match": "*"}
    )
    assert (missing.status_code, missing.json()["error"]["code"]) == (404, "not_found")
    bad = client.get(
        f"/api/v1/tasks/{task_id}/transcript?cursor=zz", headers={"If-None-Match": "*"}
    )
    assert (bad.status_code, bad.json()["error"]["code"]) == (422, "invalid_cursor")


def test_a_page_of_the_task_list_is_304_while_unchanged_and_sent_again_after_a_change(
    env: tuple[Runtime, TestClient],
) -> None:
    """The console's task list polls its page every 6 s."""
    rt, client = env
    task_id = rt.tasks.trigger(Trigger(task_type="leak", title="Turbid water")).task.task_id
    page = Held(client, "/api/v1/tasks?limit=50")
    waiting = Held(client, "/api/v1/tasks?status=queued&limit=50")
    assert page.poll() == 304
    rt.executions.run(task_id, 1, worker="w:1")
    page.changed_by("a round")  # its status, rounds and times
    assert page.body["items"][0]["status"] == "completed"
    waiting.changed_by("a task no longer queued")
    assert waiting.body["items"] == []
    rt.tasks.trigger(Trigger(task_type="leak", title="Low pressure"))
    page.changed_by("a new task")
    assert [t["title"] for t in page.body["items"]] == ["Low pressure", "Turbid water"]


def test_a_page_of_the_task_list_is_sent_again_when_a_wake_up_is_refused_and_when_it_is_sent(
    env: tuple[Runtime, TestClient],
) -> None:
    """A row says `wake_up_unsent` as the task's view does: the page's tag changes when the
    broker refuses a queued task's wake-up (`queued_at` NULL, the status still `queued`) and
    again when the sweeper sends it, or the console's list would keep the row it holds."""
    from orchestrator.store.tasks import get_task, record_unsent, touch_queued

    rt, client = env
    task_id = rt.tasks.trigger(Trigger(task_type="leak", title="Turbid water")).task.task_id
    page = Held(client, "/api/v1/tasks?limit=50")
    assert page.body["items"][0]["wake_up_unsent"] is False
    with rt.db.transaction() as conn:
        assert record_unsent(conn, [(task_id, 1)]) == 1
    page.changed_by("a refused wake-up")
    assert page.body["items"][0]["wake_up_unsent"] is True
    with rt.db.transaction() as conn:
        task = get_task(conn, task_id)
        assert task is not None
        assert touch_queued(conn, task)  # the sweeper's claim of its republish
    page.changed_by("the wake-up sent")
    assert (page.body["items"][0]["status"], page.body["items"][0]["wake_up_unsent"]) == (
        "queued",
        False,
    )


def test_a_task_s_pending_actions_are_304_while_unchanged_and_sent_again_after_each_decision(
    env: tuple[Runtime, TestClient], scripts: Path
) -> None:
    """The console polls an open task's pending actions every 3 s. A decision (approve,
    reject), a new action and a delivery's attempt each change the tag of the lists that show
    them: pending ones, and every status with each approved action's delivery."""
    write_script(
        scripts,
        "wo",
        [
            READ_AND_QUERY,
            {"tool_calls": [plan_call("c1", "r1", [node("repair", "waiting")])]},
            {"tool_calls": [PROPOSE]},
            {"tool_calls": [report_call("c3", "waiting")]},
        ],
    )
    rt, client = env
    task_id = rt.tasks.trigger(Trigger(task_type="wo", title="Low pressure")).task.task_id
    assert rt.executions.run(task_id, 1, worker="w").outcome == "waiting"
    pending = Held(client, f"/api/v1/actions?status=pending_approval&limit=200&task_id={task_id}")
    every = Held(client, f"/api/v1/actions?any=true&task_id={task_id}")
    assert len(pending.body["items"]) == 1
    assert (pending.poll(), every.poll()) == (304, 304)
    assert (pending.poll(), every.poll()) == (304, 304)

    approve_the_action(rt, task_id)
    pending.changed_by("an approval")
    every.changed_by("an approval")
    assert pending.body["items"] == []
    assert every.body["items"][0]["delivery"]["status"] == "pending"
    with rt.db.transaction() as conn:
        conn.execute(
            update(outbox)
            .where(outbox.c.task_id == task_id, outbox.c.kind == "action")
            .values(attempts=1, last_error="HTTP 503")
        )
    every.changed_by("a delivery attempt")
    with rt.db.transaction() as conn:
        conn.execute(
            update(outbox)
            .where(outbox.c.task_id == task_id, outbox.c.kind == "action")
            .values(status="delivered", delivered_at=utcnow(), last_error=None)
        )
    every.changed_by("a delivery")
    assert every.body["items"][0]["delivery"]["status"] == "delivered"

    # Another task proposes a work order: the list of every pending one shows it; rejected.
    every_pending = Held(client, "/api/v1/actions?status=pending_approval&limit=200")
    assert every_pending.body["items"] == []
    other = rt.tasks.trigger(Trigger(task_type="wo", title="Low pressure")).task.task_id
    assert rt.executions.run(other, 1, worker="w").outcome == "waiting"
    every_pending.changed_by("a new action")
    (action,) = every_pending.body["items"]
    rt.actions.decide(action["action_id"], approve=False, by="ana", note="not now", digest=None)
    every_pending.changed_by("a rejection")
    assert every_pending.body["items"] == []


def test_the_approvals_page_s_reads_are_304_while_unchanged_and_sent_again_after_each_change(
    env: tuple[Runtime, TestClient], scripts: Path
) -> None:
    """The console's approvals page polls the pending count and the oldest pending actions
    every 6 s, each with the tag it holds. A new action, an approval, a rejection and a
    supersede (a requeue) each change both; a decision and a new action between two polls
    leave the count as it was (`304`: the same answer) but change the list."""
    write_script(
        scripts,
        "wo",
        [
            READ_AND_QUERY,
            {"tool_calls": [plan_call("c1", "r1", [node("repair", "waiting")])]},
            {"tool_calls": [PROPOSE]},
            {"tool_calls": [report_call("c3", "waiting")]},
        ],
    )
    rt, client = env

    def proposed() -> str:
        task_id = rt.tasks.trigger(Trigger(task_type="wo", title="Low pressure")).task.task_id
        assert rt.executions.run(task_id, 1, worker="w").outcome == "waiting"
        return task_id

    first = proposed()
    count = Held(client, "/api/v1/actions/pending-count")
    oldest = Held(client, "/api/v1/actions?status=pending_approval&order=oldest&limit=50")
    assert (count.body, len(oldest.body["items"])) == ({"pending": 1}, 1)
    assert (count.poll(), oldest.poll()) == (304, 304)
    assert (count.poll(), oldest.poll()) == (304, 304)

    second = proposed()
    count.changed_by("a new action")
    oldest.changed_by("a new action")
    approve_the_action(rt, first)
    count.changed_by("an approval")
    oldest.changed_by("an approval")
    (action,) = rt.actions.list(task_id=second)
    rt.actions.decide(action.action_id, approve=False, by="ana", note="not now", digest=None)
    count.changed_by("a rejection")
    oldest.changed_by("a rejection")
    third = proposed()
    count.changed_by("a new action")
    oldest.changed_by("a new action")
    rt.tasks.requeue(third, "look again", by="ana")
    count.changed_by("a supersede")
    oldest.changed_by("a supersede")
    assert (count.body, oldest.body["items"]) == ({"pending": 0}, [])

    fourth = proposed()
    count.changed_by("a new action")
    oldest.changed_by("a new action")
    approve_the_action(rt, fourth)
    proposed()
    assert count.poll() == 304  # one pending, as before: the same answer
    oldest.changed_by("a decision and a new action")


def test_a_task_s_view_is_sent_again_after_a_retry_of_a_failing_delivery_and_an_answer(
    env: tuple[Runtime, TestClient],
) -> None:
    """Two failing deliveries, backing off: an operator's retry of the one due sooner (due now,
    who and when recorded) and a dispatcher's answer to it (claimed, then failed again, backing
    off less than the other) left the newest next attempt, the attempts and the tallies as they
    were, so the view's tag matched: the task's page kept its Retry, then "being sent now"."""
    from orchestrator.services.outbox_operations import OutboxService

    rt, client = env
    task_id = rt.tasks.trigger(Trigger(task_type="leak", title="Turbid water")).task.task_id
    now = utcnow()
    with rt.db.transaction() as conn:
        for seq, minutes in ((1, 10), (2, 20)):
            conn.execute(
                insert(outbox).values(
                    kind="webhook", task_id=task_id, event_seq=seq, body="{}", status="pending",
                    attempts=1, last_error="HTTP 503", created_at=now,
                    next_attempt_at=now + timedelta(minutes=minutes),
                )
            )  # fmt: skip
        first = conn.execute(
            select(outbox.c.outbox_id).where(outbox.c.task_id == task_id, outbox.c.event_seq == 1)
        ).scalar_one()
    view = Held(client, f"/api/v1/tasks/{task_id}")
    OutboxService(rt.db).retry(first, by="kim", note="mended")
    view.changed_by("an operator's retry")
    with rt.db.transaction() as conn:
        conn.execute(
            update(outbox)
            .where(outbox.c.outbox_id == first)
            .values(attempts=2, claimed_until=now + timedelta(minutes=1))
        )
    view.changed_by("a dispatcher's claim")
    with rt.db.transaction() as conn:
        conn.execute(
            update(outbox)
            .where(outbox.c.outbox_id == first)
            .values(claimed_until=None, next_attempt_at=now + timedelta(minutes=5))
        )
    view.changed_by("the claim's answer")


def test_a_task_s_view_is_sent_again_as_its_settled_deliveries_are_deleted_or_delivered(
    env: tuple[Runtime, TestClient],
) -> None:
    """The tag sums up the task's delivered and discarded rows by their counts alone (read
    from an index, not row by row): deleting one (retention) and delivering a discarded one
    (its send was under way: the backend acted on it) change only those counts."""
    from orchestrator.store import outbox_operator, outbox_retention, outbox_sending

    rt, client = env
    task_id = rt.tasks.trigger(Trigger(task_type="leak", title="Turbid water")).task.task_id
    now = utcnow()
    with rt.db.transaction() as conn:
        for seq, status, delivered in (
            (1, "delivered", 10),
            (2, "delivered", 0),
            (3, "pending", None),
        ):
            conn.execute(
                insert(outbox).values(
                    kind="webhook", task_id=task_id, event_seq=seq, body="{}", status=status,
                    attempts=1, last_error=None if delivered is not None else "HTTP 503",
                    created_at=now - timedelta(days=10), next_attempt_at=now,
                    delivered_at=None if delivered is None else now - timedelta(days=delivered),
                )
            )  # fmt: skip
        failing = conn.execute(
            select(outbox.c.outbox_id).where(outbox.c.task_id == task_id, outbox.c.event_seq == 3)
        ).scalar_one()
    view = Held(client, f"/api/v1/tasks/{task_id}")
    assert view.body["deliveries"]["counts"] == {"webhook": {"delivered": 2, "pending": 1}}

    with rt.db.transaction() as conn:
        gone = outbox_retention.delete_expired_webhooks(
            conn, now - timedelta(days=1), 10, never_sent=False
        )
    assert gone == (1, 0)
    view.changed_by("retention deleting a delivered webhook")
    assert view.body["deliveries"]["counts"] == {"webhook": {"delivered": 1, "pending": 1}}

    with rt.db.transaction() as conn:
        assert outbox_operator.discard(conn, failing, by="kim", reason="backend mended by hand")
    view.changed_by("a discard")
    with rt.db.transaction() as conn:
        assert outbox_sending.mark_delivered(conn, failing) is not None
    view.changed_by("a discarded delivery answered at last")
    assert view.body["deliveries"]["counts"] == {"webhook": {"delivered": 2}}
