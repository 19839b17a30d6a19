"""The business backend's OpenAPI 3 document → operations with effects and argument models.

Each operation's arguments (path, query and header parameters by name, the JSON request body
under `body`) become a pydantic model, so defaults are filled and types coerced before the
fingerprint is taken and before anything is sent. Unknown fields are refused.
"""

from __future__ import annotations

import json
import keyword
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, create_model

from orchestrator.tools.base import Effect

__all__ = ["ApiSpec", "Operation", "Parameter", "SpecError", "load_spec", "parse_spec"]

_METHODS = ("get", "put", "post", "delete", "patch", "head", "options")
_EFFECTS: tuple[Effect, ...] = ("read", "write", "sensitive_read")
_MAX_DEPTH = 12


class SpecError(ValueError):
    """The OpenAPI document cannot be used; the message names the operation and the problem."""


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

    def arguments_schema(self) -> dict[str, Any]:
        return self.model.model_json_schema(by_alias=True)


@dataclass(frozen=True)
class ApiSpec:
    title: str
    servers: tuple[str, ...]
    operations: dict[str, Operation] = field(default_factory=dict)


def load_spec(path: Path) -> ApiSpec:
    """Read a JSON or YAML OpenAPI 3 document from `path`."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(f"cannot read the gateway spec {path}: {exc.strerror}") from None
    try:
        document = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise SpecError(f"the gateway spec {path} is not valid JSON/YAML: {exc}") from None
    return parse_spec(document)


def parse_spec(document: Any) -> ApiSpec:
    """Operations of an OpenAPI 3 document; `SpecError` on anything the gateway cannot honour."""
    if not isinstance(document, dict) or not str(document.get("openapi", "")).startswith("3"):
        raise SpecError("the gateway spec must be an OpenAPI 3 document")
    components = document.get("components", {}).get("schemas", {})
    operations: dict[str, Operation] = {}
    for path, item in (document.get("paths") or {}).items():
        shared = item.get("parameters", [])
        for method in _METHODS:
            raw = item.get(method)
            if raw is None:
                continue
            operation = _operation(path, method, raw, shared, components)
            if operation.operation_id in operations:
                raise SpecError(f"operationId {operation.operation_id!r} is used twice")
            operations[operation.operation_id] = operation
    for operation in operations.values():
        _check_verifier(operation, operations)
    servers = tuple(str(s["url"]) for s in document.get("servers", []) if "url" in s)
    title = str(document.get("info", {}).get("title", "business backend"))
    return ApiSpec(title=title, servers=servers, operations=operations)


def _operation(
    path: str, method: str, raw: dict[str, Any], shared: list[Any], components: dict[str, Any]
) -> Operation:
    operation_id = raw.get("operationId")
    if not operation_id or not isinstance(operation_id, str):
        raise SpecError(f"{method.upper()} {path} has no operationId")
    effect = raw.get("x-effect") or ("read" if method in ("get", "head") else "write")
    if effect not in _EFFECTS:
        raise SpecError(f"{operation_id}: x-effect must be one of {', '.join(_EFFECTS)}")
    by_key: dict[tuple[str, str], dict[str, Any]] = {}
    for parameter in [*shared, *raw.get("parameters", [])]:
        parameter = _deref(parameter, components, operation_id)
        by_key[(parameter["in"], parameter["name"])] = parameter
    parameters: list[Parameter] = []
    fields: dict[str, Any] = {}
    for (location, name), parameter in by_key.items():
        if location not in ("path", "query", "header"):
            raise SpecError(f"{operation_id}: parameters in {location} are not supported")
        if name == "body":
            raise SpecError(f"{operation_id}: a parameter may not be named 'body'")
        required = bool(parameter.get("required")) or location == "path"
        parameters.append(Parameter(name, location, required))  # type: ignore[arg-type]
        schema = parameter.get("schema", {})
        fields[name] = _field(schema, required, components, f"{operation_id}.{name}", 0)
    has_body = False
    body = raw.get("requestBody")
    if body is not None:
        body = _deref(body, components, operation_id)
        content = body.get("content", {})
        media = content.get("application/json")
        if media is None:
            raise SpecError(f"{operation_id}: only application/json request bodies are supported")
        has_body = True
        fields["body"] = _field(
            media.get("schema", {}),
            bool(body.get("required")),
            components,
            f"{operation_id}.body",
            0,
        )
    model = _model(_class_name(operation_id), fields, forbid_extra=True)
    return Operation(
        operation_id=operation_id,
        method=method.upper(),
        path=path,
        summary=str(raw.get("summary") or raw.get("description") or ""),
        effect=effect,
        parameters=tuple(parameters),
        has_body=has_body,
        model=model,
        verify_with=raw.get("x-verify-with"),
        sensitive=bool(raw.get("x-sensitive")),
    )


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


def _deref(value: Any, components: dict[str, Any], where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise SpecError(f"{where}: expected an object in the spec")
    ref = value.get("$ref")
    if ref is None:
        return value
    prefix = "#/components/schemas/"
    if (
        not isinstance(ref, str)
        or not ref.startswith(prefix)
        or ref[len(prefix) :] not in components
    ):
        raise SpecError(f"{where}: unsupported or unknown $ref {ref!r}")
    return _deref(components[ref[len(prefix) :]], components, where)


def _field(
    schema: dict[str, Any], required: bool, components: dict[str, Any], where: str, depth: int
) -> tuple[Any, Any]:
    annotation = _type(schema, components, where, depth)
    schema = _deref(schema, components, where)
    if "default" in schema:
        return (annotation, schema["default"])
    if required:
        return (annotation, ...)
    # Absent optional values are dropped before sending (the dump excludes None).
    return (annotation | None, None)


def _type(schema: Any, components: dict[str, Any], where: str, depth: int) -> Any:
    if depth > _MAX_DEPTH:
        return Any
    schema = _deref(schema, components, where)
    result = _base_type(schema, components, where, depth)
    if schema.get("nullable"):
        result = result | None
    return result


def _base_type(schema: dict[str, Any], components: dict[str, Any], where: str, depth: int) -> Any:
    if "enum" in schema:
        return Literal[tuple(schema["enum"])]
    for combinator in ("oneOf", "anyOf"):
        if combinator in schema:
            options = [_type(s, components, where, depth + 1) for s in schema[combinator]]
            return Union[tuple(options)]  # noqa: UP007 - built from a runtime list
    if "allOf" in schema:
        merged: dict[str, Any] = {"type": "object", "properties": {}, "required": []}
        for part in schema["allOf"]:
            part = _deref(part, components, where)
            merged["properties"].update(part.get("properties", {}))
            merged["required"].extend(part.get("required", []))
            if part.get("additionalProperties"):
                merged["additionalProperties"] = True
        return _base_type(merged, components, where, depth)
    kind = schema.get("type")
    if isinstance(kind, list):
        non_null = [k for k in kind if k != "null"]
        inner = _base_type(
            {**schema, "type": non_null[0] if non_null else None}, components, where, depth
        )
        return inner | None if "null" in kind else inner
    constraints = _constraints(schema)
    if kind == "string":
        return _annotated(str, constraints)
    if kind == "integer":
        return _annotated(int, constraints)
    if kind == "number":
        # NaN and infinity have no JSON form; pydantic would quietly dump them as null.
        return _annotated(float, {"allow_inf_nan": False, **constraints})
    if kind == "boolean":
        return bool
    if kind == "array":
        item = _type(schema.get("items", {}), components, where, depth + 1)
        return _annotated(list[item], constraints)  # type: ignore[valid-type]
    if kind == "object" or "properties" in schema:
        properties = schema.get("properties")
        if not properties:
            return dict[str, Any]
        required = set(schema.get("required", []))
        fields = {
            name: _field(sub, name in required, components, f"{where}.{name}", depth + 1)
            for name, sub in properties.items()
        }
        extra = schema.get("additionalProperties", False)
        return _model(_class_name(where), fields, forbid_extra=not extra)
    return Any


def _constraints(schema: dict[str, Any]) -> dict[str, Any]:
    mapping = {
        "minLength": "min_length",
        "maxLength": "max_length",
        "pattern": "pattern",
        "minimum": "ge",
        "maximum": "le",
        "exclusiveMinimum": "gt",
        "exclusiveMaximum": "lt",
        "minItems": "min_length",
        "maxItems": "max_length",
    }
    found = {target: schema[key] for key, target in mapping.items() if key in schema}
    # OpenAPI 3.0 writes exclusive bounds as booleans beside minimum/maximum.
    if found.get("gt") is True:
        found["gt"] = found.pop("ge")
    if found.get("lt") is True:
        found["lt"] = found.pop("le")
    return {k: v for k, v in found.items() if not isinstance(v, bool)}


def _annotated(base: Any, constraints: dict[str, Any]) -> Any:
    if not constraints:
        return base
    return Annotated[base, Field(**constraints)]


def _model(name: str, fields: dict[str, tuple[Any, Any]], *, forbid_extra: bool) -> type[BaseModel]:
    definitions: dict[str, Any] = {}
    for original, (annotation, default) in fields.items():
        python_name = _python_name(original, definitions)
        definitions[python_name] = (annotation, Field(default=default, alias=original))
    config = ConfigDict(extra="forbid" if forbid_extra else "allow", populate_by_name=False)
    return create_model(name, __config__=config, **definitions)


def _python_name(original: str, taken: dict[str, Any]) -> str:
    name = re.sub(r"\W", "_", original)
    if not name or name[0].isdigit() or keyword.iskeyword(name) or name.startswith("_"):
        name = f"f_{name.lstrip('_')}"
    if name.startswith("model_"):
        name = f"f_{name}"
    base, index = name, 1
    while name in taken:
        index += 1
        name = f"{base}_{index}"
    return name


def _class_name(where: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in re.split(r"\W+", where) if part)
