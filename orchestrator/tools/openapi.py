"""The business backend's OpenAPI 3 document → operations with effects and argument models.

Each operation gets the pydantic model of its arguments from `orchestrator.tools.argument_models`.
Every document the gateway cannot use raises `SpecError` with one line that says what is wrong.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel

from orchestrator.tools.argument_models import (
    ModelNames,
    arguments_model,
    deref,
    field_definition,
)
from orchestrator.tools.base import Effect
from orchestrator.tools.spec_errors import SpecError, as_list, as_mapping, kind_of

__all__ = [
    "SPEC_SETTING",
    "ApiSpec",
    "Operation",
    "Parameter",
    "load_spec",
    "parse_spec",
]

#: The setting that names the document; every `SpecError` from `load_spec` starts with it.
SPEC_SETTING = "ORCH_GATEWAY_SPEC"

_METHODS = ("get", "put", "post", "delete", "patch", "head", "options")
_EFFECTS: tuple[Effect, ...] = ("read", "write", "sensitive_read")
_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")  # an HTTP field name (RFC 9110 token)
_TEMPLATE = re.compile(r"\{([^{}]*)\}")


@dataclass(frozen=True)
class Parameter:
    name: str
    location: Literal["path", "query", "header"]
    required: bool


@dataclass(frozen=True)
class Operation:
    operation_id: str
    method: str
    path: str
    summary: str
    effect: Effect
    parameters: tuple[Parameter, ...]
    has_body: bool
    model: type[BaseModel]
    verify_with: str | None = None
    sensitive: bool = False
    #: The operation's OpenAPI `tags` (tool discovery searches them).
    tags: tuple[str, ...] = ()

    def arguments_schema(self) -> dict[str, Any]:
        return self.model.model_json_schema(by_alias=True)


@dataclass(frozen=True)
class ApiSpec:
    title: str
    servers: tuple[str, ...]
    operations: dict[str, Operation] = field(default_factory=dict)


def load_spec(path: Path) -> ApiSpec:
    """Read a JSON or YAML OpenAPI 3 document from `path`; `SpecError` naming the setting."""
    where = f"{SPEC_SETTING} ({path})"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(f"{where}: cannot read the file: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise SpecError(f"{where}: the file is not UTF-8 text") from None
    try:
        document = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except json.JSONDecodeError as exc:
        raise SpecError(
            f"{where}: not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}"
        ) from None
    except yaml.YAMLError as exc:
        raise SpecError(f"{where}: not valid YAML: {_yaml_problem(exc)}") from None
    except (ValueError, RecursionError) as exc:
        raise SpecError(f"{where}: not valid JSON/YAML: {exc}") from None
    try:
        return parse_spec(document)
    except SpecError as exc:
        raise SpecError(f"{where}: {exc.message}") from None


def _yaml_problem(exc: yaml.YAMLError) -> str:
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "cannot be parsed"
        if mark is not None:
            return f"{problem} at line {mark.line + 1}, column {mark.column + 1}"
        return problem
    return str(exc) or type(exc).__name__


def parse_spec(document: Any) -> ApiSpec:
    """Operations of an OpenAPI 3 document; `SpecError` on anything the gateway cannot honour.

    Whatever the shape of `document`, nothing but `SpecError` comes out of here.
    """
    try:
        return _parse(document)
    except SpecError:
        raise
    except RecursionError:
        raise SpecError("the document nests too deeply to be used") from None
    except Exception as exc:  # a shape no check below foresaw: still one clear error type
        raise SpecError(
            f"the document has a shape the gateway cannot use ({type(exc).__name__}: {exc})"
        ) from None


def _parse(document: Any) -> ApiSpec:
    if not isinstance(document, dict):
        raise SpecError(
            f"the document must be a mapping (an OpenAPI 3 object), not {kind_of(document)}"
        )
    if not str(document.get("openapi", "")).startswith("3"):
        raise SpecError("the gateway spec must be an OpenAPI 3 document ('openapi: 3.x')")
    info = as_mapping(document.get("info", {}), "info")
    components = as_mapping(
        as_mapping(document.get("components", {}), "components").get("schemas", {}),
        "components.schemas",
    )
    paths = document.get("paths")
    if paths is None:
        raise SpecError("the document has no 'paths', so no operations")
    paths = as_mapping(paths, "paths")
    operations: dict[str, Operation] = {}
    for path, item in paths.items():
        if not isinstance(path, str) or not path.startswith("/"):
            raise SpecError(f"paths: {path!r} is not a path starting with '/'")
        item = as_mapping(item, f"paths.{path}")
        shared = as_list(item.get("parameters", []), f"paths.{path}.parameters")
        for method in _METHODS:
            raw = item.get(method)
            if raw is None:
                continue
            raw = as_mapping(raw, f"{method.upper()} {path}")
            operation = _operation(path, method, raw, shared, components)
            if operation.operation_id in operations:
                raise SpecError(f"operationId {operation.operation_id!r} is used twice")
            operations[operation.operation_id] = operation
    if not operations:
        raise SpecError("the document defines no operations under 'paths'")
    for operation in operations.values():
        _check_verifier(operation, operations)
    servers: list[str] = []
    for index, server in enumerate(as_list(document.get("servers", []), "servers")):
        server = as_mapping(server, f"servers[{index}]")
        if not isinstance(server.get("url"), str):
            raise SpecError(f"servers[{index}]: 'url' must be a string")
        servers.append(server["url"])
    title = str(info.get("title", "business backend"))
    return ApiSpec(title=title, servers=tuple(servers), operations=operations)


def _operation(
    path: str, method: str, raw: dict[str, Any], shared: list[Any], components: dict[str, Any]
) -> Operation:
    operation_id = raw.get("operationId")
    if not operation_id or not isinstance(operation_id, str):
        raise SpecError(f"{method.upper()} {path} has no operationId")
    effect = raw.get("x-effect") or ("read" if method in ("get", "head") else "write")
    if not isinstance(effect, str) or effect not in _EFFECTS:
        raise SpecError(f"{operation_id}: x-effect must be one of {', '.join(_EFFECTS)}")
    if "responses" in raw:
        responses = raw["responses"]
        if not isinstance(responses, dict) or not responses:
            raise SpecError(f"{operation_id}: 'responses' must be a non-empty mapping")
    verify_with = raw.get("x-verify-with")
    if verify_with is not None and not isinstance(verify_with, str):
        raise SpecError(f"{operation_id}: x-verify-with must be an operationId")
    sensitive = raw.get("x-sensitive", False)
    if not isinstance(sensitive, bool):
        raise SpecError(f"{operation_id}: x-sensitive must be true or false")
    own = as_list(raw.get("parameters", []), f"{operation_id}.parameters")
    by_key: dict[tuple[str, str], dict[str, Any]] = {}
    for parameter in [*shared, *own]:
        parameter = deref(parameter, components, f"{operation_id}.parameters")
        name, location = parameter.get("name"), parameter.get("in")
        if not isinstance(name, str) or not name or not isinstance(location, str):
            raise SpecError(f"{operation_id}: every parameter needs a string 'name' and 'in'")
        by_key[(location, name)] = parameter
    parameters: list[Parameter] = []
    fields: dict[str, Any] = {}
    # One operation's schema is one document for the model: its class names are unique in it.
    names = ModelNames()
    for (location, name), parameter in by_key.items():
        if location not in ("path", "query", "header"):
            raise SpecError(f"{operation_id}: parameters in {location} are not supported")
        if name == "body":
            raise SpecError(f"{operation_id}: a parameter may not be named 'body'")
        if name in fields:
            raise SpecError(
                f"{operation_id}: parameter {name!r} appears in two locations; call_api names "
                "arguments by name"
            )
        if location == "header" and not _TOKEN.match(name):
            raise SpecError(f"{operation_id}: {name!r} is not a valid HTTP header name")
        required = bool(parameter.get("required")) or location == "path"
        parameters.append(Parameter(name, location, required))  # type: ignore[arg-type]
        schema = parameter.get("schema", {})
        # A parameter has no wire form for null: an explicit null means "leave it out".
        fields[name] = field_definition(
            schema,
            required,
            components,
            f"{operation_id}.{name}",
            0,
            names=names,
            null_is_absent=True,
        )
    _check_template(operation_id, path, parameters)
    has_body = False
    body = raw.get("requestBody")
    if body is not None:
        body = deref(body, components, f"{operation_id}.requestBody")
        content = as_mapping(body.get("content", {}), f"{operation_id}.requestBody.content")
        media = content.get("application/json")
        if media is None:
            raise SpecError(f"{operation_id}: only application/json request bodies are supported")
        media = as_mapping(media, f"{operation_id}.requestBody.content.application/json")
        has_body = True
        fields["body"] = field_definition(
            media.get("schema", {}),
            bool(body.get("required")),
            components,
            f"{operation_id}.body",
            0,
            names=names,
        )
    model = arguments_model(operation_id, fields, forbid_extra=True, names=names)
    return Operation(
        operation_id=operation_id,
        method=method.upper(),
        path=path,
        summary=str(raw.get("summary") or raw.get("description") or ""),
        effect=effect,
        parameters=tuple(parameters),
        has_body=has_body,
        model=model,
        verify_with=verify_with,
        sensitive=sensitive,
        tags=_tags(raw.get("tags")),
    )


def _tags(value: Any) -> tuple[str, ...]:
    """An operation's `tags` (anything else than a list of strings is ignored)."""
    if not isinstance(value, list):
        return ()
    return tuple(tag for tag in value if isinstance(tag, str))


def _check_template(operation_id: str, path: str, parameters: list[Parameter]) -> None:
    """Every `{name}` in the path has a path parameter and every path parameter a `{name}`."""
    in_template = set(_TEMPLATE.findall(path))
    declared = {p.name for p in parameters if p.location == "path"}
    undeclared = sorted(in_template - declared)
    if undeclared:
        name = undeclared[0]
        raise SpecError(f"{operation_id}: the path has {{{name}}} but no path parameter {name!r}")
    unused = sorted(declared - in_template)
    if unused:
        raise SpecError(f"{operation_id}: path parameter {unused[0]!r} is not in the path {path}")


def _check_verifier(operation: Operation, operations: dict[str, Operation]) -> None:
    if operation.verify_with is None:
        return
    name = operation.operation_id
    verifier = operations.get(operation.verify_with)
    if verifier is None:
        raise SpecError(f"{name}: x-verify-with names no operation ({operation.verify_with!r})")
    if verifier.effect != "read":
        raise SpecError(f"{name}: the verifier {verifier.operation_id} must be a plain read")
    if operation.effect != "write" or operation.method != "PUT" or not operation.has_body:
        # Only a full replacement (PUT of the whole value) can be confirmed by reading it back;
        # a partial update or a list append cannot.
        raise SpecError(f"{name}: x-verify-with is only for a PUT that replaces a whole value")
