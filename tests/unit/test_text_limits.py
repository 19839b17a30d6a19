"""A text field's length limit is said in characters, on every request body the API takes
(and so on the CLI's options, which the same models check).

An optional `FilledText` with `max_length` on its field (`by: FilledText | None =
Field(max_length=200)`) was measured after the validator, around the union, in pydantic's words
for a list: `--by` of 201 characters read "Value should have at most 200 items after
validation, not 201", in the CLI's line and in the API's 422.
"""

from __future__ import annotations

from typing import Any, get_args

from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError

from orchestrator.api.app import INTERNAL_ROUTERS, PUBLIC_ROUTERS


def _bodies() -> set[type[BaseModel]]:
    found: set[type[BaseModel]] = set()
    for route in (
        route for router in (*PUBLIC_ROUTERS, *INTERNAL_ROUTERS) for route in router.routes
    ):
        if isinstance(route, APIRoute) and route.body_field is not None:
            annotation = route.body_field.field_info.annotation
            for model in (annotation, *get_args(annotation)):  # a body that may be left out
                if isinstance(model, type) and issubclass(model, BaseModel):
                    found.add(model)
    return found


def _max_length(schema: dict[str, Any]) -> int | None:
    """A text field's maxLength, given on it or on the text side of its `| None`."""
    for side in [schema, *schema.get("anyOf", [])]:
        if side.get("type") == "string" and "maxLength" in side:
            return int(side["maxLength"])
    return None


def test_a_text_over_its_limit_is_said_too_long_in_characters() -> None:
    checked, wrong = [], []
    for model in sorted(_bodies(), key=lambda m: m.__name__):
        properties = model.model_json_schema()["properties"]
        for name, schema in properties.items():
            limit = _max_length(schema)
            if limit is None:
                continue
            try:
                model.model_validate({name: "x" * (limit + 1)})
            except ValidationError as exc:
                said = [e["msg"] for e in exc.errors() if e["loc"] == (name,)]
            else:
                said = []
            checked.append(f"{model.__name__}.{name}")
            if said != [f"String should have at most {limit} characters"]:
                wrong.append(f"{model.__name__}.{name}: {said}")
    assert not wrong, "\n".join(wrong)
    # The walk reaches the bodies whose `by` is optional (a requeue's, a decision's, a step's).
    shown = {"RequeueBody.by", "CancelBody.by", "Decision.by", "CloseBody.by", "RetryBody.by"}
    assert shown <= set(checked)


def test_who_acted_has_one_limit_on_every_body_and_fits_every_column_that_keeps_it() -> None:
    """A requeue's, a cancel's and a delivery's retry or discard took a `by` of 200 characters,
    a decision, a step and a resolution one of 128: a name one command recorded, the next
    refused. Every body's `by` is now `Name`: 1 to NAME_MAX characters, as an account's."""
    from sqlalchemy import String

    from orchestrator.domain.storable import NAME_MAX
    from orchestrator.store.tables import (
        actions,
        console_account_signouts,
        console_signouts,
        outbox,
    )

    limits = {}
    for model in _bodies():
        schema = model.model_json_schema()["properties"].get("by")
        if schema is not None:
            [text] = [s for s in schema.get("anyOf", [schema]) if s.get("type") == "string"]
            limits[model.__name__] = (text.get("minLength"), text.get("maxLength"))
    assert {"RequeueBody", "CancelBody", "Decision", "CompleteBody", "CloseBody"} <= set(limits)
    assert {"ResolveBody", "RetryBody", "RetryDeadBody", "DiscardBody"} <= set(limits)
    assert {name: limit for name, limit in limits.items() if limit != (1, NAME_MAX)} == {}
    keeping = [
        actions.c.decided_by,
        outbox.c.retried_by,
        outbox.c.discarded_by,
        console_signouts.c.account,  # a console operator's `by` is their account
        console_account_signouts.c.account,
    ]
    narrow = [
        str(column)
        for column in keeping
        if not isinstance(column.type, String) or (column.type.length or 0) < NAME_MAX
    ]
    assert narrow == []


def test_a_session_s_owner_is_a_name_with_the_limit_of_one() -> None:
    """A session belongs to a person (the account that made it, or whom the shared token
    names: who acted, as a `by`) or to a task (`task:<id>`): its owner is 1 to NAME_MAX
    characters in the API's body and in the service's check, and its column keeps that."""
    from sqlalchemy import String

    from orchestrator.api.sessions import CreateSession
    from orchestrator.domain.storable import NAME_MAX
    from orchestrator.services import sessions as service
    from orchestrator.store.tables import ID, sessions

    [text] = [
        s
        for s in CreateSession.model_json_schema()["properties"]["owner"]["anyOf"]
        if s.get("type") == "string"
    ]
    assert (text["minLength"], text["maxLength"]) == (1, NAME_MAX)
    assert service.MAX_OWNER == NAME_MAX
    assert isinstance(sessions.c.owner.type, String)
    assert (sessions.c.owner.type.length or 0) >= NAME_MAX
    assert len(f"task:{'t' * ID}") <= NAME_MAX  # an execution's session


def test_the_console_s_by_field_takes_a_name_of_the_limit() -> None:
    """The console's `by` input (every form's, `account.js byField`) stops at NAME_MAX, the
    limit the API puts on it, said once in the console: `account.js`'s NAME_MAX."""
    import re
    from pathlib import Path

    from orchestrator.domain.storable import NAME_MAX

    console = Path(__file__).resolve().parents[2] / "orchestrator" / "console"
    account = (console / "account.js").read_text(encoding="utf-8")
    said = re.findall(r"^export const NAME_MAX = (\d+);", account, re.MULTILINE)
    assert said == [str(NAME_MAX)]
    by_inputs = [
        line
        for path in sorted(console.glob("*.js"))
        for line in path.read_text(encoding="utf-8").splitlines()
        if 'name: "by"' in line and "maxlength" in line
    ]
    assert by_inputs, "no `by` input with a maxlength found in the console"
    assert [line for line in by_inputs if "maxlength: NAME_MAX" not in line] == []
