"""The curl examples of the README and docs/ against the API's OpenAPI document: each names a
route the API serves, with the method it serves, sends a JSON body as JSON with every field the
route requires, and carries the bearer token an API with `ORCH_API_TOKEN` asks for."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from orchestrator.api.app import create_app
from orchestrator.settings import load_settings
from tests.documents import DOCUMENTS, code_blocks

#: Served outside the OpenAPI document (liveness, readiness, metrics, the console's pages).
UNDOCUMENTED = {("GET", "/healthz"), ("GET", "/readyz"), ("GET", "/metrics")}


def _curls() -> list[list[str]]:
    """Each `curl` command of the documents' code blocks, its continued lines joined, as words."""
    blocks = [block for document in DOCUMENTS for block in code_blocks(document)]
    commands = []
    for block in blocks:
        for command in block.replace("\\\n", " ").splitlines():
            if command.startswith("curl "):
                commands.append(shlex.split(command.split("  #", 1)[0]))
    return commands


def _option(words: list[str], *names: str) -> list[str]:
    return [words[i + 1] for i, word in enumerate(words[:-1]) if word in names]


def _operation(spec: dict[str, Any], method: str, path: str) -> dict[str, Any] | None:
    for template, operations in spec["paths"].items():
        if re.fullmatch(re.sub(r"\{[^}]+\}", "[^/]+", template), path):
            operation = operations.get(method.lower())
            return operation if isinstance(operation, dict) else None
    return None


def _required(spec: dict[str, Any], operation: dict[str, Any]) -> set[str]:
    schema = operation["requestBody"]["content"]["application/json"]["schema"]
    for option in [schema, *schema.get("anyOf", [])]:
        if "$ref" in option:
            name = option["$ref"].rsplit("/", 1)[-1]
            return set(spec["components"]["schemas"][name].get("required", []))
    return set()


def test_the_readme_and_docs_show_curl_examples() -> None:
    assert len(_curls()) >= 3


def test_every_curl_example_is_a_route_the_api_serves_as_shown(tmp_path: Path) -> None:
    settings = load_settings(database_url=f"sqlite:///{tmp_path / 'store.db'}", redis_url="")
    spec = create_app(settings).openapi()
    for words in _curls():
        url = next(word for word in words if word.startswith("http"))
        path = urlsplit(url).path
        body = _option(words, "-d", "--data")
        method = (_option(words, "-X", "--request") or ["POST" if body else "GET"])[0]
        headers = [h.lower().replace(" ", "") for h in _option(words, "-H", "--header")]
        if (method, path) in UNDOCUMENTED:
            continue
        operation = _operation(spec, method, path)
        assert operation is not None, (method, path)
        assert "authorization:bearer$orch_api_token" in headers, words
        if body:
            assert "content-type:application/json" in headers, words
            missing = _required(spec, operation) - set(json.loads(body[0]))
            assert not missing, (path, missing)
