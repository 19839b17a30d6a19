"""One time form on the wire: every time the API sends, in every route that sends one, is
`wire_time` text in UTC (`...+00:00`, six fraction digits always), never pydantic's `...Z` nor
`isoformat()`'s shorter whole-second width; over a real store, with a completed task (evidence,
report, transcript, task stream), an approved action, a person's closed step, sessions, a write
receipt and the outbox. Times inside open JSON objects (an event's data, a plan, an action's
payload, a webhook body) are found by their text, whatever their key."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, update

from orchestrator.api.app import create_app
from orchestrator.runtime import Runtime
from orchestrator.services.actions import ActionService
from orchestrator.services.dispatch import RecordingDispatcher
from orchestrator.services.human_steps import HumanStepService
from orchestrator.services.tasks import Trigger
from orchestrator.store.db import Database
from orchestrator.store.tables import metadata, outbox
from orchestrator.store.types import UTCDateTime
from tests.executions_support import completing_turns, runtime_for, write_script
from tests.integration.test_human_steps import waiting_on_a_sample
from tests.integration.test_invocations_ops import _receipt
from tests.outbox_support import waiting_task
from tests.sse_support import parse

#: The one form: `wire_time` of a UTC time.
ISO_UTC = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}\+00:00")
#: Any date-time text that ends in Z (pydantic's form), wherever it is in a body.
ZULU = re.compile(r"\d{4}-\d\d-\d\dT[\d:.]+Z")
#: A string that is a date-time in any width or zone (`str(datetime)`'s space included): a time
#: under a key that does not name one, in an open object.
A_TIME = re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d(:\d\d(\.\d+)?)?(Z|[+-]\d\d:?\d\d)?")
#: In the transcript, the rows a data source answered: its own text, recorded as the model saw
#: it (the orchestrator did not write those times, so their width is the source's).
SOURCE_ROWS = re.compile(r"\.items\[\d+\]\.body\.result\.rows\[")
_BY_LAB = {"by": "lab", "evidence": "chlorine 0.4 mg/L"}


def _is_time_key(key: str) -> bool:
    return key in ("at", "time") or key.endswith("_at")


def _times(body: Any, where: str = "") -> Iterator[tuple[str, Any]]:
    """(path, value) of every value under a key that names a time, of every string that is a
    date-time whatever its key (open objects name theirs as they like), and of every Z-form
    text."""
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
    elif isinstance(body, str) and (A_TIME.fullmatch(body) or ZULU.search(body)):
        yield where, body


def _whole_seconds(db: Database) -> None:
    """Every stored time cut to a whole second: where `isoformat()` leaves the fraction out, so
    a time sent in the shorter width cannot pass by the luck of its microseconds."""
    with db.transaction() as conn:
        for table in metadata.sorted_tables:
            for column in (c for c in table.columns if isinstance(c.type, UTCDateTime)):
                for (moment,) in conn.execute(select(column).distinct()).all():
                    if moment is not None and moment.microsecond:
                        whole = moment.replace(microsecond=0)
                        conn.execute(update(table).where(column == moment).values({column: whole}))


def _webhook_bodies(db: Database) -> list[Any]:
    """The bodies the outbox sends (signed, byte for byte as stored)."""
    with db.transaction(readonly=True) as conn:
        return [json.loads(body) for (body,) in conn.execute(select(outbox.c.body)).all()]


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
        _whole_seconds(rt.db)
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
    sent["webhooks"] = _webhook_bodies(rt.db)

    wrong = []
    for name, body in sent.items():
        times = list(_times(body))
        # Each route sends times, so a check that saw none would prove nothing (the transcript's
        # entries have none of their own: what it must not hold is a Z-form text).
        assert times or name == "transcript", name
        wrong += [
            (name, path, value)
            for path, value in times
            if not _is_iso_utc(value)
            and not (name == "transcript" and SOURCE_ROWS.match(path) and not ZULU.search(value))
        ]
    assert not wrong, wrong
    # The times a person's decision wrote, in both forms before: one form now.
    assert _is_iso_utc(sent["approve"]["decided_at"])
    assert _is_iso_utc(sent["explain (done)"]["executions"][0]["started_at"])
    assert sent["task list"]["items"][0]["created_at"].endswith(".000000+00:00")
    # A time in an open object, under a key that does not name one, is checked too.
    assert any(path.endswith(".result.start") for path, _ in _times(sent["transcript"]))


def _is_iso_utc(value: Any) -> bool:
    return isinstance(value, str) and ISO_UTC.fullmatch(value) is not None
