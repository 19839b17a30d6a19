"""The OpenAPI contract of the people-facing routes: response models and error envelopes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from orchestrator.api.app import create_app
from orchestrator.settings import load_settings

ROUTES = [
    ("/api/v1/actions/{action_id}", "get", {401, 404}),
    ("/api/v1/actions/{action_id}/approve", "post", {401, 403, 404, 409, 422}),
    ("/api/v1/actions/{action_id}/reject", "post", {401, 403, 404, 409, 422}),
    ("/api/v1/tasks/{task_id}/nodes/{node_id}/complete", "post", {401, 403, 404, 409, 422}),
    ("/api/v1/tasks/{task_id}/nodes/{node_id}/fail", "post", {401, 403, 404, 409, 422}),
    ("/api/v1/tasks/{task_id}/nodes/{node_id}/skip", "post", {401, 403, 404, 409, 422}),
    ("/api/v1/tasks/{task_id}/collaboration", "post", {401, 403, 404}),
    ("/api/v1/sessions/{session_id}/messages", "post", {401, 403, 404, 409, 422}),
    ("/api/v1/sessions/{session_id}/messages", "get", {401, 404, 409, 422}),
    ("/api/v1/tasks", "post", {401, 403, 409, 422}),
]


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder: Path = tmp_path_factory.mktemp("contract")
    app = create_app(load_settings(database_url=f"sqlite:///{folder / 'x.db'}", home=folder))
    with TestClient(app) as client:
        return dict(client.get("/openapi.json").json())


@pytest.mark.parametrize(("path", "method", "statuses"), ROUTES)
def test_each_route_declares_its_body_and_its_errors(
    spec: dict[str, Any], path: str, method: str, statuses: set[int]
) -> None:
    operation = spec["paths"][path][method]
    responses = operation["responses"]
    for status in statuses:
        schema = responses[str(status)]["content"]["application/json"]["schema"]
        assert schema["$ref"].endswith("/ErrorEnvelope"), (path, status)
    ok = next(code for code in responses if code.startswith("2"))
    assert responses[ok]["content"]["application/json"]["schema"], (path, ok)


def test_the_message_list_has_the_one_list_shape(spec: dict[str, Any]) -> None:
    ok = spec["paths"]["/api/v1/sessions/{session_id}/messages"]["get"]["responses"]["200"]
    name = ok["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
    assert set(spec["components"]["schemas"][name]["properties"]) == {"items", "next_cursor"}
