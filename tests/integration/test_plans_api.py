"""The plans and sessions HTTP API on both stores: auth, envelopes, reads, the internal bridge."""

from __future__ import annotations

import base64
import json
import logging
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, insert, select

from orchestrator.api import create_app
from orchestrator.settings import load_settings
from orchestrator.store import Database
from orchestrator.store.tables import plan_revisions, tasks
from orchestrator.store.types import utcnow
from tests.unit.test_plan_validation import (
    PREVIOUS,
    reference_authority_codes,
    reference_codes,
    reference_retry_codes,
    reference_update_codes,
)
from tests.unit.test_plan_validation import plans as random_plans

with warnings.catch_warnings():
    # Starlette asks for `httpx2`, which is not a dependency; plain httpx still works.
    warnings.filterwarnings("ignore", "Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient

PUBLIC = {"Authorization": "Bearer public-token"}
INTERNAL = {"Authorization": "Bearer internal-token"}


def node(node_id: str, status: str = "pending", **extra: Any) -> dict[str, Any]:
    return {"id": node_id, "title": f"step {node_id}", "actor": "agent", "status": status, **extra}


def plan(request_id: str, nodes: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"request_id": request_id, "title": "plan", "reason": "", "nodes": nodes, **extra}


@pytest.fixture
def client(store_url: str, tmp_path: Path) -> Iterator[TestClient]:
    settings = load_settings(
        database_url=store_url,
        home=tmp_path,
        api_token="public-token",
        agent_internal_token="internal-token",
        redis_url=None,
    )
    with TestClient(create_app(settings), raise_server_exceptions=False) as test_client:
        yield test_client


@pytest.fixture
def session_id(client: TestClient) -> str:
    response = client.post(
        "/api/v1/sessions", json={"purpose": "ordinary_chat", "title": "chat"}, headers=PUBLIC
    )
    assert response.status_code == 201, response.text
    return str(response.json()["session_id"])


def publish(client: TestClient, session_id: str, body: Any, **kwargs: Any) -> Any:
    return client.post(
        f"/api/v1/internal/sessions/{session_id}/execution-plans",
        json=body,
        headers=INTERNAL,
        **kwargs,
    )


def revision_count(client: TestClient) -> int:
    db: Database = client.app.state.db  # type: ignore[attr-defined]
    with db.transaction(readonly=True) as conn:
        return int(conn.execute(select(func.count()).select_from(plan_revisions)).scalar_one())


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong"}, PUBLIC, {"Authorization": "internal-token"}],
)
def test_internal_bridge_refuses_missing_or_wrong_token(
    client: TestClient, session_id: str, headers: dict[str, str]
) -> None:
    response = client.post(
        f"/api/v1/internal/sessions/{session_id}/execution-plans",
        json=plan("r1", [node("a")]),
        headers=headers,
    )
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthorized"
    assert "internal-token" not in response.text
    assert revision_count(client) == 0


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/sessions",
        "/api/v1/sessions/x/execution-plans",
        "/api/v1/sessions/x/execution-plans/1",
        "/api/v1/agent/chat/session/x/stream",
    ],
)
def test_public_reads_need_the_api_token_when_it_is_set(client: TestClient, path: str) -> None:
    for headers in ({}, {"Authorization": "Bearer nope"}, INTERNAL):
        response = client.get(path, headers=headers)
        assert response.status_code == 401, path
        assert response.json()["error"]["code"] == "unauthorized"


def test_publish_then_read_latest_history_and_one_revision(
    client: TestClient, session_id: str
) -> None:
    first = publish(client, session_id, plan("r1", [node("a")]))
    assert first.status_code == 201, first.text
    body = first.json()
    assert (body["revision"], body["schema_version"]) == (1, "execution-plan@1")
    assert body["status_counts"]["pending"] == 1
    second = publish(
        client,
        session_id,
        plan(
            "r2",
            [node("a", "completed", evidence="turbidity 0.3 NTU"), node("b"), node("c")],
            edges=[{"from": "a", "to": "b"}, {"from": "a", "to": "c", "label": "if high"}],
        ),
    )
    assert second.status_code == 201, second.text
    history = client.get(f"/api/v1/sessions/{session_id}/execution-plans", headers=PUBLIC).json()
    assert history["session_id"] == session_id
    assert history["latest"]["revision"] == 2
    assert [r["revision"] for r in history["revisions"]] == [1, 2]
    assert set(history["revisions"][0]) == {
        "revision",
        "updated_at",
        "title",
        "reason",
        "status_counts",
    }
    one = client.get(f"/api/v1/sessions/{session_id}/execution-plans/1", headers=PUBLIC)
    assert one.status_code == 200
    assert [n["id"] for n in one.json()["nodes"]] == ["a"]


def test_replay_is_200_with_the_same_revision_and_conflict_is_409(
    client: TestClient, session_id: str
) -> None:
    assert publish(client, session_id, plan("r1", [node("a")])).status_code == 201
    replay = publish(client, session_id, plan("r1", [node("a")]))
    assert replay.status_code == 200
    assert replay.json()["revision"] == 1
    conflict = publish(client, session_id, plan("r1", [node("b")]))
    assert conflict.status_code == 409
    assert conflict.json()["error"]["code"] == "request_id_conflict"
    assert revision_count(client) == 1


def test_unknown_revision_and_session_are_404(client: TestClient, session_id: str) -> None:
    for path in (
        f"/api/v1/sessions/{session_id}/execution-plans/7",
        "/api/v1/sessions/nope/execution-plans",
        "/api/v1/sessions/nope/execution-plans/1",
        "/api/v1/agent/chat/session/nope/stream",
        "/api/v1/no-such-route",
    ):
        response = client.get(path, headers=PUBLIC)
        assert response.status_code == 404, path
        assert response.json()["error"]["code"] == "not_found"


def test_validation_envelope_lists_every_problem(client: TestClient, session_id: str) -> None:
    body = plan(
        "r1",
        [node("a", "completed"), node("a", "waiting"), node("b", actor="robot")],
        edges=[{"from": "a", "to": "zz"}, {"from": "b", "to": "b"}],
    )
    response = publish(client, session_id, body)
    assert response.status_code == 422
    error = response.json()["error"]
    codes = [detail["code"] for detail in error["details"]]
    assert error["code"] == codes[0]
    for code in (
        "evidence_required",
        "reason_required",
        "invalid_actor",
        "duplicate_node_id",
        "dangling_edge",
        "self_loop",
    ):
        assert code in codes
    assert revision_count(client) == 0


def test_unknown_session_publish_is_422(client: TestClient) -> None:
    response = publish(client, "nope", plan("r1", [node("a")]))
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "unknown_session"


@pytest.mark.parametrize(
    "raw",
    [b"{not json", b"[]", b'"text"', b"", b'{"request_id": 5, "nodes": "x", "edges": {}}'],
)
def test_malformed_json_and_wrong_types_are_422_envelopes(
    client: TestClient, session_id: str, raw: bytes
) -> None:
    response = client.post(
        f"/api/v1/internal/sessions/{session_id}/execution-plans",
        content=raw,
        headers={**INTERNAL, "Content-Type": "application/json"},
    )
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"]
    assert error["details"]
    assert revision_count(client) == 0


@pytest.mark.parametrize(
    "raw", [b"[" * 100_000 + b"]" * 100_000, b'{"request_id": "\xff"}'], ids=["deep", "utf8"]
)
def test_undecodable_bodies_are_422_invalid_json(
    client: TestClient, session_id: str, raw: bytes
) -> None:
    response = client.post(
        f"/api/v1/internal/sessions/{session_id}/execution-plans",
        content=raw,
        headers={**INTERNAL, "Content-Type": "application/json"},
    )
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "invalid_json"


def test_values_a_store_cannot_hold_are_422_not_500(client: TestClient, session_id: str) -> None:
    huge = client.get(
        f"/api/v1/sessions/{session_id}/execution-plans/99999999999999999999", headers=PUBLIC
    )
    assert huge.status_code == 422
    nul_title = client.post(
        "/api/v1/sessions", json={"purpose": "ordinary_chat", "title": "a\u0000b"}, headers=PUBLIC
    )
    assert nul_title.status_code == 422
    nul_path = client.get("/api/v1/sessions/a%00b/execution-plans", headers=PUBLIC)
    assert nul_path.status_code in (404, 422)
    nul_plan = publish(client, session_id, plan("r1", [node("a", title="x\u0000")]))
    assert nul_plan.status_code == 422
    assert nul_plan.json()["error"]["code"] == "invalid_character"


def test_bad_fence_on_the_bridge_is_422(client: TestClient, session_id: str) -> None:
    body = plan("r1", [node("a")], fence={"task_id": "t", "generation": "one"})
    response = publish(client, session_id, body)
    assert response.status_code == 422
    assert response.json()["error"]["details"][0]["field"] == "fence"


@pytest.mark.parametrize(
    "fence",
    [
        {"task_id": "t", "generation": 2**70, "lease_token": "x"},
        {"task_id": "t", "generation": 0, "lease_token": "x"},
        {"task_id": "t\u0000", "generation": 1, "lease_token": "x"},
        {"task_id": "t", "generation": 1, "lease_token": "x\u0000"},
    ],
    ids=["huge-generation", "generation-0", "nul-task-id", "nul-lease-token"],
)
def test_a_fence_no_store_can_hold_is_422_on_both_stores(
    client: TestClient, session_id: str, fence: dict[str, Any]
) -> None:
    response = publish(client, session_id, plan("r1", [node("a")], fence=fence))
    assert response.status_code == 422, response.text
    assert response.json()["error"]["details"][0]["field"] == "fence"
    assert revision_count(client) == 0


@pytest.mark.parametrize(
    "raw",
    [
        '{"request_id": "r1", "title": "a\\ud800", "nodes": [{"id": "a", "title": "t", '
        '"actor": "agent", "status": "pending"}]}',
        '{"request_id": "r1", "title": "p", "nodes": [{"id": "\\udc00", "title": "t", '
        '"actor": "agent", "status": "pending"}]}',
        '{"request_id": "r1", "title": "p", "nodes": [{"id": "a", "title": "t", '
        '"actor": "agent", "status": "pending", "description": "x\\ud800y"}]}',
        '{"request_id": "r1", "title": "p", "nodes": [{"id": "a", "title": "t", '
        '"actor": "agent", "status": "pending"}], "edges": [{"from": "\\ud800", "to": "a"}]}',
        # The request_id is looked up before the other rules: not one that failed its check.
        '{"request_id": "r\\ud800", "title": "p", "nodes": [{"id": "a", "title": "t", '
        '"actor": "agent", "status": "pending"}]}',
        '{"request_id": "r\\u0000", "title": "p", "nodes": [{"id": "a", "title": "t", '
        '"actor": "agent", "status": "pending"}]}',
        # Nor are the action ids of a refused plan's nodes.
        '{"request_id": "r1", "title": "p", "nodes": [{"id": "a", "title": "t", '
        '"actor": "agent", "status": "pending", "action_id": "x\\ud800"}]}',
        '{"request_id": "r1", "title": "p", "nodes": [{"id": "a", "title": "t", '
        '"actor": "agent", "status": "pending", "action_id": "x\\u0000"}]}',
    ],
    ids=[
        "plan-title",
        "node-id",
        "node-description",
        "edge-from",
        "request-id",
        "nul-request-id",
        "action-id",
        "nul-action-id",
    ],
)
def test_an_unpaired_surrogate_or_a_nul_in_a_plan_is_422_not_500(
    client: TestClient, session_id: str, raw: str
) -> None:
    response = client.post(
        f"/api/v1/internal/sessions/{session_id}/execution-plans",
        content=raw.encode(),
        headers={**INTERNAL, "Content-Type": "application/json"},
    )
    assert response.status_code == 422, response.text
    assert response.json()["error"]["code"] == "invalid_character"
    assert revision_count(client) == 0


def test_stale_fence_on_the_bridge_is_409(client: TestClient, session_id: str) -> None:
    body = plan("r1", [node("a")], fence={"task_id": "t", "generation": 1, "lease_token": "x"})
    response = publish(client, session_id, body)
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "stale_generation"
    assert revision_count(client) == 0


def test_an_unfenced_publish_to_a_task_execution_session_is_409(client: TestClient) -> None:
    triggered = client.post(
        "/api/v1/tasks", json={"task_type": "leak", "title": "leak"}, headers=PUBLIC
    )
    assert triggered.status_code == 201, triggered.text
    response = publish(client, triggered.json()["session_id"], plan("r1", [node("a")]))
    assert response.status_code == 409, response.text
    assert response.json()["error"]["code"] == "fence_required"
    assert revision_count(client) == 0


def test_sessions_list_ordinary_chats_unless_asked(client: TestClient, session_id: str) -> None:
    db: Database = client.app.state.db  # type: ignore[attr-defined]
    task_id = str(uuid.uuid4())
    with db.transaction() as conn:
        conn.execute(
            insert(tasks).values(
                task_id=task_id,
                task_type="wq",
                title="t",
                context={},
                trigger_id=task_id,
                origin="live",
                status="queued",
                generation=1,
                created_at=utcnow(),
                updated_at=utcnow(),
            )
        )
    collab = client.post(
        "/api/v1/sessions",
        json={"purpose": "task_collaboration", "title": "ask", "task_id": task_id},
        headers=PUBLIC,
    )
    assert collab.status_code == 201, collab.text
    default = client.get("/api/v1/sessions", headers=PUBLIC).json()["items"]
    assert [s["session_id"] for s in default] == [session_id]
    by_purpose = client.get(
        "/api/v1/sessions", params={"purpose": "task_collaboration"}, headers=PUBLIC
    ).json()["items"]
    assert [s["session_id"] for s in by_purpose] == [collab.json()["session_id"]]
    by_task = client.get("/api/v1/sessions", params={"task_id": task_id}, headers=PUBLIC).json()
    assert [s["purpose"] for s in by_task["items"]] == ["task_collaboration"]
    orphan = client.post(
        "/api/v1/sessions", json={"purpose": "task_execution", "title": "x"}, headers=PUBLIC
    )
    assert orphan.status_code == 422
    assert orphan.json()["error"]["code"] == "task_required"
    too_many = client.get("/api/v1/sessions", params={"limit": 201}, headers=PUBLIC)
    assert too_many.status_code == 422
    assert too_many.json()["error"]["code"] == "invalid_request"


def test_sessions_pagination_walks_every_session_once(client: TestClient) -> None:
    created = {
        client.post(
            "/api/v1/sessions", json={"purpose": "ordinary_chat", "title": f"c{i}"}, headers=PUBLIC
        ).json()["session_id"]
        for i in range(7)
    }
    seen: list[str] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 3, **({"cursor": cursor} if cursor else {})}
        page = client.get("/api/v1/sessions", params=params, headers=PUBLIC).json()
        seen += [s["session_id"] for s in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert sorted(seen) == sorted(created)
    assert len(seen) == 7
    bad = client.get("/api/v1/sessions", params={"cursor": "garbage!"}, headers=PUBLIC)
    assert bad.status_code == 422
    assert bad.json()["error"]["code"] == "invalid_cursor"


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(payload=random_plans(), with_history=st.booleans())
def test_random_publishes_match_the_reference_never_500_and_refusals_write_nothing(
    client: TestClient, payload: dict[str, Any], with_history: bool
) -> None:
    session = client.post(
        "/api/v1/sessions", json={"purpose": "ordinary_chat", "title": "p"}, headers=PUBLIC
    ).json()["session_id"]
    expected = reference_codes(payload)
    if with_history:
        # Revision 1 exists, so the history rules run too (they once crashed on a list as id).
        first = publish(client, session, plan("base", PREVIOUS))
        assert first.status_code == 201, first.text
        expected |= reference_update_codes(payload, PREVIOUS)
        expected |= reference_retry_codes(payload, PREVIOUS)
    expected |= reference_authority_codes(payload, PREVIOUS if with_history else None)
    before = revision_count(client)
    response = publish(client, session, payload)
    assert response.status_code == (422 if expected else 201), response.text
    if expected:
        assert {d["code"] for d in response.json()["error"]["details"]} == expected
    assert revision_count(client) == before + (0 if expected else 1)


def test_an_unexpected_failure_is_a_500_envelope_without_traceback(
    sqlite_url: str, tmp_path: Path
) -> None:
    from fastapi import APIRouter

    boom = APIRouter()

    @boom.get("/boom")
    def explode() -> None:
        raise RuntimeError("secret internals")

    settings = load_settings(database_url=sqlite_url, home=tmp_path, api_token=None)
    with TestClient(
        create_app(settings, public_routers=[boom]), raise_server_exceptions=False
    ) as c:
        response = c.get("/boom")
    assert response.status_code == 500
    assert response.json()["error"]["code"] == "internal_error"
    assert "secret internals" not in response.text
    assert "Traceback" not in response.text


def _cursor(value: Any) -> str:
    raw = json.dumps(value).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


@pytest.mark.parametrize(
    "cursor",
    [
        _cursor(["0001-01-01T00:00:00+01:00", "x"]),  # overflows when converted to UTC
        _cursor(["9999-12-31T23:59:59-01:00", "x"]),
        _cursor(["2024-01-01T00:00:00", "x"]),  # no offset
        _cursor([5, "x"]),
        _cursor(["2024-01-01T00:00:00+00:00", 5]),
        _cursor({"a": 1, "b": 2}),
        _cursor(["2024-01-01T00:00:00+00:00"]),
        _cursor(["2024-01-01T00:00:00+00:00", "\ud800"]),  # no store keeps a lone surrogate
        _cursor(["2024-01-01T00:00:00+00:00", "a\x00"]),  # nor a NUL (Postgres)
        "garbage!",
        "",
    ],
)
def test_forged_session_cursors_are_422_invalid_cursor(client: TestClient, cursor: str) -> None:
    response = client.get("/api/v1/sessions", params={"cursor": cursor}, headers=PUBLIC)
    if cursor == "":
        assert response.status_code == 200  # an empty cursor is the first page
        return
    assert response.status_code == 422, response.text
    assert response.json()["error"]["code"] == "invalid_cursor"


@pytest.mark.parametrize(
    "raw",
    [b"{not json", b"[" * 100_000 + b"]" * 100_000, b"\xff", b""],
    ids=["bad", "deep", "utf8", "empty"],
)
@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, PUBLIC])
def test_the_token_is_checked_before_the_body_is_parsed(
    client: TestClient, session_id: str, raw: bytes, headers: dict[str, str]
) -> None:
    bridge = client.post(
        f"/api/v1/internal/sessions/{session_id}/execution-plans",
        content=raw,
        headers={**headers, "Content-Type": "application/json"},
    )
    assert bridge.status_code == 401, bridge.text
    assert bridge.json()["error"]["code"] == "unauthorized"
    assert bridge.headers["WWW-Authenticate"] == "Bearer"
    public_headers = INTERNAL if headers is PUBLIC else headers
    public = client.post(
        "/api/v1/sessions",
        content=raw,
        headers={**public_headers, "Content-Type": "application/json"},
    )
    assert public.status_code == 401, public.text
    assert public.json()["error"]["code"] == "unauthorized"
    assert revision_count(client) == 0


def test_openapi_and_docs_need_the_api_token_when_it_is_set(client: TestClient) -> None:
    for path in ("/openapi.json", "/docs", "/redoc", "/docs/oauth2-redirect"):
        for headers in ({}, {"Authorization": "Bearer nope"}, INTERNAL):
            response = client.get(path, headers=headers)
            assert response.status_code == 401, path
            assert response.json()["error"]["code"] == "unauthorized"
    schema = client.get("/openapi.json", headers=PUBLIC)
    assert schema.status_code == 200
    assert "/api/v1/sessions" in schema.json()["paths"]
    # The browser pages cannot send a bearer token for their own schema fetch: off.
    assert client.get("/docs", headers=PUBLIC).status_code == 404
    assert client.get("/healthz").status_code == 200


def test_without_an_api_token_docs_are_served_and_the_bridge_stays_closed(
    sqlite_url: str, tmp_path: Path
) -> None:
    settings = load_settings(database_url=sqlite_url, home=tmp_path, api_token=None)
    with TestClient(create_app(settings), raise_server_exceptions=False) as c:
        assert c.get("/openapi.json").status_code == 200
        assert c.get("/docs").status_code == 200
        closed = c.post(
            "/api/v1/internal/sessions/x/execution-plans",
            content=b"{not json",
            headers={"Authorization": "Bearer anything", "Content-Type": "application/json"},
        )
        assert closed.status_code == 401
        assert closed.json()["error"]["code"] == "unauthorized"


def test_tokens_never_reach_the_logs_or_the_errors(
    client: TestClient, session_id: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    attempts = [
        ("post", f"/api/v1/internal/sessions/{session_id}/execution-plans", PUBLIC),
        ("post", f"/api/v1/internal/sessions/{session_id}/execution-plans",
         {"Authorization": "Bearer internal-token-almost"}),
        ("post", f"/api/v1/internal/sessions/{session_id}/execution-plans",
         {"Authorization": "internal-token"}),
        ("get", "/api/v1/sessions", INTERNAL),
        ("get", "/api/v1/sessions", {"Authorization": "Bearer public-token-almost"}),
        ("get", "/openapi.json", {"Authorization": "Basic public-token"}),
    ]  # fmt: skip
    texts = []
    for method, path, headers in attempts:
        response = client.request(method, path, content=b"{not json", headers=headers)
        assert response.status_code == 401, path
        texts.append(response.text + str(response.headers))
    seen = caplog.text + "".join(texts)
    for secret in ("public-token", "internal-token"):
        assert secret not in seen


def test_request_id_limit_and_format_are_field_too_long(
    client: TestClient, session_id: str
) -> None:
    for bad in ("r" * 129, "has space", "naïve"):
        response = publish(client, session_id, plan(bad, [node("a")]))
        assert response.status_code == 422
        error = response.json()["error"]
        assert error["code"] == "field_too_long"
        assert error["details"][0]["field"] == "request_id"
    assert publish(client, session_id, plan("r" * 128, [node("a")])).status_code == 201


def test_a_request_id_that_passes_for_a_persons_revision_is_refused(
    client: TestClient, session_id: str
) -> None:
    # A person's revisions carry "human:" (the end of a round reads it): nobody else may.
    response = publish(client, session_id, plan("human:0b7f", [node("a")]))
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "reserved_request_id"
    assert error["details"][0]["field"] == "request_id"
    history = client.get(f"/api/v1/sessions/{session_id}/execution-plans", headers=PUBLIC)
    assert history.json()["latest"] is None  # nothing written
    assert publish(client, session_id, plan("humane:1", [node("a")])).status_code == 201


def test_a_stored_plan_sent_back_with_its_server_fields_is_accepted(
    client: TestClient, session_id: str
) -> None:
    first = publish(client, session_id, plan("r1", [node("a"), node("b")]))
    assert first.status_code == 201, first.text
    latest = client.get(f"/api/v1/sessions/{session_id}/execution-plans", headers=PUBLIC).json()[
        "latest"
    ]
    for field in ("schema_version", "session_id", "revision", "status_counts", "updated_at"):
        assert field in latest
    assert latest["retries"] == {}
    replay = publish(client, session_id, latest)  # the same request_id and content
    assert replay.status_code == 200, replay.text
    assert replay.json()["revision"] == 1
    edited = {**latest, "request_id": "r2", "revision": 99, "session_id": "someone-else"}
    edited["retries"] = {"a": ["b"]}  # the host's record, not the caller's: ignored
    edited["nodes"] = [{**latest["nodes"][0], "status": "running"}, latest["nodes"][1]]
    second = publish(client, session_id, edited)
    assert second.status_code == 201, second.text
    body = second.json()
    assert (body["revision"], body["session_id"]) == (2, session_id)
    assert body["status_counts"]["running"] == 1
    assert body["retries"] == {}
    assert revision_count(client) == 2


@pytest.mark.parametrize("field", ["title", "owner", "task_id"])
def test_a_session_field_no_store_can_hold_is_a_422_naming_that_field(
    client: TestClient, field: str
) -> None:
    body = {"purpose": "ordinary_chat", "title": "chat", field: "a\u0000b"}
    response = client.post("/api/v1/sessions", json=body, headers=PUBLIC)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["details"][0]["field"] == f"body.{field}"
