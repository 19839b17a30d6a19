"""The outbox with real processes: an approval through the CLI, `orchestrator outbox dispatch`
SIGKILLed while the business backend holds the action's answer, then restarted."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.runtime import Runtime
from orchestrator.services.outbox_operations import OutboxService
from orchestrator.services.tasks import Trigger
from orchestrator.store import task_events as event_store
from orchestrator.store.outbox import OutboxRow
from tests.acceptance.fleet import Fleet
from tests.executions_support import runtime_for, wait_for
from tests.outbox_support import Recorder, approved_action, running_recorder, waiting_task

SECRET = "acceptance-webhook-secret"


@pytest.fixture
def backend() -> Iterator[Recorder]:
    with running_recorder() as recorder:
        yield recorder


@pytest.fixture
def settings_env(pg_url: str, scripts: Path, tmp_path: Path, backend: Recorder) -> dict[str, str]:
    return {
        "ORCH_DATABASE_URL": pg_url,
        "ORCH_MODEL": f"scripted:{scripts}",
        "ORCH_HOME": str(tmp_path / "home"),
        "ORCH_ACTIONS_URL": f"{backend.url}/actions",
        "ORCH_ACTIONS_SECRET": "actions-secret-for-the-fleet",
        "ORCH_WEBHOOK_URL": f"{backend.url}/hooks",
        "ORCH_WEBHOOK_SECRET": SECRET,
        "ORCH_OUTBOX_TIMEOUT_SECONDS": "2",
        "ORCH_OUTBOX_BACKOFF_SECONDS": "0.2",
        "ORCH_OUTBOX_POLL_SECONDS": "0.2",
    }


@pytest.fixture
def fleet(settings_env: dict[str, str], tmp_path: Path) -> Iterator[Fleet]:
    running = Fleet(settings_env, tmp_path)
    yield running
    running.stop()


@pytest.fixture
def rt(pg_url: str, scripts: Path) -> Iterator[Runtime]:
    runtime, _ = runtime_for(pg_url, scripts)
    yield runtime
    runtime.close()


@pytest.mark.slow
def test_an_approval_reaches_the_backend_once_across_a_sigkilled_dispatcher(
    fleet: Fleet, rt: Runtime, backend: Recorder, tmp_path: Path
) -> None:
    task_id, action_id = waiting_task(rt, tmp_path)
    digest = rt.actions.get(action_id).digest  # an approval names what it approves
    approved = fleet.cli(
        "actions", "approve", action_id, "--digest", digest, "--by", "duty engineer"
    )
    assert approved.returncode == 0, approved.stderr
    backend.delay_seconds, backend.slow_path = 60.0, "/actions"
    doomed = fleet.dispatcher()
    wait_for(lambda: backend.on("/actions"), 30, what="the action's first send")
    Fleet.kill(doomed)  # the backend applied it; the dispatcher never heard back
    backend.release.set()
    backend.delay_seconds = 0.0
    [row] = OutboxService(rt.db).list(task_id=task_id, kind="action")
    assert row.status == "pending"

    fleet.dispatcher()

    def all_delivered() -> bool:
        return not OutboxService(rt.db).list(task_id=task_id, status="pending")

    wait_for(all_delivered, 30, what="every delivery", interval=0.2)
    sends = backend.on("/actions")
    assert len(sends) == 2, fleet.logs()  # sent again after the crash...
    assert {s.headers["idempotency-key"] for s in sends} == {action_id}
    assert backend.applied == [action_id]  # ...and applied once by a backend honouring the key
    [row] = OutboxService(rt.db).list(task_id=task_id, kind="action")
    assert (row.status, row.attempts) == ("delivered", 2)
    # No event lost across the crash, each at least once, first arrivals in order.
    seqs = [hook.body["seq"] for hook in backend.on("/hooks")]
    first_seen = [seq for i, seq in enumerate(seqs) if seq not in seqs[:i]]
    assert first_seen == [3, 4, 5]
    show = fleet.cli("tasks", "show", task_id)
    assert show.returncode == 0, show.stderr
    assert "deliveries: action delivered 1; webhook delivered 3" in show.stdout


def _action_row(rt: Runtime, outbox_id: int) -> OutboxRow:
    [row] = [r for r in OutboxService(rt.db).list(kind="action") if r.outbox_id == outbox_id]
    return row


@pytest.mark.slow
def test_a_delivery_waiting_its_turn_in_a_dispatchers_batch_can_be_discarded_and_is_not_sent(
    settings_env: dict[str, str], rt: Runtime, backend: Recorder, tmp_path: Path
) -> None:
    """A dispatcher claims a batch and posts its rows one after another, each re-checked by a
    compare-and-set (pending, the claim's attempt) as its turn comes. An operator's discard of
    a row still waiting its turn was refused `being_sent`, though nothing had been sent: it is
    settled now, and the dispatcher, its turn come, finds it discarded and does not post it. A
    retry of it is still refused: it is about to be sent. Never posted, it shows no attempt
    (it kept the attempt its claim counted)."""
    actions_only = {k: v for k, v in settings_env.items() if "WEBHOOK" not in k}
    fleet = Fleet(actions_only | {"ORCH_OUTBOX_TIMEOUT_SECONDS": "30"}, tmp_path)
    try:
        for _ in range(2):
            approved_action(rt, tmp_path)
        backend.delay_seconds, backend.slow_path = 60.0, "/actions"  # held until `release`
        fleet.dispatcher()
        wait_for(lambda: backend.on("/actions"), 30, what="the batch's first send")
        first = int(backend.on("/actions")[0].headers["x-orchestrator-delivery"])
        [second] = [
            r.outbox_id for r in OutboxService(rt.db).list(kind="action") if r.outbox_id != first
        ]
        waiting = _action_row(rt, second)
        assert (waiting.status, waiting.attempts, waiting.sending_since) == ("pending", 1, None)
        assert waiting.claimed_until is not None  # claimed in the batch, not posted

        retried = fleet.cli("outbox", "retry", str(second), "--by", "kim")
        assert retried.returncode == 1, retried.stdout + retried.stderr
        assert retried.stderr.startswith(
            f"orchestrator: being_sent: outbox row {second} is claimed by a dispatcher and "
            "waits its turn in the batch it sends (attempt 1, held until "
        ), retried.stderr
        assert "it is posted when its turn comes: a retry would not send it sooner" in (
            retried.stderr
        )

        discarded = fleet.cli(
            "outbox", "discard", str(second), "--reason", "done by phone", "--by", "kim"
        )
        assert discarded.returncode == 0, discarded.stdout + discarded.stderr
        row = _action_row(rt, second)
        assert (row.status, row.discarded_from, row.discarded_by) == ("discarded", "pending", "kim")
        # Nothing was posted: the claim's attempt is taken back (it read `attempts 1`).
        assert (row.attempts, row.claimed_until) == (0, None)

        backend.release.set()
        backend.delay_seconds = 0.0
        wait_for(lambda: _action_row(rt, first).status == "delivered", 30, what="the first")
        # A third approval, delivered by the same dispatcher: its batch (and the discarded
        # row's turn in it) is over.
        _, third_action = approved_action(rt, tmp_path)
        wait_for(
            lambda: any(
                s.headers["idempotency-key"] == third_action for s in backend.on("/actions")
            ),
            30,
            what="the next batch",
        )
        assert second not in {
            int(s.headers["x-orchestrator-delivery"]) for s in backend.on("/actions")
        }, fleet.logs()
        row = _action_row(rt, second)
        assert (row.status, row.attempts, row.last_error) == ("discarded", 0, None)
        shown = fleet.cli("outbox", "show", str(second))
        assert "  attempts 0 (throttled 0)\n" in shown.stdout, shown.stdout + shown.stderr
        assert _action_row(rt, first).attempts == 1  # posted once, delivered
    finally:
        backend.release.set()
        fleet.stop()


@pytest.mark.slow
def test_a_webhook_is_dead_lettered_only_after_its_attempts_were_posted_across_dispatchers(
    settings_env: dict[str, str], rt: Runtime, backend: Recorder, tmp_path: Path
) -> None:
    """Two `orchestrator outbox dispatch` processes and a backend slow to answer (and failing
    every time). A dispatcher claims a batch, each row's attempt counted, and posts its rows
    one after another; the rows waiting their turn were not held again meanwhile, so once
    their hold ran out the other dispatcher claimed them, counting a second attempt for one
    post, and the first, its turn come, skipped them. Webhooks were dead-lettered (3 attempts,
    ORCH_WEBHOOK_MAX_ATTEMPTS) after one or two posts. A live dispatcher now keeps its
    batch's waiting rows held as it posts the others: each row's attempts are its posts."""
    env = settings_env | {
        "ORCH_OUTBOX_TIMEOUT_SECONDS": "1",  # a claim holds a row 2 s
        "ORCH_WEBHOOK_MAX_ATTEMPTS": "3",
    }
    fleet = Fleet(env, tmp_path)
    try:
        task_ids = [
            rt.tasks.trigger(Trigger(task_type="t", title=f"Main {n}")).task.task_id
            for n in range(10)
        ]
        with rt.db.transaction() as conn:  # one event each: all ten due at once
            for task_id in task_ids:
                event_store.record_event(conn, task_id, "waiting", reason="r")
        backend.always_fail = True
        backend.delay_seconds = 0.6  # each answer: ten rows in a batch take 6 s
        first = fleet.dispatcher()
        wait_for(lambda: backend.on("/hooks"), 30, what="the first batch's first post")
        fleet.dispatcher()  # starts while the first batch is posted

        def all_dead() -> list[OutboxRow]:
            rows = OutboxService(rt.db).list(kind="webhook")
            return rows if {row.status for row in rows} == {"dead"} else []

        rows = wait_for(all_dead, 90, what="every webhook dead-lettered", interval=0.5)
        assert first.poll() is None, fleet.logs()
        posts = Counter(int(r.headers["x-orchestrator-delivery"]) for r in backend.on("/hooks"))
        assert {row.outbox_id: (row.attempts, posts[row.outbox_id]) for row in rows} == {
            row.outbox_id: (3, 3) for row in rows
        }, fleet.logs()
    finally:
        fleet.stop()
