"""Plan wake-ups: Redis pub/sub across clients, same-process wake-ups, and the SSE generator
and its route: when the stream of a finished session ends, and when a reconnect is a 204."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from orchestrator.api.app import create_app
from orchestrator.api.stream import _events, keepalive_event
from orchestrator.domain.fences import Fence
from orchestrator.errors import NotFound
from orchestrator.events import PlanHub, RedisNotifier
from orchestrator.runtime import Runtime
from orchestrator.services.plans import PlanService
from orchestrator.services.sessions import SessionService
from orchestrator.services.tasks import Trigger
from orchestrator.store import Database
from orchestrator.store import executions as execution_store
from orchestrator.store.receipts import ReceiptLedger
from tests.executions_support import claim_as_worker, node, plan_call, runtime_for
from tests.sse_support import parse


def test_a_redis_publish_wakes_a_subscriber_long_before_the_poll(redis_url: str) -> None:
    async def scenario() -> tuple[bool, float, bool]:
        hub = PlanHub(redis_url, poll_seconds=30)
        await hub.start()
        notifier = RedisNotifier(redis_url)
        try:
            await asyncio.wait_for(hub.subscribed.wait(), 10)
            with hub.subscribe("s1") as mine, hub.subscribe("s2") as other:
                started = time.monotonic()
                await asyncio.to_thread(notifier.notify, "s1", 1)
                woken = await mine.wait(10)
                elapsed = time.monotonic() - started
                other_woken = await other.wait(0.3)
            return woken, elapsed, other_woken
        finally:
            notifier.close()
            await hub.stop()

    woken, elapsed, other_woken = asyncio.run(scenario())
    assert woken
    assert elapsed < 2
    assert not other_woken


def test_a_wake_up_before_the_wait_is_not_lost() -> None:
    async def scenario() -> bool:
        hub = PlanHub(None, poll_seconds=30)
        await hub.start()
        try:
            with hub.subscribe("s") as subscription:
                subscription.clear()
                await asyncio.to_thread(hub.notify, "s", 1)  # from another thread, before waiting
                return await subscription.wait(2)
        finally:
            await hub.stop()

    assert asyncio.run(scenario())


def test_stream_sends_state_revisions_and_keep_alives(sqlite_url: str) -> None:
    db = Database.from_url(sqlite_url)
    hub = PlanHub(None, poll_seconds=0.1)
    plans = PlanService(db, hub)
    session_id = SessionService(db).create_session(purpose="ordinary_chat", title="c").session_id
    body = {"request_id": "r1", "title": "p", "nodes": [
        {"id": "a", "title": "a", "actor": "agent", "status": "pending"}]}  # fmt: skip

    async def scenario() -> list[bytes]:
        await hub.start()
        chunks: list[bytes] = []
        stream = _events(plans, hub, plans.state(session_id), None, keepalive=0.3)
        try:
            chunks.append(await anext(stream))
            await asyncio.to_thread(plans.publish_execution_plan, session_id, body)
            chunks.append(await anext(stream))
            chunks.append(await anext(stream))  # idle: a keep-alive comes next
        finally:
            await stream.aclose()
            await hub.stop()
        return chunks

    try:
        state, plan, keepalive = asyncio.run(scenario())
    finally:
        db.dispose()
    assert state.startswith(b"event: state\n")
    assert plan.startswith(b"event: execution_plan\nid: 1\ndata: {")
    assert keepalive == keepalive_event(0.3)


def test_an_event_id_from_elsewhere_resumes_from_the_newest_revision(sqlite_url: str) -> None:
    db = Database.from_url(sqlite_url)
    hub = PlanHub(None, poll_seconds=0.1)
    plans = PlanService(db, hub)
    session_id = SessionService(db).create_session(purpose="ordinary_chat", title="c").session_id
    node = {"id": "a", "title": "a", "actor": "agent", "status": "pending"}

    async def scenario() -> list[bytes]:
        await hub.start()
        stream = _events(plans, hub, plans.state(session_id), 99, keepalive=5)
        try:
            chunks = [await anext(stream)]
            body = {"request_id": "r1", "title": "p", "nodes": [node]}
            await asyncio.to_thread(plans.publish_execution_plan, session_id, body)
            chunks.append(await asyncio.wait_for(anext(stream), 5))
        finally:
            await stream.aclose()
            await hub.stop()
        return chunks

    try:
        _, first = asyncio.run(scenario())
    finally:
        db.dispose()
    assert first.startswith(b"event: execution_plan\nid: 1\n")


def test_a_deleted_sessions_stream_ends_and_a_new_connection_is_404(sqlite_url: str) -> None:
    db = Database.from_url(sqlite_url)
    hub = PlanHub(None, poll_seconds=0.1)
    plans = PlanService(db, hub)
    session_id = SessionService(db).create_session(purpose="ordinary_chat", title="c").session_id

    async def scenario() -> list[bytes]:
        await hub.start()
        stream = _events(plans, hub, plans.state(session_id), None, keepalive=0.2)
        chunks: list[bytes] = []
        try:
            chunks.append(await anext(stream))
            chunks.append(await asyncio.wait_for(anext(stream), 5))  # a keep-alive: it lives
            await asyncio.to_thread(ReceiptLedger(db).delete_session, session_id)
            async with asyncio.timeout(5):  # not keep-alives forever: the stream ends
                chunks += [chunk async for chunk in stream]
        finally:
            await stream.aclose()
            await hub.stop()
        return chunks

    try:
        chunks = asyncio.run(scenario())
        with pytest.raises(NotFound):
            plans.state(session_id)  # what a new connection asks first: a 404
    finally:
        db.dispose()
    assert chunks[0].startswith(b"event: state\n")
    assert chunks[1] == keepalive_event(0.2)
    assert len(chunks) <= 3  # at most one more keep-alive before the session was found gone


# The stream of a session nothing more can be written to ends, and its reconnect is a 204.
# The writes of an execution's session are fenced by its task's row: an agent's publish carries
# its generation, a person's step goes to the task's current session, and both only while the
# task is not final. So once the task is final, or a newer generation has its own session,
# the old session is finished for good.


@pytest.fixture
def rt(store_url: str, tmp_path: Path) -> Iterator[Runtime]:
    runtime, _ = runtime_for(store_url, tmp_path / "scripts")
    yield runtime
    runtime.close()


def plan_body(request_id: str, status: str = "running") -> dict[str, Any]:
    return dict(plan_call("p", request_id, [node("a", status), node("b", "pending")])["arguments"])


def running_generation(rt: Runtime) -> tuple[Fence, str]:
    """A triggered task whose generation 1 a worker claimed and which published revision 1."""
    task_id = rt.tasks.trigger(Trigger(task_type="stream", title="Turbid water")).task.task_id
    token = claim_as_worker(rt, task_id, 1, "stream-worker", ttl=60)
    with rt.db.transaction(readonly=True) as conn:
        execution = execution_store.get_execution(conn, task_id, 1)
    assert execution is not None
    fence = Fence(task_id, 1, token)
    rt.plans.publish_execution_plan(execution.session_id, plan_body("r1"), fence=fence)
    return fence, execution.session_id


def finish(rt: Runtime, task_id: str, how: str) -> None:
    if how == "cancel":
        assert rt.tasks.cancel(task_id).status == "cancelled"
    else:  # a newer generation writes to a new session
        assert rt.tasks.requeue(task_id, "a fresh look").generation == 2


class CommitsBeforeTheCheck(PlanService):
    """Runs `before` (once) just ahead of the stream's look at whether the session is finished:
    a revision that commits after the stream's last read, and then the end of its writes."""

    def __init__(self, db: Database, before: Callable[[], None]) -> None:
        super().__init__(db)
        self.before: list[Callable[[], None]] = [before]
        self.checks = 0

    def takes_writes(self, session_id: str) -> bool:
        self.checks += 1
        if self.before:
            self.before.pop()()
        return super().takes_writes(session_id)


@pytest.mark.parametrize("how", ["cancel", "requeue"])
def test_a_finished_generations_stream_sends_what_is_left_then_ends(rt: Runtime, how: str) -> None:
    fence, session_id = running_generation(rt)

    def last_revision_then_the_end() -> None:
        # Not announced (no wake-up): only the stream's own reads can find it.
        PlanService(rt.db).publish_execution_plan(session_id, plan_body("r2"), fence=fence)
        finish(rt, fence.task_id, how)

    plans = CommitsBeforeTheCheck(rt.db, last_revision_then_the_end)
    hub = PlanHub(None, poll_seconds=30)  # woken by nothing but the keep-alive timer

    async def scenario() -> list[bytes]:
        await hub.start()
        stream = _events(plans, hub, plans.state(session_id), None, keepalive=0.2)
        try:
            async with asyncio.timeout(5):  # not keep-alives forever: the stream ends
                return [chunk async for chunk in stream]
        finally:
            await stream.aclose()
            await hub.stop()

    chunks = asyncio.run(scenario())
    assert chunks[0].startswith(b"event: state\nid: 1\n")
    # The revision that committed before the end is sent, then the stream ends at once.
    assert [chunk.split(b"\n")[:2] for chunk in chunks[1:]] == [
        [b"event: execution_plan", b"id: 2"]
    ]
    assert plans.checks == 1  # looked at once per keep-alive, not on every read


@pytest.mark.parametrize("how", ["cancel", "requeue"])
def test_a_reconnect_that_saw_a_finished_sessions_newest_revision_is_204(
    rt: Runtime, how: str
) -> None:
    fence, session_id = running_generation(rt)
    finish(rt, fence.task_id, how)
    path = f"/api/v1/agent/chat/session/{session_id}/stream"
    with TestClient(create_app(rt.settings, db=rt.db)) as client:
        # A first connection gets the saved plan (seed 004), with the id it is current to,
        # and the stream ends: the browser's reconnect then sends that id...
        first = client.get(path)
        assert first.status_code == 200
        [state] = parse(first.text)
        assert (state["event"], state["id"]) == ("state", "1")
        assert [p["revision"] for p in state["data"]["execution_plans"]] == [1]
        assert state["data"]["running"] is False
        # ... and a 204 is what stops an EventSource (an id above the newest: the same).
        for seen in ("1", "99"):
            again = client.get(path, headers={"Last-Event-ID": seen})
            assert again.status_code == 204, again.text
            assert again.content == b""
        # A reconnect that has not seen the newest revision gets it, then the end.
        behind = client.get(path, headers={"Last-Event-ID": "0"})
        assert behind.status_code == 200
        assert [(m["event"], m.get("id")) for m in parse(behind.text)] == [
            ("state", None),
            ("execution_plan", "1"),
        ]


def test_a_live_sessions_reconnect_is_not_204(rt: Runtime) -> None:
    _, session_id = running_generation(rt)
    path = f"/api/v1/agent/chat/session/{session_id}/stream"
    with (
        TestClient(create_app(rt.settings, db=rt.db)) as client,
        client.stream("GET", path, headers={"Last-Event-ID": "1"}) as response,
    ):
        assert response.status_code == 200
        assert next(response.iter_lines()) == "event: state"


@pytest.mark.parametrize("kind", ["running generation", "collaboration", "ordinary chat"])
def test_a_session_that_can_still_change_keeps_its_stream(rt: Runtime, kind: str) -> None:
    fence, session_id = running_generation(rt)
    if kind == "collaboration":
        # Plans are published to it without a fence, whatever its task does.
        rt.tasks.cancel(fence.task_id)
        session_id = (
            SessionService(rt.db)
            .create_session(purpose="task_collaboration", title="ask", task_id=fence.task_id)
            .session_id
        )
    elif kind == "ordinary chat":
        session_id = (
            SessionService(rt.db).create_session(purpose="ordinary_chat", title="c").session_id
        )
    plans = PlanService(rt.db)
    hub = PlanHub(None, poll_seconds=30)

    async def scenario() -> list[bytes]:
        await hub.start()
        stream = _events(plans, hub, plans.state(session_id), None, keepalive=0.1)
        try:
            async with asyncio.timeout(5):
                return [await anext(stream) for _ in range(4)]
        finally:
            await stream.aclose()
            await hub.stop()

    chunks = asyncio.run(scenario())
    assert chunks[0].startswith(b"event: state\n")
    assert chunks[1:] == [keepalive_event(0.1)] * 3
