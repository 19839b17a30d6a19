"""One time form on the wire: every time the API sends, in every route that sends one, is
`isoformat()` text in UTC (`...+00:00`), never pydantic's `...Z`; over a real store, with a
completed task (evidence, report, transcript, task stream), an approved action, a person's
closed step, sessions, a write receipt and the outbox."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from orchestrator.api.app import create_app
from orchestrator.runtime import Runtime
from orchestrator.services.actions import ActionService
from orchestrator.services.dispatch import RecordingDispatcher
from orchestrator.services.human_steps import HumanStepService
from orchestrator.services.tasks import Trigger
from tests.executions_support import completing_turns, runtime_for, write_script
from tests.integration.test_human_steps import waiting_on_a_sample
from tests.integration.test_invocations_ops import _receipt
from tests.outbox_support import waiting_task
from tests.sse_support import parse

#: The one form: `datetime.isoformat()` of a UTC time.
ISO_UTC = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{6})?\+00:00")
#: Any date-time text that ends in Z (pydantic's form), wherever it is in a body.
ZULU = re.compile(r"\d{4}-\d\d-\d\dT[\d:.]+Z")
_BY_LAB = {"by": "lab", "evidence": "chlorine 0.4 mg/L"}


def _is_time_key(key: str) -> bool:
    return key in ("at", "time") or key.endswith("_at")


def _times(body: Any, where: str = "") -> Iterator[tuple[str, Any]]:
    """(path, value) of every value under a key that names a time, and of every Z-form text."""
    if isinstance(body, dict):
        for key, value in body.items():
            path = f"{where}.{key}"
            if _is_time_key(key) and value is not None:
                yield path, value
            else:
                yield from _times(value, path)
    elif isinstance(body, list):
        for index, value in enumerate(body):
            yield from _times(value, f"{where}[{index}]")
    elif isinstance(body, str) and ZULU.search(body):
        yield where, body


@pytest.fixture
def rt(store_url: str, scripts: Path) -> Iterator[Runtime]:
    runtime, _ = runtime_for(store_url, scripts)
    yield runtime
    runtime.close()


def test_every_time_the_api_sends_is_isoformat_utc(
    rt: Runtime, scripts: Path, tmp_path: Path
) -> None:
    write_script(scripts, "simple", completing_turns())
    done = rt.tasks.trigger(Trigger(task_type="simple", title="t")).task.task_id
    assert rt.executions.run(done, 1, worker="w1").outcome == "completed"
    session_id = rt.tasks.get(done).session_id
    waiting, action_id = waiting_task(rt, tmp_path)
    human = waiting_on_a_sample(rt, scripts)
    invocation_id = _receipt(rt.db, "alice", session_id, "k1")

    app = create_app(rt.settings, db=rt.db)
    dispatcher = RecordingDispatcher()  # a decision wakes the next generation: no broker here
    app.state.actions = ActionService(rt.db, app.state.plans, dispatcher)
    app.state.human_steps = HumanStepService(rt.db, app.state.plans, dispatcher)
    sent: dict[str, Any] = {}
    with TestClient(app) as client:
        digest = client.get(f"/api/v1/actions/{action_id}").json()["digest"]
        writes = {
            "approve": (f"/api/v1/actions/{action_id}/approve", {"by": "ops", "digest": digest}),
            "human step": (f"/api/v1/tasks/{human}/nodes/sample/complete", _BY_LAB),
            "new session": ("/api/v1/sessions", {"purpose": "ordinary_chat", "title": "chat"}),
            "collaboration": (f"/api/v1/tasks/{done}/collaboration", None),
        }
        for name, (path, body) in writes.items():
            response = client.post(path, json=body)
            assert response.status_code in (200, 201), (name, response.text)
            sent[name] = response.json()
        reads = {
            "task list": "/api/v1/tasks",
            "explain (done)": f"/api/v1/tasks/{done}",
            "explain (waiting)": f"/api/v1/tasks/{waiting}",
            "transcript": f"/api/v1/tasks/{done}/transcript",
            "evidence": f"/api/v1/tasks/{done}/evidence",
            "task plan": f"/api/v1/tasks/{done}/plan",
            "plan history": f"/api/v1/sessions/{session_id}/execution-plans",
            "actions": "/api/v1/actions?any=true",
            "action": f"/api/v1/actions/{action_id}",
            "sessions": "/api/v1/sessions",
            "session": f"/api/v1/sessions/{session_id}",
            "invocation": f"/api/v1/invocations/{invocation_id}",
            "outbox": "/api/v1/outbox",
        }
        for name, path in reads.items():
            response = client.get(path)
            assert response.status_code == 200, (name, response.text)
            sent[name] = response.json()
        with client.stream(
            "GET", f"/api/v1/tasks/{done}/stream", headers={"Last-Event-ID": "0"}
        ) as response:
            sent["task stream"] = [message["data"] for message in parse(response.read().decode())]

    wrong = []
    for name, body in sent.items():
        times = list(_times(body))
        # Each route sends times, so a check that saw none would prove nothing (the transcript's
        # entries have none of their own: what it must not hold is a Z-form text).
        assert times or name == "transcript", name
        wrong += [(name, path, value) for path, value in times if not _is_iso_utc(value)]
    assert not wrong, wrong
    # The times a person's decision wrote, in both forms before: one form now.
    assert _is_iso_utc(sent["approve"]["decided_at"])
    assert _is_iso_utc(sent["explain (done)"]["executions"][0]["started_at"])


def _is_iso_utc(value: Any) -> bool:
    return isinstance(value, str) and ISO_UTC.fullmatch(value) is not None
