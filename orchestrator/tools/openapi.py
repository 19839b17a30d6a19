"""The business backend's OpenAPI 3 document → operations with effects and argument models.

Each operation's arguments (path, query and header parameters by name, the JSON request body
under `body`) become a pydantic model, so defaults are filled and types coerced before the
fingerprint is taken and before anything is sent. Unknown fields are refused. What the caller
gave is kept as given after that: an explicit `null` where the schema allows one is sent as
`null` (a full replacement with `{"value": null}` is not the same write as `{}`), an absent
optional value stays absent, and a schema default is filled in.

Every document the gateway cannot use raises `SpecError` with one line that says what is wrong.
"""

from __future__ import annotations

import copy
import json
import keyword
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, create_model, model_validator

from orchestrator.errors import OrchestratorError
from orchestrator.tools.base import Effect

__all__ = [
    "SPEC_SETTING",
    "ApiSpec",
    "Operation",
    "Parameter",
    "SpecError",
    "load_spec",
    "parse_spec",
]

#: The setting that names the document; every `SpecError` from `load_spec` starts with it.
SPEC_SETTING = "ORCH_GATEWAY_SPEC"

_METHODS = ("get", "put", "post", "delete", "patch", "head", "options")
_EFFECTS: tuple[Effect, ...] = ("read", "write", "sensitive_read")
_MAX_DEPTH = 12
_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")  # an HTTP field name (RFC 9110 token)
_TEMPLATE = re.compile(r"\{([^{}]*)\}")


class SpecError(OrchestratorError, ValueError):
    """The gateway's OpenAPI document cannot be used. The message is one line; from
    `load_spec` and `gateway_tools` it starts with `ORCH_GATEWAY_SPEC (<path>):`."""

    code = "gateway_spec_invalid"

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))


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
            f"the document must be a mapping (an OpenAPI 3 object), not {_kind(document)}"
        )
    if not str(document.get("openapi", "")).startswith("3"):
        raise SpecError("the gateway spec must be an OpenAPI 3 document ('openapi: 3.x')")
    info = _mapping(document.get("info", {}), "info")
    components = _mapping(
        _mapping(document.get("components", {}), "components").get("schemas", {}),
        "components.schemas",
    )
    paths = document.get("paths")
    if paths is None:
        raise SpecError("the document has no 'paths', so no operations")
    paths = _mapping(paths, "paths")
    operations: dict[str, Operation] = {}
    for path, item in paths.items():
        if not isinstance(path, str) or not path.startswith("/"):
            raise SpecError(f"paths: {path!r} is not a path starting with '/'")
        item = _mapping(item, f"paths.{path}")
        shared = _list(item.get("parameters", []), f"paths.{path}.parameters")
        for method in _METHODS:
            raw = item.get(method)
            if raw is None:
                continue
            raw = _mapping(raw, f"{method.upper()} {path}")
            operation = _operation(path, method, raw, shared, components)
            if operation.operation_id in operations:
                raise SpecError(f"operationId {operation.operation_id!r} is used twice")
            operations[operation.operation_id] = operation
    if not operations:
        raise SpecError("the document defines no operations under 'paths'")
    for operation in operations.values():
        _check_verifier(operation, operations)
    servers: list[str] = []
    for index, server in enumerate(_list(document.get("servers", []), "servers")):
        server = _mapping(server, f"servers[{index}]")
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
    own = _list(raw.get("parameters", []), f"{operation_id}.parameters")
    by_key: dict[tuple[str, str], dict[str, Any]] = {}
    for parameter in [*shared, *own]:
        parameter = _deref(parameter, components, f"{operation_id}.parameters")
        name, location = parameter.get("name"), parameter.get("in")
        if not isinstance(name, str) or not name or not isinstance(location, str):
            raise SpecError(f"{operation_id}: every parameter needs a string 'name' and 'in'")
        by_key[(location, name)] = parameter
    parameters: list[Parameter] = []
    fields: dict[str, Any] = {}
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
        fields[name] = _field(
            schema, required, components, f"{operation_id}.{name}", 0, null_is_absent=True
        )
    _check_template(operation_id, path, parameters)
    has_body = False
    body = raw.get("requestBody")
    if body is not None:
        body = _deref(body, components, f"{operation_id}.requestBody")
        content = _mapping(body.get("content", {}), f"{operation_id}.requestBody.content")
        media = content.get("application/json")
        if media is None:
            raise SpecError(f"{operation_id}: only application/json request bodies are supported")
        media = _mapping(media, f"{operation_id}.requestBody.content.application/json")
        has_body = True
        fields["body"] = _field(
            media.get("schema", {}),
            bool(body.get("required")),
            components,
            f"{operation_id}.body",
            0,
        )
    model = _model(operation_id, fields, forbid_extra=True)
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


def _kind(value: Any) -> str:
    names = {dict: "a mapping", list: "a list", str: "a string", type(None): "empty"}
    return names.get(type(value), f"a {type(value).__name__}")


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise SpecError(f"{where} must be a mapping, not {_kind(value)}")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise SpecError(f"{where} must be a list, not {_kind(value)}")
    return value


def _names(value: Any, where: str) -> list[str]:
    names = _list(value, where)
    if not all(isinstance(name, str) for name in names):
        raise SpecError(f"{where} must list property names (strings)")
    return names


def _deref(
    value: Any, components: dict[str, Any], where: str, seen: tuple[str, ...] = ()
) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise SpecError(f"{where}: expected an object in the spec, not {_kind(value)}")
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
    if ref in seen:
        raise SpecError(f"{where}: $ref {ref!r} refers to itself")
    return _deref(components[ref[len(prefix) :]], components, where, (*seen, ref))


def _field(
    schema: Any,
    required: bool,
    components: dict[str, Any],
    where: str,
    depth: int,
    *,
    null_is_absent: bool = False,
) -> tuple[Any, Any]:
    annotation = _type(schema, components, where, depth)
    schema = _deref(schema, components, where)
    if "default" in schema:
        default = schema["default"]
        if default is not None:
            try:
                TypeAdapter(annotation).validate_python(copy.deepcopy(default))
            except Exception:
                raise SpecError(
                    f"{where}: the default {default!r} does not fit the schema"
                ) from None
        return (annotation, default)
    if required:
        return (annotation, ...)
    if null_is_absent:
        return (annotation | None, _ABSENT)
    # An optional value left out stays out (it is not "set"); null only where the schema
    # allows it (nullable), and then it is sent as null.
    return (annotation, _ABSENT)


#: The default of an optional value without a schema default. It is never filled in (see
#: `_Arguments`), so an absent value is not "set" and `dump_arguments` leaves it out.
_ABSENT = None


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
        values = schema["enum"]
        if not isinstance(values, list) or not values:
            raise SpecError(f"{where}: enum must be a non-empty list")
        try:
            return Literal[tuple(values)]
        except TypeError:
            raise SpecError(f"{where}: enum values must be plain values") from None
    for combinator in ("oneOf", "anyOf"):
        if combinator in schema:
            options = [
                _type(s, components, where, depth + 1)
                for s in _list(schema[combinator], f"{where}.{combinator}")
            ]
            if not options:
                raise SpecError(f"{where}: {combinator} must not be empty")
            return Union[tuple(options)]  # noqa: UP007 - built from a runtime list
    if "allOf" in schema:
        merged: dict[str, Any] = {"type": "object", "properties": {}, "required": []}
        for part in _list(schema["allOf"], f"{where}.allOf"):
            part = _deref(part, components, where)
            merged["properties"].update(
                _mapping(part.get("properties", {}), f"{where}.allOf.properties")
            )
            merged["required"].extend(_names(part.get("required", []), f"{where}.allOf.required"))
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
    if kind is not None and kind not in (
        "string",
        "integer",
        "number",
        "boolean",
        "array",
        "object",
        "null",
    ):
        raise SpecError(f"{where}: unknown type {kind!r}")
    constraints = _constraints(schema, where)
    if kind == "string":
        return _annotated(str, constraints)
    if kind == "integer":
        return _annotated(int, constraints)
    if kind == "number":
        # NaN and infinity have no JSON form; pydantic would quietly dump them as null.
        return _annotated(float, {"allow_inf_nan": False, **constraints})
    if kind == "boolean":
        return bool
    if kind == "null":
        return None
    if kind == "array":
        item = _type(schema.get("items", {}), components, f"{where}[]", depth + 1)
        return _annotated(list[item], constraints)  # type: ignore[valid-type]
    if kind == "object" or "properties" in schema:
        properties = _mapping(schema.get("properties") or {}, f"{where}.properties")
        if not properties:
            return dict[str, Any]
        required = set(_names(schema.get("required", []), f"{where}.required"))
        fields = {
            name: _field(sub, name in required, components, f"{where}.{name}", depth + 1)
            for name, sub in properties.items()
        }
        extra = schema.get("additionalProperties", False)
        return _model(where, fields, forbid_extra=not extra)
    return Any


def _constraints(schema: dict[str, Any], where: str) -> dict[str, Any]:
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
    found = {k: v for k, v in found.items() if not isinstance(v, bool)}
    for key, value in found.items():
        if key == "pattern":
            if not isinstance(value, str):
                raise SpecError(f"{where}: pattern must be a string")
            try:
                re.compile(value)
            except re.error as exc:
                raise SpecError(
                    f"{where}: pattern {value!r} is not a regular expression: {exc}"
                ) from None
        elif key in ("min_length", "max_length"):
            if not isinstance(value, int) or value < 0:
                raise SpecError(f"{where}: {key} must be a non-negative integer, not {value!r}")
        elif not isinstance(value, int | float):
            raise SpecError(f"{where}: {key} must be a number, not {_kind(value)}")
    return found


def _annotated(base: Any, constraints: dict[str, Any]) -> Any:
    if not constraints:
        return base
    return Annotated[base, Field(**constraints)]


class _Arguments(BaseModel):
    """Strict arguments: unknown fields refused; schema defaults count as given."""

    model_config = ConfigDict(extra="forbid", populate_by_name=False)

    @model_validator(mode="before")
    @classmethod
    def _fill_defaults(cls, data: Any) -> Any:
        # A schema default is filled into the input, so it is validated like a given value and
        # the dump of what was set (`exclude_unset`) carries it.
        if not isinstance(data, dict):
            return data
        filled = dict(data)
        for name, info in cls.model_fields.items():
            key = info.alias or name
            if key not in filled and not info.is_required() and info.default is not _ABSENT:
                filled[key] = copy.deepcopy(info.default)
        return filled


class _OpenArguments(_Arguments):
    model_config = ConfigDict(extra="allow")


def _no_default(schema: dict[str, Any]) -> None:
    schema.pop("default", None)


def _model(where: str, fields: dict[str, Any], *, forbid_extra: bool) -> type[BaseModel]:
    definitions: dict[str, Any] = {}
    for original, (annotation, default) in fields.items():
        python_name = _python_name(original, definitions)
        if default is _ABSENT:
            spec = Field(default=_ABSENT, alias=original, json_schema_extra=_no_default)
        else:
            spec = Field(default=default, alias=original)
        definitions[python_name] = (annotation, spec)
    base = _Arguments if forbid_extra else _OpenArguments
    try:
        return create_model(_class_name(where), __base__=base, **definitions)
    except Exception as exc:  # pydantic refused a constraint or type built from the schema
        problem = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise SpecError(f"{where}: the schema cannot be used: {problem}") from None


def dump_arguments(values: BaseModel) -> dict[str, Any]:
    """What the caller gave after validation: set values (explicit nulls kept) and defaults."""
    return values.model_dump(mode="json", by_alias=True, exclude_unset=True)


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
