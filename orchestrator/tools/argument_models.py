"""An operation's JSON schemas → the pydantic model of its arguments.

Each operation's arguments (path, query and header parameters by name, the JSON request body
under `body`) become a pydantic model, so defaults are filled and types coerced before the
fingerprint is taken and before anything is sent. Unknown fields are refused. What the caller
gave is kept as given after that: an explicit `null` where the schema allows one is sent as
`null` (a full replacement with `{"value": null}` is not the same write as `{}`), an absent
optional value stays absent, and a schema default is filled in.

A schema `default: null` is no default: a value left out stays out of the request. The
document's `default` says what the business API assumes when a value is not sent, so leaving it
out already asks for null; filling in null would send a null the schema may not even allow, and
would make "left out" and "explicitly null" one intent where a full replacement tells them apart.
A required value with `default: null` stays required.

Each object in a schema becomes a class named after its JSON path in the operation
(`createOrder.body.address` → `CreateOrderBodyAddress`); where two paths read alike
(`x-y` and `xY`, or the options of a `oneOf`) the later one gets a number, so the `$defs` of the
schema the model is shown never fall back to pydantic's module-path names.

A schema the model cannot be built from raises `SpecError` naming where it is.
"""

from __future__ import annotations

import copy
import keyword
import re
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, create_model, model_validator

from orchestrator.tools.spec_errors import SpecError, as_list, as_mapping, kind_of

__all__ = ["ModelNames", "arguments_model", "deref", "dump_arguments", "field_definition"]

_MAX_DEPTH = 12


class ModelNames:
    """The class names taken in one operation's argument models (one schema shown to the model).

    pydantic names a `$defs` entry after its class and, when two classes share a name, after
    their module (`orchestrator__tools__...__Name__1`): a Python path in what the model reads.
    Names from here are readable and unique within the operation.
    """

    def __init__(self) -> None:
        self._taken: set[str] = set()

    def claim(self, where: str) -> str:
        """A class name for the object at JSON path `where`, not yet taken in this operation."""
        base = _class_name(where) or "Arguments"
        name, index = base, 1
        while name in self._taken:
            index += 1
            name = f"{base}{index}"
        self._taken.add(name)
        return name


def _names(value: Any, where: str) -> list[str]:
    names = as_list(value, where)
    if not all(isinstance(name, str) for name in names):
        raise SpecError(f"{where} must list property names (strings)")
    return names


def deref(
    value: Any, components: dict[str, Any], where: str, seen: tuple[str, ...] = ()
) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise SpecError(f"{where}: expected an object in the spec, not {kind_of(value)}")
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
    return deref(components[ref[len(prefix) :]], components, where, (*seen, ref))


def field_definition(
    schema: Any,
    required: bool,
    components: dict[str, Any],
    where: str,
    depth: int,
    *,
    names: ModelNames,
    null_is_absent: bool = False,
) -> tuple[Any, Any]:
    """The (annotation, default) of one argument; the default `...` when it is required."""
    annotation = _type(schema, components, where, depth, names)
    schema = deref(schema, components, where)
    # `default: null` is no default (see the module docstring): the value stays out when left out.
    default = schema.get("default")
    if default is not None:
        try:
            TypeAdapter(annotation).validate_python(copy.deepcopy(default))
        except Exception:
            raise SpecError(f"{where}: the default {default!r} does not fit the schema") from None
        return (annotation, default)
    if required:
        return (annotation, ...)
    if null_is_absent:
        return (annotation | None, _ABSENT)
    # An optional value left out stays out (it is not "set"); null only where the schema
    # allows it (nullable), and then it is sent as null.
    return (annotation, _ABSENT)


#: The default of an optional value without a schema default (or with `default: null`). It is
#: never filled in (see `_Arguments`), so an absent value is not "set" and `dump_arguments`
#: leaves it out. `field_definition` never returns None as a schema default, so this marker
#: cannot be mistaken for one.
_ABSENT = None


def _type(
    schema: Any, components: dict[str, Any], where: str, depth: int, names: ModelNames
) -> Any:
    if depth > _MAX_DEPTH:
        return Any
    schema = deref(schema, components, where)
    result = _base_type(schema, components, where, depth, names)
    if schema.get("nullable"):
        result = result | None
    return result


def _base_type(
    schema: dict[str, Any], components: dict[str, Any], where: str, depth: int, names: ModelNames
) -> Any:
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
            # Each option has its own path, so an error and a generated class name say which.
            options = [
                _type(s, components, f"{where}.{combinator}[{index}]", depth + 1, names)
                for index, s in enumerate(as_list(schema[combinator], f"{where}.{combinator}"))
            ]
            if not options:
                raise SpecError(f"{where}: {combinator} must not be empty")
            return Union[tuple(options)]  # noqa: UP007 - built from a runtime list
    if "allOf" in schema:
        merged: dict[str, Any] = {"type": "object", "properties": {}, "required": []}
        for part in as_list(schema["allOf"], f"{where}.allOf"):
            part = deref(part, components, where)
            merged["properties"].update(
                as_mapping(part.get("properties", {}), f"{where}.allOf.properties")
            )
            merged["required"].extend(_names(part.get("required", []), f"{where}.allOf.required"))
            if part.get("additionalProperties"):
                merged["additionalProperties"] = True
        return _base_type(merged, components, where, depth, names)
    kind = schema.get("type")
    if isinstance(kind, list):
        non_null = [k for k in kind if k != "null"]
        inner = _base_type(
            {**schema, "type": non_null[0] if non_null else None}, components, where, depth, names
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
        item = _type(schema.get("items", {}), components, f"{where}[]", depth + 1, names)
        return _annotated(list[item], constraints)  # type: ignore[valid-type]
    if kind == "object" or "properties" in schema:
        properties = as_mapping(schema.get("properties") or {}, f"{where}.properties")
        if not properties:
            return dict[str, Any]
        required = set(_names(schema.get("required", []), f"{where}.required"))
        fields = {
            name: field_definition(
                sub, name in required, components, f"{where}.{name}", depth + 1, names=names
            )
            for name, sub in properties.items()
        }
        extra = schema.get("additionalProperties", False)
        return arguments_model(where, fields, forbid_extra=not extra, names=names)
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
    for exclusive, bound, key, inclusive in (
        ("exclusiveMinimum", "minimum", "gt", "ge"),
        ("exclusiveMaximum", "maximum", "lt", "le"),
    ):
        if found.get(key) is True:
            if inclusive not in found:
                raise SpecError(f"{where}: {exclusive}: true needs a {bound} beside it")
            found[key] = found.pop(inclusive)
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
            raise SpecError(f"{where}: {key} must be a number, not {kind_of(value)}")
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


def arguments_model(
    where: str, fields: dict[str, Any], *, forbid_extra: bool, names: ModelNames
) -> type[BaseModel]:
    """The model of the object at JSON path `where`, named by `names` (unique in the operation)."""
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
        return create_model(names.claim(where), __base__=base, **definitions)
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
