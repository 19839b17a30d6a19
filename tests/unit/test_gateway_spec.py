"""A gateway spec the gateway cannot use stops the worker with one `SpecError` line.

`receipt_tools` (called at worker start) raises `SpecError`, and only that, for every bad
`ORCH_GATEWAY_SPEC`: each message is one line naming the setting, the file and the problem.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.settings import load_settings
from orchestrator.tools.openapi import parse_spec
from orchestrator.tools.results import ResultCache
from orchestrator.tools.spec_errors import SpecError
from orchestrator.tools.toolsets import receipt_tools
from tests.integration.fake_backend import SPEC


def _start(tmp_path: Path, spec_file: Path, base_url: str | None = "http://127.0.0.1:9") -> Any:
    """What a worker does at start: build its receipt tools from the settings."""
    settings = load_settings(home=tmp_path, gateway_spec=spec_file, gateway_base_url=base_url)
    return receipt_tools(settings, ledger=None, results=ResultCache())  # type: ignore[arg-type]


def _refused(tmp_path: Path, spec_file: Path, match: str, **kwargs: Any) -> str:
    with pytest.raises(SpecError, match=match) as caught:
        _start(tmp_path, spec_file, **kwargs)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"ORCH_GATEWAY_SPEC ({spec_file}): ")
    assert caught.value.code == "gateway_spec_invalid"
    return message


def _yaml_file(tmp_path: Path, document: Any) -> Path:
    path = tmp_path / "backend.yaml"
    path.write_text(yaml.safe_dump(document), encoding="utf-8")
    return path


def _changed(**changes: Any) -> dict[str, Any]:
    spec = copy.deepcopy(SPEC)
    for where, value in changes.items():
        node = spec
        *parents, last = where.split("|")
        for part in parents:
            node = node[part]
        node[last] = value
    return spec


def test_a_good_spec_gives_the_gateway_tools(tmp_path: Path) -> None:
    names = [tool.name for tool in _start(tmp_path, _yaml_file(tmp_path, SPEC))]
    assert names[:2] == ["call_api", "describe_api_operation"]


def test_a_document_that_is_not_a_mapping(tmp_path: Path) -> None:
    message = _refused(tmp_path, _yaml_file(tmp_path, ["a", "b"]), "must be a mapping")
    assert "not a list" in message


def test_an_empty_document(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("", encoding="utf-8")
    _refused(tmp_path, path, "must be a mapping")


def test_paths_not_a_mapping(tmp_path: Path) -> None:
    spec = _changed(paths=[{"/orders": {}}])
    message = _refused(tmp_path, _yaml_file(tmp_path, spec), "paths must be a mapping")
    assert "not a list" in message


def test_no_paths_means_no_operations(tmp_path: Path) -> None:
    spec = copy.deepcopy(SPEC)
    del spec["paths"]
    _refused(tmp_path, _yaml_file(tmp_path, spec), "no 'paths'")
    _refused(tmp_path, _yaml_file(tmp_path, _changed(paths={})), "defines no operations")


def test_an_operation_that_is_not_a_mapping(tmp_path: Path) -> None:
    spec = _changed(**{"paths|/orders|post": "create an order"})
    _refused(tmp_path, _yaml_file(tmp_path, spec), r"POST /orders must be a mapping")


@pytest.mark.parametrize("responses", [[], {}, "ok", None])
def test_an_operation_with_unusable_responses(tmp_path: Path, responses: Any) -> None:
    spec = _changed(**{"paths|/orders|post|responses": responses})
    _refused(tmp_path, _yaml_file(tmp_path, spec), "createOrder: 'responses' must be")


def test_the_base_url_is_missing(tmp_path: Path) -> None:
    message = _refused(
        tmp_path, _yaml_file(tmp_path, SPEC), "ORCH_GATEWAY_BASE_URL is not set", base_url=None
    )
    assert "names no server" in message


def test_a_base_url_from_the_document_must_be_absolute(tmp_path: Path) -> None:
    spec = _changed(servers=[{"url": "/api/v1"}])
    _refused(tmp_path, _yaml_file(tmp_path, spec), "not an absolute http", base_url=None)
    good = _changed(servers=[{"url": "http://backend.internal/api"}])
    assert _start(tmp_path, _yaml_file(tmp_path, good), base_url=None)


def test_a_bad_base_url_setting(tmp_path: Path) -> None:
    _refused(
        tmp_path,
        _yaml_file(tmp_path, SPEC),
        "ORCH_GATEWAY_BASE_URL 'backend:8080' is not an absolute",
        base_url="backend:8080",
    )


@pytest.mark.parametrize(
    "base_url",
    ["htps://svc:TOPSECRET@backend.internal/api", "http://svc:TOPSECRET@/api", "TOPSECRET@x"],
)
def test_a_bad_base_url_is_named_without_its_credentials(tmp_path: Path, base_url: str) -> None:
    # The line is printed as it is when the worker refuses to start: no password in it.
    message = _refused(
        tmp_path, _yaml_file(tmp_path, SPEC), "is not an absolute", base_url=base_url
    )
    assert "TOPSECRET" not in message
    assert "***@" in message


def test_an_unreadable_file(tmp_path: Path) -> None:
    _refused(tmp_path, tmp_path / "missing.yaml", "cannot read the file")
    _refused(tmp_path, tmp_path, "cannot read the file")  # a directory
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes("openapi: 3.0.0\ninfo: {title: caf\xe9}\n".encode("latin-1"))
    _refused(tmp_path, latin1, "not UTF-8")


def test_invalid_yaml(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("openapi: 3.0.0\npaths: [\n  - a: b\n  c\n", encoding="utf-8")
    message = _refused(tmp_path, path, "not valid YAML")
    assert "line" in message


def test_invalid_json(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(SPEC)[:-5], encoding="utf-8")
    _refused(tmp_path, path, r"not valid JSON: .* at line 1, column")


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"components": []}, "components must be a mapping"),
        ({"components|schemas": "Setting"}, "components.schemas must be a mapping"),
        ({"paths|/orders|post|parameters": {"name": "x"}}, "parameters must be a list"),
        ({"paths|/jobs|post|parameters": [{"in": "query"}]}, "string 'name' and 'in'"),
        ({"paths|/jobs|post|parameters": ["kind"]}, "expected an object"),
        ({"paths|/orders|post|requestBody|content": ["application/json"]}, "content must be"),
        ({"components|schemas|Setting": {"$ref": "#/components/schemas/Setting"}}, "itself"),
        ({"components|schemas|Setting|properties": ["value"]}, "properties must be a mapping"),
        ({"components|schemas|Setting|required": "value"}, "required must be a list"),
        ({"components|schemas|Setting|properties|value": {"enum": []}}, "enum must be"),
        ({"components|schemas|Setting|properties|value": {"type": "int"}}, "unknown type"),
        (
            {"components|schemas|Setting|properties|unit": {"type": "string", "pattern": "("}},
            "not a regular expression",
        ),
        (
            {"components|schemas|Setting|properties|unit": {"type": "string", "maxLength": "9"}},
            "max_length must be a non-negative integer",
        ),
        (
            {"components|schemas|Setting|properties|value": {"type": "integer", "default": "x"}},
            "does not fit the schema",
        ),
        (
            {"paths|/jobs|post|parameters": [{"name": "bad name", "in": "header"}]},
            "not a valid HTTP header name",
        ),
        ({"paths|/settings/{key}|parameters": []}, "no path parameter 'key'"),
        (
            {"paths|/jobs|post|parameters": [{"name": "id", "in": "path", "required": True}]},
            "'id' is not in the path",
        ),
        (
            {
                "paths|/jobs|post|parameters": [
                    {"name": "kind", "in": "query"},
                    {"name": "kind", "in": "header"},
                ]
            },
            "appears in two locations",
        ),
        ({"paths|/orders|post|x-sensitive": "no"}, "x-sensitive must be true or false"),
        ({"paths|/orders|post|x-effect": ["write"]}, "x-effect must be one of"),
        ({"paths|/settings/{key}|put|x-verify-with": ["getSetting"]}, "x-verify-with must be"),
        ({"servers": {"url": "http://x"}}, "servers must be a list"),
        ({"servers": ["http://x"]}, r"servers\[0\] must be a mapping"),
        ({"info": "utility"}, "info must be a mapping"),
        ({"paths|orders": {}}, "not a path starting with '/'"),
    ],
)
def test_malformed_shapes_are_one_clear_error(
    tmp_path: Path, changes: dict[str, Any], match: str
) -> None:
    _refused(tmp_path, _yaml_file(tmp_path, _changed(**changes)), match)


def _nodes(value: Any, where: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield where
    if isinstance(value, dict):
        for key, child in value.items():
            yield from _nodes(child, (*where, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield from _nodes(child, (*where, index))


def _replaced(where: tuple[Any, ...], value: Any) -> Any:
    if not where:
        return value
    spec = copy.deepcopy(SPEC)
    node: Any = spec
    for part in where[:-1]:
        node = node[part]
    node[where[-1]] = value
    return spec


@pytest.mark.parametrize(
    "replacement", [None, "x", 7, -1, 1.5, True, [], {}, [1, "y"], {"$ref": 3}]
)
def test_every_node_of_the_wrong_shape_gives_spec_error_or_a_usable_spec(
    replacement: Any,
) -> None:
    messages: list[str] = []
    for where in _nodes(SPEC):
        try:
            parse_spec(_replaced(where, replacement))
        except SpecError as exc:
            messages.append(str(exc))
        # Anything else escaping here fails the test: no AttributeError, TypeError, ...
    assert messages
    assert not [message for message in messages if "\n" in message or not message.strip()]
