"""The tasks API: triggers, the explain view, operator commands, and errors that are never 500."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from orchestrator.api.app import create_app
from orchestrator.api.tasks import get_task_service
from orchestrator.domain.storable import MAX_JSON_DEPTH
from orchestrator.services.dispatch import RecordingDispatcher
from orchestrator.services.tasks import TaskService
from orchestrator.settings import load_settings
from orchestrator.store.db import Database
from orchestrator.store.transcripts import Entry, insert_entries
from tests.services import refused_port
from workers.celery_app import CeleryDispatcher, make_celery


@pytest.fixture
def dispatcher() -> RecordingDispatcher:
    return RecordingDispatcher()


@pytest.fixture
def client(store_url: str, tmp_path: Path, dispatcher: RecordingDispatcher) -> Iterator[TestClient]:
    settings = load_settings(database_url=store_url, home=tmp_path / "home")
    db = Database.from_url(store_url)
    app = create_app(settings, db=db)
    app.dependency_overrides[get_task_service] = lambda: TaskService(db, dispatcher)
    with TestClient(app, raise_server_exceptions=False) as test_client:
        yield test_client
    db.dispose()


def trigger(client: TestClient, **body: Any) -> Any:
    payload = {"task_type": "water_quality", "title": "Brown water", "context": {"a": 1}}
    payload.update(body)
    return client.post("/api/v1/tasks", json=payload)


def test_trigger_queues_generation_one_and_wakes_a_worker(
    client: TestClient, dispatcher: RecordingDispatcher
) -> None:
    response = trigger(client, trigger_id="t-1")
    assert response.status_code == 201
    body = response.json()
    assert (body["status"], body["generation"], body["origin"]) == ("queued", 1, "live")
    assert dispatcher.sent == [(body["task_id"], 1)]
    assert body["dispatched"] is True


def test_a_trigger_whose_wake_up_the_broker_refused_says_so(store_url: str, tmp_path: Path) -> None:
    """Before, 201 and nothing more: the caller could not tell that no worker was woken (the
    CLI said so; its JSON had `dispatched`)."""
    settings = load_settings(database_url=store_url, home=tmp_path / "home")
    refusing = CeleryDispatcher(
        make_celery(load_settings(redis_url=f"redis://127.0.0.1:{refused_port()}/0", home=tmp_path))
    )
    db = Database.from_url(store_url)
    app = create_app(settings, db=db)
    app.dependency_overrides[get_task_service] = lambda: TaskService(db, refusing)
    try:
        with TestClient(app, raise_server_exceptions=False) as refused:
            response = trigger(refused, trigger_id="t-refused")
            assert response.status_code == 201
            assert response.json()["dispatched"] is False
            assert response.json()["status"] == "queued"
    finally:
        db.dispose()


def test_the_same_trigger_id_answers_200_with_the_same_task(
    client: TestClient, dispatcher: RecordingDispatcher
) -> None:
    first = trigger(client, trigger_id="t-2").json()
    again = trigger(client, trigger_id="t-2")
    assert again.status_code == 200
    assert again.json()["task_id"] == first["task_id"]
    assert len(dispatcher.sent) == 1


def test_a_sample_input_marks_the_task_as_peripheral_sample(client: TestClient) -> None:
    body = trigger(client, sample_input={"turbidity": 4.1}).json()
    assert body["origin"] == "peripheral_sample"


@pytest.mark.parametrize(
    "body",
    [
        {"task_type": "x"},
        {"task_type": "x", "title": "t", "surprise": 1},
        {"task_type": "x", "title": 5},
        {"task_type": "../etc", "title": "t"},
        {"task_type": "x", "title": "t", "context": [1, 2]},
        {"task_type": "x", "title": "t", "trigger_id": ""},
    ],
)
def test_bad_triggers_are_422_and_write_nothing(client: TestClient, body: dict[str, Any]) -> None:
    response = client.post("/api/v1/tasks", json=body)
    assert response.status_code == 422
    assert response.json()["error"]["code"]
    assert client.get("/api/v1/tasks").json()["items"] == []


def _nested(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


def _lists(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ('{"task_type": "x", "title": "a\\u0000b"}', "body.title"),
        ('{"task_type": "x", "title": "   "}', "body.title"),
        ('{"task_type": "x", "title": "t", "trigger_id": " "}', "body.trigger_id"),
        ('{"task_type": "x", "title": "t", "trigger_id": "a\\u0000b"}', "body.trigger_id"),
        ('{"task_type": "x", "title": "t", "context": {"k": "a\\u0000b"}}', "body.context"),
        ('{"task_type": "x", "title": "t", "context": {"a\\u0000b": 1}}', "body.context"),
        ('{"task_type": "x", "title": "t", "context": {"k": ["\\ud800"]}}', "body.context"),
        ('{"task_type": "x", "title": "t", "context": {"k": NaN}}', "body.context"),
        ('{"task_type": "x", "title": "t", "context": {"k": -Infinity}}', "body.context"),
        ('{"task_type": "x", "title": "t", "context": {"k": 1e400}}', "body.context"),
        ('{"task_type": "x", "title": "t", "sample_input": {"k": "\\u0000"}}', "body.sample_input"),
        ('{"task_type": "x", "title": "t", "context": ' + _nested(500) + "}", "body.context"),
        ('{"task_type": "x", "title": "t", "context": {"k": ' + _lists(900) + "}}", "body.context"),
    ],
    ids=[
        "nul-title",
        "blank-title",
        "blank-trigger-id",
        "nul-trigger-id",
        "nul-value",
        "nul-key",
        "lone-surrogate",
        "nan",
        "infinity",
        "overflow",
        "nul-sample",
        "deep-objects",
        "deep-lists",
    ],
)
def test_trigger_values_no_store_keeps_are_422_on_both_stores_and_write_nothing(
    client: TestClient, raw: str, field: str
) -> None:
    response = client.post(
        "/api/v1/tasks", content=raw.encode(), headers={"content-type": "application/json"}
    )
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_request"
    assert error["details"][0]["field"] == field
    assert client.get("/api/v1/tasks").json()["items"] == []


@pytest.mark.parametrize("reason", ["a\u0000b", "   ", "\n\t"], ids=["nul", "spaces", "blank"])
@pytest.mark.parametrize("verb", ["requeue", "cancel"])
def test_a_reason_with_a_nul_character_or_only_blanks_is_422_and_changes_nothing(
    client: TestClient, verb: str, reason: str
) -> None:
    task_id = trigger(client).json()["task_id"]
    response = client.post(f"/api/v1/tasks/{task_id}/{verb}", json={"reason": reason})
    assert response.status_code == 422
    assert response.json()["error"]["details"][0]["field"] == "body.reason"
    view = client.get(f"/api/v1/tasks/{task_id}").json()
    assert (view["status"], view["generation"], view["last_error"]) == ("queued", 1, None)


def test_a_context_nested_to_the_limit_is_kept(client: TestClient) -> None:
    context = json.loads(_nested(MAX_JSON_DEPTH - 1))
    assert trigger(client, context=context).status_code == 201


def test_malformed_json_is_422(client: TestClient) -> None:
    response = client.post(
        "/api/v1/tasks", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert response.status_code == 422
    assert "error" in response.json()


@pytest.mark.parametrize(
    "content_type", ["application/x-www-form-urlencoded", "text/plain; charset=utf-8"]
)
def test_a_json_body_sent_as_another_content_type_is_told_so(
    client: TestClient, content_type: str
) -> None:
    """`curl -d '{...}'` sends a form: the answer says what to send, not that the body is not
    an object (which it is)."""
    body = b'{"task_type": "x", "title": "t", "context": {}}'
    response = client.post("/api/v1/tasks", content=body, headers={"content-type": content_type})
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "invalid_request"
    assert "Content-Type: application/json" in error["message"]
    assert content_type.split(";")[0] in error["message"]
    assert error["details"][0]["field"] == "body"


def test_explain_view_has_every_field(client: TestClient) -> None:
    task_id = trigger(client).json()["task_id"]
    view = client.get(f"/api/v1/tasks/{task_id}").json()
    for field in (
        "task_id",
        "task_type",
        "title",
        "status",
        "failure_code",
        "generation",
        "session_id",
        "lease",
        "executions",
        "plan",
        "report",
        "pending_actions",
        "unknown_receipts",
    ):
        assert field in view, field
    assert view["executions"][0]["generation"] == 1
    assert view["executions"][0]["outcome"] is None
    assert view["lease"] is None


def test_requeue_and_cancel(client: TestClient, dispatcher: RecordingDispatcher) -> None:
    task_id = trigger(client).json()["task_id"]
    requeued = client.post(f"/api/v1/tasks/{task_id}/requeue", json={"reason": "retry"})
    assert requeued.status_code == 200
    assert requeued.json()["generation"] == 2
    assert dispatcher.sent[-1] == (task_id, 2)
    assert client.post(f"/api/v1/tasks/{task_id}/requeue", json={}).status_code == 422
    cancelled = client.post(f"/api/v1/tasks/{task_id}/cancel")
    assert cancelled.json()["status"] == "cancelled"
    again = client.post(f"/api/v1/tasks/{task_id}/cancel")
    assert (again.status_code, again.json()["error"]["code"]) == (409, "invalid_transition")
    view = client.get(f"/api/v1/tasks/{task_id}").json()
    assert [e["outcome"] for e in view["executions"]] == ["superseded", "cancelled"]


def test_list_filters_by_status(client: TestClient) -> None:
    task_id = trigger(client).json()["task_id"]
    client.post(f"/api/v1/tasks/{task_id}/cancel")
    trigger(client)
    assert len(client.get("/api/v1/tasks", params={"status": "cancelled"}).json()["items"]) == 1
    assert len(client.get("/api/v1/tasks").json()["items"]) == 2
    bad = client.get("/api/v1/tasks", params={"status": "sleeping"})
    assert (bad.status_code, bad.json()["error"]["details"][0]["field"]) == (422, "query.status")


@pytest.mark.parametrize("path", ["/api/v1/tasks/nope", "/api/v1/tasks/nope/cancel"])
def test_unknown_task_is_404(client: TestClient, path: str) -> None:
    response = client.get(path) if path.endswith("nope") else client.post(path)
    assert (response.status_code, response.json()["error"]["code"]) == (404, "not_found")


def test_the_transcript_route_and_its_errors(client: TestClient) -> None:
    task_id = trigger(client).json()["task_id"]
    view = client.get(f"/api/v1/tasks/{task_id}/transcript").json()
    assert view["items"] == []
    assert view["token_usage"]["total"] == {"calls": 0, "prompt_tokens": 0, "completion_tokens": 0}
    assert client.get(f"/api/v1/tasks/{task_id}/transcript?generation=1").status_code == 200
    missing = client.get(f"/api/v1/tasks/{task_id}/transcript?generation=2")
    assert (missing.status_code, missing.json()["error"]["code"]) == (404, "not_found")
    for bad in ("0", "-1", "x"):
        response = client.get(f"/api/v1/tasks/{task_id}/transcript?generation={bad}")
        assert response.status_code == 422, bad
        assert "error" in response.json()
    unknown = client.get("/api/v1/tasks/nope/transcript")
    assert (unknown.status_code, unknown.json()["error"]["code"]) == (404, "not_found")
    assert "token_usage" in client.get(f"/api/v1/tasks/{task_id}").json()


def test_the_transcript_is_paged_oldest_first_across_generations(
    client: TestClient, store_url: str
) -> None:
    task_id = trigger(client).json()["task_id"]
    client.post(f"/api/v1/tasks/{task_id}/requeue", json={"reason": "retry"})
    executions = client.get(f"/api/v1/tasks/{task_id}").json()["executions"]
    db = Database.from_url(store_url)
    try:
        with db.transaction() as conn:
            for run, count in zip(executions, (3, 2), strict=True):
                insert_entries(
                    conn,
                    session_id=run["session_id"],
                    task_id=task_id,
                    generation=run["generation"],
                    first_seq=1,
                    entries=[
                        Entry(turn=n, kind="model_turn", body={"content": f"g{run['generation']}"})
                        for n in range(1, count + 1)
                    ],
                )
    finally:
        db.dispose()
    seen: list[tuple[int, int]] = []
    cursor: str | None = None
    pages = 0
    while True:
        params: dict[str, Any] = {"limit": 2} | ({"cursor": cursor} if cursor else {})
        page = client.get(f"/api/v1/tasks/{task_id}/transcript", params=params)
        assert page.status_code == 200, page.text
        body = page.json()
        seen += [(e["generation"], e["seq"]) for e in body["items"]]
        assert all(e["body"]["content"] == f"g{e['generation']}" for e in body["items"])
        assert body["items"][0]["call_id"] is None  # a model turn answers no call
        pages += 1
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert seen == [(1, 1), (1, 2), (1, 3), (2, 1), (2, 2)]
    assert pages == 3
    one = client.get(f"/api/v1/tasks/{task_id}/transcript", params={"generation": 2}).json()
    assert [(e["generation"], e["seq"]) for e in one["items"]] == [(2, 1), (2, 2)]
    assert one["next_cursor"] is None
    # A cursor of generation 1's pages asked of generation 2: not one this query returned.
    first = client.get(f"/api/v1/tasks/{task_id}/transcript", params={"limit": 1}).json()
    mixed = client.get(
        f"/api/v1/tasks/{task_id}/transcript",
        params={"generation": 2, "cursor": first["next_cursor"]},
    )
    assert (mixed.status_code, mixed.json()["error"]["code"]) == (422, "invalid_cursor")
    for bad in ("x", "W10", "WyJhIiwgMV0", "Wy0xLCAxXQ"):  # not base64 JSON, [], ["a", 1], [-1, 1]
        refused = client.get(f"/api/v1/tasks/{task_id}/transcript", params={"cursor": bad})
        assert (refused.status_code, refused.json()["error"]["code"]) == (422, "invalid_cursor")
    too_many = client.get(f"/api/v1/tasks/{task_id}/transcript", params={"limit": 1001})
    assert too_many.status_code == 422


def test_a_store_that_is_down_is_503_store_unavailable_with_one_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"postgresql+psycopg://orch:s3cret-Pa55word@127.0.0.1:{refused_port()}/orch"
    app = create_app(load_settings(database_url=url, home=tmp_path / "home"))
    with TestClient(app, raise_server_exceptions=False) as client:
        answers = [client.get("/api/v1/tasks"), trigger(client), client.get("/metrics")]
    for answer in answers:
        assert answer.status_code == 503, answer.text
        assert answer.json()["error"]["code"] == "store_unavailable"
        assert answer.headers["Retry-After"]
    logged = [r for r in caplog.records if r.name == "orchestrator.api.app"]
    assert len(logged) == 3
    assert all(r.exc_info is None and "s3cret" not in r.getMessage() for r in logged)
