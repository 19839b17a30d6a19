"""A change that queues a generation says when the broker refused its wake-up: a requeue, an
approval, a person's step and a resolution answer `dispatched: false` in the API, and their CLI
commands print a line and still exit 0 (the change is committed; the sweeper sends the wake-up
at its first sweep once Redis is back, `test_unsent_wake_ups.py`). Before, only the service's
log line said so: the operator read "requeued" and waited for a worker that was never woken.

Redis is really stopped: a redis-server started, then killed (nothing listens on its port). The
tasks are brought to the change with a `RecordingDispatcher`; the change itself goes through
the CLI or the API on the stopped Redis.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from orchestrator.api.app import create_app
from orchestrator.cli import main
from orchestrator.runtime import Runtime
from orchestrator.services.tasks import Trigger
from orchestrator.settings import load_settings
from tests.executions_support import runtime_for
from tests.integration.fake_backend import Backend, gateway_overrides, running_backend
from tests.integration.test_approvals import waiting_task
from tests.integration.test_human_steps import waiting_on_a_sample
from tests.integration.test_invocation_resolve import completing_after, order, run_first_round
from tests.services import RedisServer, ServiceMissing, service_unavailable

REFUSED = "the broker did not take the wake-up of task"


@pytest.fixture
def stopped_redis() -> str:
    """The URL of a Redis that was started and is now stopped."""
    server = RedisServer()
    try:
        server.start()
    except ServiceMissing as exc:
        service_unavailable(str(exc))
    server.close()
    return server.url


@pytest.fixture
def rt(store_url: str, scripts: Path) -> Iterator[Runtime]:
    runtime, _ = runtime_for(store_url, scripts)
    yield runtime
    runtime.close()


@pytest.fixture
def cli(
    store_url: str, stopped_redis: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CLI's commands on the store, with the broker on the stopped Redis."""
    monkeypatch.setenv("ORCH_DATABASE_URL", store_url)
    monkeypatch.setenv("ORCH_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("ORCH_REDIS_URL", stopped_redis)


@pytest.fixture
def api(store_url: str, stopped_redis: str, tmp_path: Path) -> Iterator[TestClient]:
    """The API on the store, its services' dispatcher on the stopped Redis."""
    settings = load_settings(
        database_url=store_url, redis_url=stopped_redis, home=tmp_path / "api-home"
    )
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:
        yield client


def refused_line(err: str, task_id: str, generation: int, change: str) -> None:
    [line] = [line for line in err.splitlines() if REFUSED in line]
    assert f"task {task_id} generation {generation} (" in line
    assert f"the {change} is committed, and the sweeper sends the wake-up at its first sweep" in (
        line
    )


def test_a_requeue_says_its_wake_up_was_not_sent(
    rt: Runtime, cli: None, api: TestClient, capsys: pytest.CaptureFixture[str]
) -> None:
    task_id = rt.tasks.trigger(Trigger(task_type="simple", title="r")).task.task_id
    assert main(["tasks", "requeue", task_id, "--reason", "again", "--by", "op"]) == 0
    out, err = capsys.readouterr()
    assert f"requeued task {task_id} as generation 2" in out
    refused_line(err, task_id, 2, "requeue")
    assert main(["tasks", "requeue", task_id, "--reason", "again", "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["dispatched"] is False
    refused_line(err, task_id, 3, "requeue")

    answer = api.post(f"/api/v1/tasks/{task_id}/requeue", json={"reason": "again", "by": "op"})
    assert answer.status_code == 200, answer.text
    assert (answer.json()["generation"], answer.json()["dispatched"]) == (4, False)
    assert rt.tasks.explain(task_id)["wake_up_unsent"] is True  # as it said: for the sweep


def test_a_trigger_the_broker_refuses_exits_0_as_a_requeue_does(
    rt: Runtime, cli: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """The task is stored and will run (the sweeper sends its wake-up), as after a requeue: a
    script told so by exit 1 retried, and a trigger without --trigger-id then made a second
    task. Both commands now exit 0 with one line on stderr, and --json says `dispatched`."""
    trigger = ["tasks", "trigger", "--type", "simple", "--title", "t"]
    assert main(trigger) == 0
    out, err = capsys.readouterr()
    assert out.startswith("stored task ")
    task_id = out.split()[2]
    assert out == f"stored task {task_id} (queued, generation 1)\n"
    [line] = err.splitlines()
    assert line.startswith(f"orchestrator: {REFUSED} {task_id} generation 1 (")
    assert line.endswith(
        "; the task is stored and will run: the sweeper sends the wake-up at its first sweep "
        "once the broker takes messages again"
    )
    assert rt.tasks.explain(task_id)["wake_up_unsent"] is True

    assert main([*trigger, "--trigger-id", "k1", "--json"]) == 0
    out, err = capsys.readouterr()
    made = json.loads(out)  # stdout is the JSON alone
    assert (made["created"], made["dispatched"], made["status"]) == (True, False, "queued")
    [line] = err.splitlines()
    assert f"{REFUSED} {made['task_id']} generation 1 (" in line

    assert main(["tasks", "requeue", task_id, "--reason", "again", "--by", "op"]) == 0
    _, err = capsys.readouterr()
    refused_line(err, task_id, 2, "requeue")


def test_a_trigger_sent_again_says_its_wake_up_is_still_not_sent(
    rt: Runtime, cli: None, api: TestClient, capsys: pytest.CaptureFixture[str]
) -> None:
    """The business backend retries a trigger whose answer it lost, while Redis is down: the
    same task comes back, and `dispatched` says what the first answer said, `false`: its
    wake-up is still not sent (the sweeper sends it). Before, a trigger_id found again always
    answered `true`, though nothing was sent, then or since."""
    body = {"task_type": "simple", "title": "t", "trigger_id": "crm-1"}
    first = api.post("/api/v1/tasks", json=body)
    assert (first.status_code, first.json()["created"], first.json()["dispatched"]) == (
        201,
        True,
        False,
    )
    again = api.post("/api/v1/tasks", json=body)
    assert again.status_code == 200, again.text
    assert (again.json()["task_id"], again.json()["created"], again.json()["dispatched"]) == (
        first.json()["task_id"],
        False,
        False,
    )
    task_id = first.json()["task_id"]
    trigger = ["tasks", "trigger", "--type", "simple", "--title", "t", "--trigger-id", "crm-1"]
    assert main(trigger) == 0
    out, err = capsys.readouterr()
    assert out == f"already exists: task {task_id} (queued, generation 1)\n"
    [line] = err.splitlines()
    assert line.startswith(f"orchestrator: {REFUSED} {task_id} generation 1; ")
    assert main([*trigger, "--json"]) == 0
    out, _ = capsys.readouterr()
    assert (json.loads(out)["created"], json.loads(out)["dispatched"]) == (False, False)

    # One whose wake-up went out (here a recording broker's) says so when triggered again.
    sent = rt.tasks.trigger(Trigger(task_type="simple", title="s", trigger_id="crm-2")).task
    again = api.post(
        "/api/v1/tasks", json={"task_type": "simple", "title": "s", "trigger_id": "crm-2"}
    )
    assert (again.json()["task_id"], again.json()["dispatched"]) == (sent.task_id, True)
    assert (
        main(["tasks", "trigger", "--type", "simple", "--title", "s", "--trigger-id", "crm-2"]) == 0
    )
    out, err = capsys.readouterr()
    assert (out, err) == (f"already exists: task {sent.task_id} (queued, generation 1)\n", "")


def test_a_requeue_whose_wake_up_went_out_says_nothing_more(
    rt: Runtime,
    store_url: str,
    redis_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    task_id = rt.tasks.trigger(Trigger(task_type="simple", title="r")).task.task_id
    monkeypatch.setenv("ORCH_DATABASE_URL", store_url)
    monkeypatch.setenv("ORCH_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("ORCH_REDIS_URL", redis_url)  # up
    assert main(["tasks", "requeue", task_id, "--reason", "again", "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["dispatched"] is True
    assert REFUSED not in err
    app = create_app(load_settings(database_url=store_url, home=tmp_path / "api-home"))
    app.state.tasks = rt.tasks  # its dispatcher takes every wake-up
    with TestClient(app) as client:
        answer = client.post(f"/api/v1/tasks/{task_id}/requeue", json={"reason": "again"})
    assert (answer.json()["generation"], answer.json()["dispatched"]) == (3, True)
    assert rt.dispatcher.sent[-1] == (task_id, 3)  # type: ignore[attr-defined]


def test_an_approval_says_its_wake_up_was_not_sent(
    rt: Runtime,
    scripts: Path,
    cli: None,
    api: TestClient,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    by_cli, action_id = waiting_task(rt, scripts)
    digest = rt.actions.get(action_id).digest
    assert main(["actions", "approve", action_id, "--digest", digest, "--by", "ana"]) == 0
    out, err = capsys.readouterr()
    assert f"action {action_id} approved by ana" in out
    refused_line(err, by_cli, 2, "approval")
    # One line: the refused change notices' warning (a worker's log line) is not said beside it.
    assert len(err.splitlines()) == 1
    assert not [m for m in caplog.messages if "not published over Redis" in m]

    by_api, action_id = waiting_task(rt, scripts)
    digest = rt.actions.get(action_id).digest
    answer = api.post(f"/api/v1/actions/{action_id}/approve", json={"by": "ana", "digest": digest})
    assert answer.status_code == 200, answer.text
    assert answer.json()["status"] == "approved"
    assert (answer.json()["queued_generation"], answer.json()["dispatched"]) == (2, False)
    assert rt.tasks.explain(by_api)["wake_up_unsent"] is True


def test_a_person_s_step_says_its_wake_up_was_not_sent(
    rt: Runtime, scripts: Path, cli: None, api: TestClient, capsys: pytest.CaptureFixture[str]
) -> None:
    by_cli = waiting_on_a_sample(rt, scripts)
    done = ["tasks", "node", by_cli, "sample", "--complete", "--evidence", "0.4", "--by", "lab"]
    assert main([*done, "--json"]) == 0
    out, err = capsys.readouterr()
    assert (json.loads(out)["task_status"], json.loads(out)["dispatched"]) == ("queued", False)
    refused_line(err, by_cli, 2, "step")

    by_api = waiting_on_a_sample(rt, scripts)
    answer = api.post(
        f"/api/v1/tasks/{by_api}/nodes/sample/complete", json={"by": "lab", "evidence": "0.4"}
    )
    assert answer.status_code == 200, answer.text
    assert (answer.json()["generation"], answer.json()["dispatched"]) == (2, False)
    # A step that queues nothing (the task still waits on its callback) has nothing to say.
    waits = waiting_on_a_sample(rt, scripts, callback=True)
    answer = api.post(
        f"/api/v1/tasks/{waits}/nodes/sample/complete", json={"by": "lab", "evidence": "0.4"}
    )
    assert (answer.json()["task_status"], answer.json()["dispatched"]) == ("waiting", None)


@pytest.fixture
def backend() -> Iterator[Backend]:
    with running_backend() as server:
        yield server
        server.release.set()


@pytest.fixture
def rt_backend(
    store_url: str, scripts: Path, tmp_path: Path, backend: Backend
) -> Iterator[Runtime]:
    overrides = gateway_overrides(tmp_path, backend, gateway_timeout_seconds=2.0, max_rounds=10)
    runtime, _ = runtime_for(store_url, scripts, **overrides)
    yield runtime
    runtime.close()


def test_a_resolution_says_its_wake_up_was_not_sent(
    rt_backend: Runtime,
    scripts: Path,
    backend: Backend,
    cli: None,
    api: TestClient,
    capsys: pytest.CaptureFixture[str],
) -> None:
    backend.mode["/orders"] = "drop"  # applied, then the connection drops: unknown
    by_cli, by_api = (
        run_first_round(rt_backend, scripts, completing_after([order()])) for _ in range(2)
    )
    [cli_write, api_write] = (
        rt_backend.tasks.explain(task_id)["unknown_receipts"][0]["invocation_id"]
        for task_id in (by_cli, by_api)
    )
    resolve = ["invocations", "resolve", cli_write, "--as", "failed", "--reason", "not there"]
    assert main([*resolve, "--by", "otto"]) == 0
    out, err = capsys.readouterr()
    assert f"task {by_cli} is queued, generation 2 queued" in out
    refused_line(err, by_cli, 2, "resolution")

    answer = api.post(
        f"/api/v1/invocations/{api_write}/resolve",
        json={"status": "failed", "reason": "not there", "by": "otto"},
    )
    assert answer.status_code == 200, answer.text
    assert (answer.json()["queued_generation"], answer.json()["dispatched"]) == (2, False)
