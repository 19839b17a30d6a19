"""The API contract: enums, the bearer scheme, documented errors, one list shape with cursor
paging, the body limit, `last_write`, and schemathesis finding no server error and no response
outside the schema."""

from __future__ import annotations

from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from orchestrator.api import enums
from orchestrator.api.app import create_app
from orchestrator.api.tasks import get_task_service
from orchestrator.cli.task_show import render_explain
from orchestrator.domain import vocabulary
from orchestrator.services.dispatch import RecordingDispatcher
from orchestrator.services.tasks import TaskService, Trigger
from orchestrator.settings import load_settings
from orchestrator.store.db import Database
from tests.executions_support import completing_turns, runtime_for, write_script

#: No server error, no status the schema does not list, no body or content type outside it.
#: (Not "positive data accepted": a schema cannot say every cross-field rule, like a
#: task_execution session needing a task_id, and those answer 422 with the envelope.)
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
TOKEN = "contract-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.mark.parametrize(
    ("enum", "values"),
    [
        (enums.TaskStatus, vocabulary.TASK_STATUSES),
        (enums.TaskOrigin, vocabulary.TASK_ORIGINS),
        (enums.ExecutionOutcome, vocabulary.EXECUTION_OUTCOMES),
        (enums.SessionPurpose, vocabulary.SESSION_PURPOSES),
        (enums.ReportOutcome, vocabulary.REPORT_OUTCOMES),
        (enums.ActionKind, vocabulary.ACTION_KINDS),
        (enums.ActionStatus, vocabulary.ACTION_STATUSES),
        (enums.ReceiptStatus, vocabulary.RECEIPT_STATUSES),
        (enums.NodeActor, vocabulary.NODE_ACTORS),
        (enums.NodeStatus, vocabulary.NODE_STATUSES),
        (enums.EvidenceOrigin, vocabulary.EVIDENCE_ORIGINS),
    ],
)
def test_enums_are_the_vocabulary(enum: type[StrEnum], values: tuple[str, ...]) -> None:
    assert [member.value for member in enum] == list(values)


@pytest.fixture
def app(sqlite_url: str, tmp_path: Path) -> Iterator[FastAPI]:
    yield from _app(sqlite_url, tmp_path)


@pytest.fixture
def store_app(store_url: str, tmp_path: Path) -> Iterator[FastAPI]:
    """On both stores: Postgres refuses text SQLite keeps (NUL), so a fuzzed body can differ."""
    yield from _app(store_url, tmp_path)


def _app(url: str, tmp_path: Path) -> Iterator[FastAPI]:
    settings = load_settings(
        database_url=url,
        home=tmp_path / "home",
        api_token=TOKEN,
        agent_internal_token="internal-token",
        max_body_bytes=64 * 1024,
    )
    db = Database.from_url(url)
    application = create_app(settings, db=db)
    application.dependency_overrides[get_task_service] = lambda: TaskService(
        db, RecordingDispatcher()
    )
    yield application
    db.dispose()


@pytest.fixture
def client(app: FastAPI) -> Iterator[TestClient]:
    with TestClient(app, raise_server_exceptions=False) as test_client:
        yield test_client


def test_every_operation_declares_its_scheme_and_the_error_envelope(client: TestClient) -> None:
    schema = client.get("/openapi.json", headers=AUTH).json()
    schemes = schema["components"]["securitySchemes"]
    assert schemes["bearer"] == {
        "type": "http",
        "scheme": "bearer",
        "description": "ORCH_API_TOKEN, when it is set",
    }
    envelope = {"$ref": "#/components/schemas/ErrorEnvelope"}
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            assert operation.get("security"), (method, path)
            for status in ("401", "413", "422"):
                documented = operation["responses"].get(status)
                assert documented, (method, path, status)
                assert documented["content"]["application/json"]["schema"] == envelope
            if "{" in path:
                assert "404" in operation["responses"], (method, path)


def test_every_public_write_declares_403_and_an_ask_its_502(client: TestClient) -> None:
    """A viewer account only reads: every public write may answer 403 `forbidden`, whatever
    role the route itself asks for; an ask answers 502 `model_error` when the model fails."""
    schema = client.get("/openapi.json", headers=AUTH).json()
    envelope = {"$ref": "#/components/schemas/ErrorEnvelope"}
    writes = 0
    for path, item in schema["paths"].items():
        if path.startswith("/api/v1/internal/"):
            continue  # one token, no roles
        for method, operation in item.items():
            if method == "get":
                continue
            writes += 1
            documented = operation["responses"].get("403")
            assert documented, (method, path)
            assert documented["content"]["application/json"]["schema"] == envelope
    assert writes >= 12
    ask = schema["paths"]["/api/v1/sessions/{session_id}/messages"]["post"]["responses"]
    assert ask["502"]["content"]["application/json"]["schema"] == envelope


def test_tasks_page_past_200_with_one_list_shape(client: TestClient, app: FastAPI) -> None:
    service = TaskService(app.state.db, RecordingDispatcher())
    created = {
        service.trigger(
            Trigger(task_type="demo", title=f"t{n}", context={"big": "x" * 100})
        ).task.task_id
        for n in range(230)
    }
    seen: list[str] = []
    cursor: str | None = None
    for _ in range(5):
        params: dict[str, Any] = {"limit": 200, **({"cursor": cursor} if cursor else {})}
        page = client.get("/api/v1/tasks", params=params, headers=AUTH).json()
        assert set(page) == {"items", "next_cursor"}
        assert all("context" not in item for item in page["items"])
        seen += [item["task_id"] for item in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert len(seen) == 230
    assert set(seen) == created
    for path in ("/api/v1/sessions", "/api/v1/actions"):
        assert set(client.get(path, headers=AUTH).json()) == {"items", "next_cursor"}
    bad = client.get("/api/v1/tasks", params={"cursor": "nope!"}, headers=AUTH)
    assert (bad.status_code, bad.json()["error"]["code"]) == (422, "invalid_cursor")


def test_the_explain_view_has_last_write(client: TestClient) -> None:
    body = {"task_type": "demo", "title": "t"}
    task_id = client.post("/api/v1/tasks", json=body, headers=AUTH).json()["task_id"]
    view = client.get(f"/api/v1/tasks/{task_id}", headers=AUTH).json()
    assert view["last_write"] is None  # no generation has written yet


def test_last_write_names_the_generations_newest_fenced_write(
    sqlite_url: str, scripts: Path
) -> None:
    rt, _ = runtime_for(sqlite_url, scripts)
    try:
        write_script(scripts, "good", completing_turns())
        task_id = rt.tasks.trigger(Trigger(task_type="good", title="t")).task.task_id
        rt.executions.run(task_id, 1, worker="w:1")
        view = rt.tasks.explain(task_id)
    finally:
        rt.close()
    assert view["status"] == "completed"
    assert view["last_write"]["kind"] == "report"  # the plan came first, the report last
    assert view["last_write"]["at"] >= view["executions"][0]["started_at"]
    assert "last fenced write: report at" in render_explain(view)


def test_a_body_over_the_limit_is_413_declared_or_chunked(client: TestClient) -> None:
    big = b'{"task_type": "demo", "title": "t", "context": {"x": "' + b"x" * 100_000 + b'"}}'
    declared = client.post(
        "/api/v1/tasks", content=big, headers={**AUTH, "Content-Type": "application/json"}
    )
    assert declared.status_code == 413
    assert declared.json()["error"]["code"] == "too_large"

    def chunks() -> Iterator[bytes]:
        for start in range(0, len(big), 8192):
            yield big[start : start + 8192]

    chunked = client.post(
        "/api/v1/tasks", content=chunks(), headers={**AUTH, "Content-Type": "application/json"}
    )
    assert chunked.status_code == 413
    assert chunked.json()["error"]["code"] == "too_large"
    assert client.get("/api/v1/tasks", headers=AUTH).json()["items"] == []


def _fuzz(operation: Any, headers: dict[str, str]) -> None:
    """Bounded examples of one operation, each checked against the schema."""

    @settings(
        max_examples=25,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy())
    def check(case: Any) -> None:
        case.call_and_validate(headers=headers, checks=CHECKS)

    check()


@pytest.mark.slow
def test_schemathesis_finds_no_server_error_and_no_response_outside_the_schema(
    store_app: FastAPI,
) -> None:
    schema = schemathesis.openapi.from_asgi("/openapi.json", store_app, headers=AUTH)
    failures: list[str] = []
    tested = 0
    for result in schema.get_all_operations():
        operation = result.ok()
        if operation.path.endswith("/stream"):
            continue  # an open stream never ends; its 404 is covered in test_plan_stream
        internal = operation.path.startswith("/api/v1/internal/")
        try:
            _fuzz(operation, {"Authorization": "Bearer internal-token"} if internal else AUTH)
        except Exception as exc:
            failures.append(f"{operation.method.upper()} {operation.path}: {exc}"[:2000])
        tested += 1
    assert not failures, "\n\n".join(failures)
    assert tested >= 16


#: Response fields that stay free-form objects in the OpenAPI document, each with its reason. A
#: generated client gets a plain dict for these and a typed model for everything else.
FREE_FORM = {
    "ActionShown.payload": "what the agent proposed for the business backend, in the backend's "
    "own schema; the orchestrator only stores it and binds the approval to its digest",
    "DecidedView.payload": "the same payload, in the answer to an approval or a rejection",
    "PendingActionView.payload": "the same payload, in the pending actions of the explain view",
    "UnknownCallView.arguments": "what the model asked a tool for (redacted when sensitive), "
    "in each tool's own schema, in the explain view's recovery snapshot",
    "TranscriptEntryView.body": "the recorded model turn or tool-result envelope, whose shape "
    "is the model's and each tool's",
}


def _is_open(node: dict[str, Any]) -> bool:
    """An object with no fields, or a value of any type (no type, enum, const or union)."""
    if {"enum", "const"} & set(node):
        return False
    kind = node.get("type")
    return kind == "object" or (kind is None and not {"anyOf", "oneOf", "allOf"} & set(node))


def _free_forms(
    schema: dict[str, Any], components: dict[str, Any], where: str, allowed: set[str]
) -> list[str]:
    """Every place under `schema` where a generated client would get an untyped value or a
    plain dict, but FREE_FORM's (added to `allowed` when met): named `Component.field` (`[]`
    an item, `{}` a map's value), or by `where` for a route's inline schema."""
    found: list[str] = []
    seen: set[str] = set()

    def walk(node: Any, where: str) -> None:
        if "$ref" in node:
            name = node["$ref"].rsplit("/", 1)[-1]
            if name not in seen:
                seen.add(name)
                model = components[name]
                fields = model.get("properties", {})
                for field, value in fields.items():
                    walk(value, f"{name}.{field}")
                if model.get("type") == "object" and (
                    not fields or model.get("additionalProperties")
                ):
                    found.append(name)  # an open model: no fields, or extra="allow"
                elif model.get("type") != "object":
                    walk(model, name)
            return
        for option in node.get("anyOf") or node.get("oneOf") or node.get("allOf") or []:
            walk(option, where)
        kind = node.get("type")
        extra = node.get("additionalProperties", False)
        if kind == "array":
            walk(node.get("items", {}), f"{where}[]")
        elif kind == "object" and isinstance(extra, dict) and extra:
            walk(extra, f"{where}{{}}")
        elif _is_open(node):
            if where in FREE_FORM:
                allowed.add(where)
            else:
                found.append(where)

    walk(schema, where)
    return found


def test_every_success_response_is_typed_for_a_generated_client(client: TestClient) -> None:
    """No 2xx JSON body is an untyped value or a free-form object, nested or not, but the
    fields of FREE_FORM (each of which still exists); an event stream is `text/event-stream`
    only."""
    document = client.get("/openapi.json", headers=AUTH).json()
    components = document["components"]["schemas"]
    untyped: list[str] = []
    allowed: set[str] = set()
    for path, item in document["paths"].items():
        for method, operation in item.items():
            for status, response in operation["responses"].items():
                if not status.startswith("2") or status == "204":
                    continue
                route = f"{method.upper()} {path} {status}"
                content = response.get("content")
                if not content:
                    untyped.append(f"{route}: no body documented")
                    continue
                if path.endswith("/stream"):
                    if set(content) != {"text/event-stream"}:
                        untyped.append(f"{route}: a stream documented as {sorted(content)}")
                    continue
                schema = content["application/json"]["schema"]
                found = _free_forms(schema, components, route, allowed)
                untyped += [f"{route}: {place}" for place in found]
    assert not untyped, "\n".join(untyped)
    assert allowed == set(FREE_FORM), f"no such field now: {set(FREE_FORM) - allowed}"


LONG_ID = "x" * 5000


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("get", f"/api/v1/actions/{LONG_ID}", None),
        ("post", f"/api/v1/actions/{LONG_ID}/reject", {"by": "ana"}),
        ("get", f"/api/v1/tasks/{LONG_ID}", None),
        ("post", f"/api/v1/tasks/{LONG_ID}/cancel", None),
        ("post", f"/api/v1/tasks/{LONG_ID}/nodes/sample/complete", {"by": "a", "evidence": "e"}),
        ("get", f"/api/v1/sessions/{LONG_ID}", None),
        ("get", f"/api/v1/invocations/{LONG_ID}", None),
    ],
)
def test_a_404_clips_the_id_it_repeats(
    client: TestClient, method: str, path: str, body: dict[str, Any] | None
) -> None:
    """A 5,000-character id came back whole in the message: it is clipped, its length said."""
    answer = client.request(method, path, json=body, headers=AUTH)
    assert answer.status_code == 404
    message = answer.json()["error"]["message"]
    assert "(5000 characters)" in message
    assert len(message) < 200, message


@pytest.mark.parametrize(
    ("path", "body", "fields"),
    [
        ("/api/v1/tasks/t/nodes/n/complete", {}, ["body.evidence", "body.by"]),
        ("/api/v1/tasks/t/nodes/n/fail", {}, ["body.reason", "body.by"]),
        ("/api/v1/tasks/t/nodes/n/skip", {"by": None}, ["body.reason", "body.by"]),
        ("/api/v1/tasks/t/nodes/n/complete", {"by": "ana"}, ["body.evidence"]),
        ("/api/v1/actions/a/approve", {"digest": "zz"}, ["body.digest", "body.by"]),
        ("/api/v1/invocations/i/resolve", {}, ["body.status", "body.reason", "body.by"]),
    ],
)
def test_a_body_refused_under_the_shared_token_names_a_missing_by_with_the_rest(
    client: TestClient, path: str, body: dict[str, Any], fields: list[str]
) -> None:
    """`by` was checked after the body validated: `{}` was refused for the evidence (or
    reason), then for `by` on the next call. One refusal names them all."""
    answer = client.post(path, json=body, headers=AUTH)
    assert answer.status_code == 422
    assert [d["field"] for d in answer.json()["error"]["details"]] == fields
