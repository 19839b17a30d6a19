"""The README's table of HTTP routes against the API's OpenAPI document: every route the API
serves is in the table and every route of the table is served, with the query parameters it
shows, and each request body it shows names fields the route takes, marking optional (`"x"?`)
none that the route requires."""

from __future__ import annotations

import re
from typing import Any

import pytest

from orchestrator.api.app import create_app
from orchestrator.settings import load_settings
from tests.documents import README

#: Served outside the OpenAPI document: liveness, readiness, metrics.
UNDOCUMENTED = {("GET", "/healthz"), ("GET", "/readyz"), ("GET", "/metrics")}
#: Shown as required though the schema leaves it out: the route itself refuses an approval
#: without it (`422 digest_required`).
REQUIRED_BY_THE_ROUTE = {("POST", "/api/v1/actions/{}/approve"): {"digest"}}
_TOKEN = re.compile(
    r"`(?P<method>GET|POST|DELETE) (?P<path>/[^`\[ ]*)(?:\[(?P<more>[^\]]*)\])?`"
    r"|`\.\.\.(?P<sibling>/[^`]+)`"
    r"|`(?P<body>\{[^`]*\})`"
    r"|\(`(?P<also>GET)`"
)


def _normal(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "{}", path)


def _table() -> tuple[dict[tuple[str, str], set[str]], dict[tuple[str, str], str]]:
    """(method, path) -> the query parameters shown, and -> the body shown, from each row's
    first cell."""
    section = README.read_text(encoding="utf-8").split("\n## The HTTP API\n", 1)[1]
    queries: dict[tuple[str, str], set[str]] = {}
    bodies: dict[tuple[str, str], str] = {}
    for row in section.split("\n## ", 1)[0].splitlines():
        if not row.startswith("| `"):
            continue
        cell, what = re.split(r"(?<!\\) \| ", row.strip("|"), maxsplit=1)
        current: tuple[str, str] | None = None
        waiting: list[tuple[str, str]] = []  # the routes a body after them belongs to
        for token in _TOKEN.finditer(cell):
            if token["method"]:
                more = token["more"] or ""
                current = (token["method"], _normal(token["path"]))
                routes = [current]
                if more.startswith("/"):  # an optional last segment: both paths
                    routes.append((current[0], _normal(token["path"] + more)))
                query = {p.split("=")[0] for p in more.removeprefix("?").split("&")}
                for route in routes:
                    queries[route] = query if more.startswith("?") else set()
                waiting = routes
            elif token["sibling"] and current is not None:
                parent = current[1].rsplit("/", 1)[0]
                route = (current[0], parent + _normal(token["sibling"]))
                queries[route] = set()
                waiting.append(route)
            elif token["body"]:
                for route in waiting:
                    bodies[route] = token["body"]
                waiting = []
            elif token["also"] and current is not None:
                queries[("GET", current[1])] = set()
        # A body may open the second cell instead: `trigger {"task_type", ...}`.
        opening = re.match(r"\w+ `(\{[^`]*\})`", what)
        if opening and waiting:
            for route in waiting:
                bodies[route] = opening[1]
    return queries, bodies


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    store = tmp_path_factory.mktemp("store") / "store.db"
    return create_app(load_settings(database_url=f"sqlite:///{store}", redis_url="")).openapi()


def _served(spec: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (method.upper(), _normal(path)): operation
        for path, operations in spec["paths"].items()
        for method, operation in operations.items()
        if method in ("get", "post", "put", "patch", "delete")
    }


def test_the_table_lists_every_route_the_api_serves_and_no_other(spec: dict[str, Any]) -> None:
    queries, _ = _table()
    served = set(_served(spec)) | UNDOCUMENTED
    assert sorted(served - set(queries)) == []  # served, not in the README
    assert sorted(set(queries) - served) == []  # in the README, not served


def test_the_query_parameters_shown_are_the_routes(spec: dict[str, Any]) -> None:
    queries, _ = _table()
    wrong = {}
    for route, operation in _served(spec).items():
        taken = {p["name"] for p in operation.get("parameters", []) if p["in"] == "query"}
        if taken and queries.get(route) != taken:
            wrong[route] = {"README": sorted(queries.get(route, ())), "served": sorted(taken)}
    assert not wrong, wrong


def _schema(spec: dict[str, Any], operation: dict[str, Any]) -> dict[str, Any]:
    schema = operation["requestBody"]["content"]["application/json"]["schema"]
    for option in [schema, *schema.get("anyOf", [])]:
        if "$ref" in option:
            found = spec["components"]["schemas"][option["$ref"].rsplit("/", 1)[-1]]
            assert isinstance(found, dict)
            return found
    raise AssertionError(schema)


def test_the_bodies_shown_name_the_fields_the_routes_take(spec: dict[str, Any]) -> None:
    _, bodies = _table()
    served = _served(spec)
    assert len(bodies) >= 10
    for route, body in bodies.items():
        schema = _schema(spec, served[route])
        # A key opens the object or follows a comma (a value such as "failed" does neither).
        shown = dict(re.findall(r'(?:\{|, )"(\w+)"(\??)', body))
        assert set(shown) <= set(schema["properties"]), (route, body)
        required = {name for name, mark in shown.items() if not mark}
        expected = set(schema.get("required", [])) | REQUIRED_BY_THE_ROUTE.get(route, set())
        assert required == expected, (route, body)
