"""publish_execution_plan against the real stores: revisions, idempotency, fencing, concurrency."""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import func, insert, select, update

from orchestrator.domain.fences import Fence
from orchestrator.errors import ConflictError, StaleGeneration, ValidationFailed
from orchestrator.services.plans import PlanService, PublishResult
from orchestrator.services.sessions import SessionService
from orchestrator.store import Database, task_plans
from orchestrator.store import actions as action_store
from orchestrator.store import evidence as evidence_store
from orchestrator.store.tables import executions, plan_revisions, tasks
from orchestrator.store.types import utcnow


class Recorder:
    """A notifier that remembers what it was told."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.lock = threading.Lock()

    def notify(self, session_id: str, revision: int) -> None:
        with self.lock:
            self.calls.append((session_id, revision))


def node(node_id: str, status: str = "pending", **extra: Any) -> dict[str, Any]:
    return {"id": node_id, "title": f"step {node_id}", "actor": "agent", "status": status, **extra}


def plan(request_id: str, nodes: list[dict[str, Any]], edges: list[dict[str, Any]] | None = None):  # type: ignore[no-untyped-def]
    return {
        "request_id": request_id,
        "title": "investigate complaint",
        "reason": "first plan",
        "nodes": nodes,
        "edges": edges or [],
    }


def count_revisions(db: Database) -> int:
    with db.transaction(readonly=True) as conn:
        return int(conn.execute(select(func.count()).select_from(plan_revisions)).scalar_one())


def add_task(db: Database, *, status: str = "running", generation: int = 1) -> str:
    task_id = str(uuid.uuid4())
    now = utcnow()
    with db.transaction() as conn:
        conn.execute(
            insert(tasks).values(
                task_id=task_id,
                task_type="water_quality",
                title="complaint",
                context={},
                trigger_id=f"trigger-{task_id}",
                origin="live",
                status=status,
                generation=generation,
                created_at=now,
                updated_at=now,
            )
        )
    return task_id


def add_execution(db: Database, task_id: str, generation: int, session_id: str, token: str) -> None:
    with db.transaction() as conn:
        conn.execute(
            insert(executions).values(
                task_id=task_id,
                generation=generation,
                session_id=session_id,
                lease_token=token,
                created_at=utcnow(),
                started_at=utcnow(),
            )
        )
        conn.execute(update(tasks).where(tasks.c.task_id == task_id).values(session_id=session_id))


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def service(db: Database, recorder: Recorder) -> PlanService:
    return PlanService(db, recorder)


@pytest.fixture
def session_id(db: Database) -> str:
    return SessionService(db).create_session(purpose="ordinary_chat", title="chat").session_id


def test_revisions_count_up_and_each_event_follows_its_commit(
    service: PlanService, recorder: Recorder, session_id: str
) -> None:
    first = service.publish_execution_plan(session_id, plan("r1", [node("a")]))
    second = service.publish_execution_plan(
        session_id, plan("r2", [node("a", "completed", evidence="ph 7.1"), node("b")])
    )
    assert (first.plan.revision, second.plan.revision) == (1, 2)
    assert first.created
    assert second.created
    assert recorder.calls == [(session_id, 1), (session_id, 2)]
    stored = service.revision(session_id, 2).to_dict()
    assert stored["schema_version"] == "execution-plan@1"
    assert stored["session_id"] == session_id
    assert stored["status_counts"]["completed"] == 1
    assert stored["status_counts"]["pending"] == 1
    history = service.history(session_id)
    assert [item["revision"] for item in history["revisions"]] == [1, 2]
    assert history["latest"]["revision"] == 2


def test_same_request_id_and_content_returns_the_stored_revision(
    service: PlanService, recorder: Recorder, session_id: str, db: Database
) -> None:
    first = service.publish_execution_plan(session_id, plan("r1", [node("a")]))
    again = service.publish_execution_plan(session_id, plan("r1", [node("a")]))
    assert not again.created
    assert again.plan == first.plan
    assert count_revisions(db) == 1
    assert recorder.calls == [(session_id, 1)]


def test_same_request_id_with_other_content_is_a_conflict(
    service: PlanService, session_id: str, db: Database
) -> None:
    service.publish_execution_plan(session_id, plan("r1", [node("a")]))
    with pytest.raises(ConflictError) as caught:
        service.publish_execution_plan(session_id, plan("r1", [node("a"), node("b")]))
    assert caught.value.code == "request_id_conflict"
    assert caught.value.http_status == 409
    assert count_revisions(db) == 1


def test_replay_is_recognised_after_later_revisions(service: PlanService, session_id: str) -> None:
    service.publish_execution_plan(session_id, plan("r1", [node("a")]))
    service.publish_execution_plan(session_id, plan("r2", [node("a", "skipped"), node("b")]))
    replay = service.publish_execution_plan(session_id, plan("r1", [node("a")]))
    assert (replay.created, replay.plan.revision) == (False, 1)


def test_history_rules_refuse_and_write_nothing(
    service: PlanService, recorder: Recorder, session_id: str, db: Database
) -> None:
    service.publish_execution_plan(
        session_id, plan("r1", [node("a", "completed", evidence="ok"), node("b")])
    )
    with pytest.raises(ValidationFailed) as caught:
        service.publish_execution_plan(
            session_id, plan("r2", [node("a", "completed", evidence="changed")])
        )
    codes = [detail["code"] for detail in caught.value.details]
    assert codes == ["completed_node_changed", "node_removed"]
    assert count_revisions(db) == 1
    assert recorder.calls == [(session_id, 1)]


def test_unknown_session_is_refused_with_the_other_problems(
    service: PlanService, db: Database
) -> None:
    with pytest.raises(ValidationFailed) as caught:
        service.publish_execution_plan("no-such-session", plan("r1", []))
    assert caught.value.code == "unknown_session"
    assert [d["code"] for d in caught.value.details] == ["unknown_session", "empty_plan"]
    assert count_revisions(db) == 0


def test_after_commit_hook_sees_the_committed_revision(
    service: PlanService, session_id: str, db: Database
) -> None:
    seen: list[tuple[int, bool, int]] = []

    def hook(result: PublishResult) -> None:
        seen.append((result.plan.revision, result.created, count_revisions(db)))

    service.publish_execution_plan(session_id, plan("r1", [node("a")]), after_commit=hook)
    service.publish_execution_plan(session_id, plan("r1", [node("a")]), after_commit=hook)
    assert seen == [(1, True, 1), (1, False, 1)]


def test_fenced_publish_from_the_live_generation_is_accepted(db: Database) -> None:
    task_id = add_task(db, generation=2)
    session = SessionService(db).create_session(
        purpose="task_execution", title="run", task_id=task_id, generation=2
    )
    add_execution(db, task_id, 2, session.session_id, "tok-2")
    result = PlanService(db).publish_execution_plan(
        session.session_id, plan("r1", [node("a")]), fence=Fence(task_id, 2, "tok-2")
    )
    assert (result.plan.task_id, result.plan.generation) == (task_id, 2)


@pytest.mark.parametrize(
    ("fence_generation", "fence_token"), [(1, "tok-1"), (2, "stolen"), (3, "tok-2")]
)
def test_fenced_publish_from_a_stale_generation_is_refused(
    db: Database, fence_generation: int, fence_token: str
) -> None:
    task_id = add_task(db, generation=2)
    session = SessionService(db).create_session(
        purpose="task_execution", title="run", task_id=task_id, generation=2
    )
    add_execution(db, task_id, 1, session.session_id, "tok-1")
    add_execution(db, task_id, 2, session.session_id, "tok-2")
    recorder = Recorder()
    hooked: list[PublishResult] = []
    with pytest.raises(StaleGeneration):
        PlanService(db, recorder).publish_execution_plan(
            session.session_id,
            plan("r1", [node("a")]),
            fence=Fence(task_id, fence_generation, fence_token),
            after_commit=hooked.append,
        )
    assert count_revisions(db) == 0
    assert recorder.calls == []
    assert hooked == []


@pytest.mark.parametrize("whose", ["another task's", "an older generation's"])
def test_a_live_fence_writes_only_its_own_generations_session(db: Database, whose: str) -> None:
    task_id = add_task(db, generation=2)
    if whose == "another task's":
        target = SessionService(db).create_session(
            purpose="task_collaboration", title="chat", task_id=add_task(db)
        )
    else:
        target = SessionService(db).create_session(
            purpose="task_execution", title="run 1", task_id=task_id, generation=1
        )
    add_execution(db, task_id, 2, target.session_id, "tok-2")
    with pytest.raises(ConflictError) as caught:
        PlanService(db).publish_execution_plan(
            target.session_id, plan("r1", [node("a")]), fence=Fence(task_id, 2, "tok-2")
        )
    assert caught.value.code == "session_mismatch"
    assert count_revisions(db) == 0


def test_an_unfenced_publish_to_an_execution_session_is_refused(db: Database) -> None:
    # Invariant 9: the decision reads this session's plan, so only its execution may write it.
    task_id = add_task(db)
    session = SessionService(db).create_session(
        purpose="task_execution", title="run", task_id=task_id, generation=1
    )
    add_execution(db, task_id, 1, session.session_id, "tok")
    recorder = Recorder()
    with pytest.raises(ConflictError) as caught:
        PlanService(db, recorder).publish_execution_plan(
            session.session_id, plan("r1", [node("a")])
        )
    assert caught.value.code == "fence_required"
    assert count_revisions(db) == 0
    assert recorder.calls == []


@pytest.mark.parametrize("fenced", [False, True], ids=["chat", "execution"])
def test_twenty_concurrent_publishes_give_revisions_one_to_twenty(
    pg_url: str, fenced: bool
) -> None:
    # Fenced: the calls of one turn run concurrently under one fence; the session's lock and
    # its latest revision are read in one statement, which must see every earlier commit.
    db = Database.from_url(pg_url, pool_size=20, max_overflow=5)
    try:
        recorder = Recorder()
        service = PlanService(db, recorder)
        fence = None
        if fenced:
            task_id = add_task(db)
            session_id = (
                SessionService(db)
                .create_session(purpose="task_execution", title="r", task_id=task_id, generation=1)
                .session_id
            )
            add_execution(db, task_id, 1, session_id, "tok")
            fence = Fence(task_id, 1, "tok")
        else:
            session_id = (
                SessionService(db).create_session(purpose="ordinary_chat", title="c").session_id
            )
        barrier = threading.Barrier(20)
        errors: list[BaseException] = []
        results: list[int] = []

        def publish(index: int) -> None:
            try:
                barrier.wait(timeout=30)
                result = service.publish_execution_plan(
                    session_id, plan(f"r{index}", [node(f"n{i}") for i in range(40)]), fence=fence
                )
                results.append(result.plan.revision)
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=publish, args=(i,)) for i in range(20)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert errors == []
        assert sorted(results) == list(range(1, 21))
        with db.transaction(readonly=True) as conn:
            stored = conn.execute(
                select(plan_revisions.c.revision)
                .where(plan_revisions.c.session_id == session_id)
                .order_by(plan_revisions.c.revision)
            ).scalars()
            assert list(stored) == list(range(1, 21))
        assert sorted(revision for _, revision in recorder.calls) == list(range(1, 21))
    finally:
        db.dispose()


def test_concurrent_replays_of_one_request_id_store_one_revision(pg_url: str) -> None:
    db = Database.from_url(pg_url, pool_size=10)
    try:
        recorder = Recorder()
        service = PlanService(db, recorder)
        session_id = (
            SessionService(db).create_session(purpose="ordinary_chat", title="c").session_id
        )
        barrier = threading.Barrier(8)
        created: list[bool] = []

        def publish() -> None:
            barrier.wait(timeout=30)
            created.append(
                service.publish_execution_plan(session_id, plan("same", [node("a")])).created
            )

        threads = [threading.Thread(target=publish) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert sorted(created) == [False] * 7 + [True]
        assert count_revisions(db) == 1
        assert recorder.calls == [(session_id, 1)]
    finally:
        db.dispose()


def test_state_is_running_only_for_the_current_session_of_a_running_task(db: Database) -> None:
    task_id = add_task(db, status="running")
    sessions = SessionService(db)
    current = sessions.create_session(purpose="task_execution", title="run", task_id=task_id)
    older = sessions.create_session(purpose="task_execution", title="old", task_id=task_id)
    chat = sessions.create_session(purpose="ordinary_chat", title="chat")
    add_execution(db, task_id, 1, current.session_id, "tok")
    plans = PlanService(db)
    assert plans.state(current.session_id).running
    assert not plans.state(older.session_id).running
    assert not plans.state(chat.session_id).running
    with db.transaction() as conn:
        conn.execute(update(tasks).where(tasks.c.task_id == task_id).values(status="waiting"))
    assert not plans.state(current.session_id).running


def test_the_tasks_plan_is_its_highest_revision_whatever_the_writers_clocks(
    db: Database,
) -> None:
    # Revision 2 is written by a process whose clock runs 5 s behind the writer of revision 1
    # (a worker and the API on two machines): the revision number, not the clock, says which
    # is newer, for the task's plan and for the next generation's continuity check.
    task_id = add_task(db, generation=1)
    first = SessionService(db).create_session(
        purpose="task_execution", title="run 1", task_id=task_id, generation=1
    )
    add_execution(db, task_id, 1, first.session_id, "tok-1")
    now = utcnow()
    fence = Fence(task_id, 1, "tok-1")
    PlanService(db, clock=lambda: now).publish_execution_plan(
        first.session_id, plan("r1", [node("a")]), fence=fence
    )
    PlanService(db, clock=lambda: now - timedelta(seconds=5)).publish_execution_plan(
        first.session_id, plan("r2", [node("a"), node("b")]), fence=fence
    )
    with db.transaction(readonly=True) as conn:
        latest = task_plans.task_latest_plan(conn, task_id)
    assert latest is not None
    assert latest.revision == 2

    with db.transaction() as conn:
        conn.execute(update(tasks).where(tasks.c.task_id == task_id).values(generation=2))
    second = SessionService(db).create_session(
        purpose="task_execution", title="run 2", task_id=task_id, generation=2
    )
    add_execution(db, task_id, 2, second.session_id, "tok-2")
    with pytest.raises(ValidationFailed) as caught:
        PlanService(db).publish_execution_plan(
            second.session_id, plan("g2", [node("a")]), fence=Fence(task_id, 2, "tok-2")
        )
    assert [p["node_id"] for p in caught.value.details if p["code"] == "node_removed"] == ["b"]


def test_the_tasks_plan_is_an_execution_plan_not_one_of_its_other_sessions(
    db: Database,
) -> None:
    task_id = add_task(db, generation=1)
    run = SessionService(db).create_session(
        purpose="task_execution", title="run", task_id=task_id, generation=1
    )
    add_execution(db, task_id, 1, run.session_id, "tok-1")
    plans = PlanService(db)
    plans.publish_execution_plan(
        run.session_id, plan("r1", [node("a")]), fence=Fence(task_id, 1, "tok-1")
    )
    # A chat about the task takes a plan of its own (the bridge publishes there unfenced): it
    # belongs to no generation, and is not the task's plan.
    chat = SessionService(db).create_session(
        purpose="task_collaboration", title="chat", task_id=task_id
    )
    plans.publish_execution_plan(chat.session_id, plan("c1", [node("z")]))
    with db.transaction(readonly=True) as conn:
        latest = task_plans.task_latest_plan(conn, task_id)
    assert latest is not None
    assert (latest.session_id, latest.revision) == (run.session_id, 1)


@pytest.mark.parametrize("cited", ["x\ud800", "x\x00"], ids=["surrogate", "nul"])
def test_a_cited_id_no_store_can_hold_is_a_refusal_not_a_store_error(
    db: Database, cited: str
) -> None:
    task_id = add_task(db, generation=1)
    run = SessionService(db).create_session(
        purpose="task_execution", title="run", task_id=task_id, generation=1
    )
    add_execution(db, task_id, 1, run.session_id, "tok-1")
    done = node("a", "completed", evidence="seen", evidence_ids=[cited])
    with pytest.raises(ValidationFailed) as caught:
        PlanService(db).publish_execution_plan(
            run.session_id, plan("r1", [done]), fence=Fence(task_id, 1, "tok-1")
        )
    assert caught.value.code in ("invalid_character", "invalid_type")
    assert count_revisions(db) == 0


def running_task(db: Database) -> tuple[str, str, Fence]:
    """A running task at generation 1 with its execution session: (task, session, fence)."""
    task_id = add_task(db, generation=1)
    run = SessionService(db).create_session(
        purpose="task_execution", title="run", task_id=task_id, generation=1
    )
    add_execution(db, task_id, 1, run.session_id, "tok-1")
    return task_id, run.session_id, Fence(task_id, 1, "tok-1")


def recorded_evidence(db: Database, fence: Fence, session_id: str) -> str:
    row = evidence_store.EvidenceRow(
        task_id=fence.task_id,
        generation=fence.generation,
        session_id=session_id,
        kind="data_source",
        source="scada",
        origin="live",
        truncated=False,
        params_digest="0" * 64,
        content_hash="1" * 64,
        result_id=None,
        row_count=1,
        char_count=10,
        summary="chlorine 0.4 mg/L",
        queried_at=utcnow(),
    )
    with db.transaction() as conn:
        return str(evidence_store.insert_record(conn, row)["evidence_id"])


def test_a_node_naming_another_tasks_approved_action_is_refused(db: Database) -> None:
    # Task A's work order was approved. Task B's agent names it on its own node, to complete
    # the node as if its own work order had been approved.
    other_id, other_session, other_fence = running_task(db)
    with db.transaction() as conn:
        other = action_store.insert_action(
            conn, other_fence, other_session, "repair", "work_order", {"crew": "north"}
        )
        assert action_store.decide_action(conn, other.action_id, "approved", "duty", None)
    task_id, session_id, fence = running_task(db)
    cited = recorded_evidence(db, fence, session_id)
    plans = PlanService(db)
    plans.publish_execution_plan(session_id, plan("r1", [node("repair")]), fence=fence)
    done = node("repair", "completed", evidence="crew fixed it", evidence_ids=[cited])
    for claimed in (done, node("repair", "waiting", reason="crew on the way")):
        with pytest.raises(ValidationFailed) as caught:
            plans.publish_execution_plan(
                session_id,
                plan(f"r-{claimed['status']}", [dict(claimed, action_id=other.action_id)]),
                fence=fence,
            )
        assert [p["code"] for p in caught.value.details] == ["unknown_action"]
    assert count_revisions(db) == 1
    # The same node, completed on its own evidence without naming an action, is accepted.
    plans.publish_execution_plan(session_id, plan("r2", [done]), fence=fence)
    with db.transaction(readonly=True) as conn:
        assert task_plans.action_statuses(conn, task_id, [other.action_id]) == {}
        assert task_plans.action_statuses(conn, other_id, [other.action_id]) == {
            other.action_id: "approved"
        }
        assert task_plans.action_statuses(conn, None, [other.action_id]) == {}


def test_a_node_citing_another_tasks_evidence_is_refused(db: Database) -> None:
    _, other_session, other_fence = running_task(db)
    elsewhere = recorded_evidence(db, other_fence, other_session)
    _, session_id, fence = running_task(db)
    done = node("a", "completed", evidence="seen", evidence_ids=[elsewhere])
    with pytest.raises(ValidationFailed) as caught:
        PlanService(db).publish_execution_plan(session_id, plan("r1", [done]), fence=fence)
    assert [p["code"] for p in caught.value.details] == ["unknown_evidence"]
