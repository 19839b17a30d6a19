"""OpenAPI operations → effects, verifiers and argument models (pure)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from pydantic import ValidationError

from orchestrator.errors import ValidationFailed
from orchestrator.tools.gateway import CallApi, CallApiArgs
from orchestrator.tools.openapi import parse_spec
from orchestrator.tools.spec_errors import SpecError
from tests.integration.fake_backend import SPEC

#: The path to createOrder's `quantity` schema, for `_spec`.
QUANTITY = "paths|/orders|post|requestBody|content|application/json|schema|properties|quantity"


def _spec(**changes: Any) -> dict[str, Any]:
    spec = copy.deepcopy(SPEC)
    for path, value in changes.items():
        node = spec
        *parents, last = path.split("|")
        for part in parents:
            node = node[part]
        node[last] = value
    return spec


def test_effects_come_from_x_effect_or_the_method() -> None:
    operations = parse_spec(SPEC).operations
    assert operations["getSetting"].effect == "read"
    assert operations["putSetting"].effect == "write"
    assert operations["putSetting"].verify_with == "getSetting"
    assert operations["getSecret"].effect == "sensitive_read"
    assert operations["createOrder"].effect == "write"


def test_arguments_are_coerced_defaulted_and_strict() -> None:
    model = parse_spec(SPEC).operations["createOrder"].model
    values = model.model_validate({"body": {"item": "pump", "quantity": "3"}})
    dumped = values.model_dump(mode="json", by_alias=True, exclude_none=True)
    assert dumped == {"body": {"item": "pump", "quantity": 3, "priority": "low"}}
    for bad in (
        {"body": {"item": "pump", "quantity": 0}},
        {"body": {"item": "pump", "quantity": 1, "priority": "urgent"}},
        {"body": {"item": "pump", "quantity": 1, "colour": "red"}},
        {"body": {"item": "pump"}},
        {},
        {"body": {"item": "pump", "quantity": 1}, "extra": 1},
    ):
        with pytest.raises(ValidationError):
            model.model_validate(bad)


def test_normalized_arguments_make_one_intent() -> None:
    tool = CallApi(parse_spec(SPEC), "http://127.0.0.1:1")
    one = tool.normalize(
        CallApiArgs(operation_id="createOrder", arguments={"body": {"quantity": "2", "item": "a"}})
    )
    two = tool.normalize(
        CallApiArgs(
            operation_id="createOrder",
            arguments={"body": {"item": "a", "quantity": 2, "priority": "low"}},
        )
    )
    assert one == two
    with pytest.raises(ValidationFailed, match="unknown operation_id"):
        tool.normalize(CallApiArgs(operation_id="nope"))
    with pytest.raises(ValidationFailed, match="quantity"):
        tool.normalize(CallApiArgs(operation_id="createOrder", arguments={"body": {"item": "a"}}))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"paths|/orders|post|x-verify-with": "getSetting"}, "only for a PUT"),
        ({"paths|/settings/{key}|put|x-verify-with": "nothing"}, "names no operation"),
        ({"paths|/settings/{key}|put|x-verify-with": "getSecret"}, "plain read"),
        ({"paths|/orders|post|x-effect": "delete"}, "x-effect"),
        ({"paths|/jobs|post|operationId": "getSetting"}, "used twice"),
        ({"openapi": "2.0"}, "OpenAPI 3"),
        # OpenAPI 3.0's boolean exclusive bound with no bound beside it (was a bare KeyError).
        (
            {QUANTITY: {"type": "integer", "exclusiveMinimum": True}},
            "exclusiveMinimum: true needs a minimum",
        ),
        (
            {QUANTITY: {"type": "integer", "exclusiveMaximum": True}},
            "exclusiveMaximum: true needs a maximum",
        ),
    ],
)
def test_specs_the_gateway_cannot_honour_are_refused(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse_spec(_spec(**changes))


def test_openapi_3_0_boolean_exclusive_bounds_still_bound() -> None:
    quantity = {"type": "integer", "minimum": 1, "exclusiveMinimum": True}
    operation = parse_spec(_spec(**{QUANTITY: quantity})).operations["createOrder"]
    model = operation.model
    with pytest.raises(ValidationError):
        model.model_validate({"body": {"item": "pump", "quantity": 1}})
    assert model.model_validate({"body": {"item": "pump", "quantity": 2}})


def test_sensitive_writes_are_never_verified() -> None:
    spec = _spec(**{"paths|/settings/{key}|put|x-sensitive": True})
    tool = CallApi(parse_spec(spec), "http://127.0.0.1:1")
    args = tool.normalize(
        CallApiArgs(operation_id="putSetting", arguments={"key": "k", "body": {"value": 1}})
    )
    assert tool.verify(None, args) is None  # type: ignore[arg-type]


def test_nan_is_refused_even_where_a_number_is_allowed() -> None:
    spec = _spec(**{"components|schemas|Setting|properties|value": {"type": "number"}})
    tool = CallApi(parse_spec(spec), "http://127.0.0.1:1")
    model = tool.spec.operations["putSetting"].model
    with pytest.raises(ValidationError):
        model.model_validate({"key": "k", "body": {"value": float("nan")}})
    with pytest.raises(ValidationFailed, match="canonical"):
        tool.normalize(
            CallApiArgs(
                operation_id="putSetting",
                arguments={"key": "k", "body": {"value": float("inf")}},
            )
        )


def _nullable_spec() -> dict[str, Any]:
    return _spec(
        **{
            "components|schemas|Setting|properties|value": {"type": "integer", "nullable": True},
            "components|schemas|Setting|properties|unit": {"type": "string", "nullable": True},
        }
    )


def _normalized(tool: CallApi, operation_id: str, **arguments: Any) -> dict[str, Any]:
    args = tool.normalize(CallApiArgs(operation_id=operation_id, arguments=arguments))
    return args.arguments


def test_explicit_nulls_are_kept_absent_values_stay_absent_defaults_are_filled() -> None:
    tool = CallApi(parse_spec(_nullable_spec()), "http://127.0.0.1:1")
    # A full replacement with {"value": null} is not the write {}.
    assert _normalized(tool, "putSetting", key="k", body={"value": None}) == {
        "key": "k",
        "body": {"value": None},
    }
    with_null = _normalized(tool, "putSetting", key="k", body={"value": 5, "unit": None})
    without = _normalized(tool, "putSetting", key="k", body={"value": 5})
    assert with_null == {"key": "k", "body": {"value": 5, "unit": None}}
    assert without == {"key": "k", "body": {"value": 5}}
    # Coercion and schema defaults still apply; a default is sent like a given value.
    assert _normalized(tool, "createOrder", body={"item": "a", "quantity": "2"}) == {
        "body": {"item": "a", "quantity": 2, "priority": "low"}
    }
    assert _normalized(tool, "bigReport") == {"size": 10}


def test_a_null_the_schema_does_not_allow_is_refused_not_dropped() -> None:
    tool = CallApi(parse_spec(SPEC), "http://127.0.0.1:1")  # unit: string, not nullable
    with pytest.raises(ValidationFailed, match=r"body\.unit"):
        _normalized(tool, "putSetting", key="k", body={"value": 5, "unit": None})
    with pytest.raises(ValidationFailed, match=r"body\.priority"):
        _normalized(tool, "createOrder", body={"item": "a", "quantity": 1, "priority": None})


def test_a_null_parameter_has_no_wire_form_and_is_left_out() -> None:
    tool = CallApi(parse_spec(SPEC), "http://127.0.0.1:1")
    assert _normalized(tool, "startJob", kind=None) == {}
    assert _normalized(tool, "startJob", kind=None) == _normalized(tool, "startJob")


def _header_spec() -> dict[str, Any]:
    return _spec(
        **{
            "paths|/orders|post|parameters": [
                {"name": "X-Note", "in": "header", "schema": {"type": "string"}}
            ]
        }
    )


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("done ✓", "Latin-1"),
        ("雪", "Latin-1"),
        ("a\r\nX-Injected: 1", "control characters"),
        ("a\x00b", "control characters"),
        (" padded", "start or end with spaces"),
    ],
)
def test_header_values_http_cannot_carry_are_invalid_arguments(value: str, message: str) -> None:
    tool = CallApi(parse_spec(_header_spec()), "http://127.0.0.1:1")
    with pytest.raises(ValidationFailed, match=message):
        _normalized(tool, "createOrder", body={"item": "a", "quantity": 1}, **{"X-Note": value})


def test_latin1_and_plain_header_values_pass() -> None:
    tool = CallApi(parse_spec(_header_spec()), "http://127.0.0.1:1")
    for value in ("café", "plain text\twith tab", ""):
        args = _normalized(
            tool, "createOrder", body={"item": "a", "quantity": 1}, **{"X-Note": value}
        )
        assert args["X-Note"] == value


def _null_default_spec() -> dict[str, Any]:
    return _spec(
        **{
            "paths|/jobs|post|parameters": [
                {"name": "kind", "in": "query", "schema": {"type": "string", "default": None}}
            ],
            f"{QUANTITY[: -len('quantity')]}note": {
                "type": "string",
                "nullable": True,
                "default": None,
            },
            "components|schemas|Setting|properties|value": {"type": "integer", "default": None},
        }
    )


def test_a_null_default_is_no_default_left_out_values_stay_out() -> None:
    tool = CallApi(parse_spec(_null_default_spec()), "http://127.0.0.1:1")
    # Left out stays out (the API's own default applies); an explicit null is kept as given.
    assert _normalized(tool, "createOrder", body={"item": "a", "quantity": 1}) == {
        "body": {"item": "a", "quantity": 1, "priority": "low"}
    }
    assert _normalized(tool, "createOrder", body={"item": "a", "quantity": 1, "note": None}) == {
        "body": {"item": "a", "quantity": 1, "priority": "low", "note": None}
    }
    # A parameter with `default: null` is like one without: null means "leave it out".
    assert _normalized(tool, "startJob", kind=None) == {} == _normalized(tool, "startJob")
    assert _normalized(tool, "startJob", kind="a") == {"kind": "a"}
    # A required value stays required: `default: null` does not make it optional.
    with pytest.raises(ValidationFailed, match=r"body\.value"):
        _normalized(tool, "putSetting", key="k", body={})
    # The schema the model is shown promises no default it would not get.
    schema = tool.spec.operations["createOrder"].arguments_schema()
    assert "default" not in schema["$defs"]["CreateOrderBody"]["properties"]["note"]


def _object(**properties: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties}


def _alike_spec() -> dict[str, Any]:
    """Objects whose paths read alike, in one operation and in two."""
    address = _object(street=_object(line=_object(text={"type": "string"})))
    body = _object(
        **{
            "ship-to": address,
            "shipTo": _object(zone={"type": "integer"}),
            "pick": {"oneOf": [_object(a={"type": "string"}), _object(b={"type": "integer"})]},
        }
    )
    content = {"application/json": {"schema": body}}
    return {
        "openapi": "3.0.3",
        "paths": {
            "/a": {"post": {"operationId": "sendParcel", "requestBody": {"content": content}}},
            "/b": {"post": {"operationId": "SendParcel", "requestBody": {"content": content}}},
        },
    }


@pytest.mark.parametrize("operation_id", ["sendParcel", "SendParcel"])
def test_objects_named_alike_get_readable_unique_schema_names(operation_id: str) -> None:
    operation = parse_spec(_alike_spec()).operations[operation_id]
    schema = operation.arguments_schema()
    text = json.dumps(schema)
    # No Python module path (pydantic's names for classes that share one).
    assert "orchestrator" not in text
    assert "__" not in text
    defs = schema["$defs"]
    body = defs["SendParcelBody"]["properties"]
    ship_to, ship_to_2 = body["ship-to"]["$ref"], body["shipTo"]["$ref"]
    assert (ship_to, ship_to_2) == ("#/$defs/SendParcelBodyShipTo", "#/$defs/SendParcelBodyShipTo2")
    assert set(defs["SendParcelBodyShipTo"]["properties"]) == {"street"}
    assert set(defs["SendParcelBodyShipTo2"]["properties"]) == {"zone"}
    options = [option["$ref"].rsplit("/", 1)[1] for option in body["pick"]["anyOf"]]
    assert options == ["SendParcelBodyPickOneOf0", "SendParcelBodyPickOneOf1"]
    assert "SendParcelBodyShipToStreetLine" in defs
    # The names are only names: both objects still validate as their own schema.
    values = operation.model.model_validate(
        {"body": {"ship-to": {"street": {"line": {"text": "x"}}}, "shipTo": {"zone": 2}}}
    )
    assert values.model_dump(by_alias=True, exclude_unset=True) == {
        "body": {"ship-to": {"street": {"line": {"text": "x"}}}, "shipTo": {"zone": 2}}
    }
    with pytest.raises(ValidationError):
        operation.model.model_validate({"body": {"shipTo": {"street": {}}}})
