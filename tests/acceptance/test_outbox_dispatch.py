"""The outbox with real processes: an approval through the CLI, `orchestrator outbox dispatch`
SIGKILLed while the business backend holds the action's answer, then restarted."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.runtime import Runtime
from orchestrator.services.outbox import OutboxService
from tests.acceptance.fleet import Fleet
from tests.executions_support import runtime_for, wait_for
from tests.outbox_support import Recorder, running_recorder, waiting_task

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
