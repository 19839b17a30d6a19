"""`SpecError`, the one error of a gateway document that cannot be used, and the shape checks
that raise it.

Reading the document into operations (`orchestrator.tools.openapi`) and building argument models
from its schemas (`orchestrator.tools.argument_models`) check shapes alike and fail alike, so the
error and the checks sit below both.
"""

from __future__ import annotations

from typing import Any

from orchestrator.errors import OrchestratorError

__all__ = ["SpecError", "as_list", "as_mapping", "kind_of"]


class SpecError(OrchestratorError, ValueError):
    """The gateway's OpenAPI document cannot be used. The message is one line; from
    `load_spec` and `gateway_tools` it starts with `ORCH_GATEWAY_SPEC (<path>):`."""

    code = "gateway_spec_invalid"

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))


def kind_of(value: Any) -> str:
    names = {dict: "a mapping", list: "a list", str: "a string", type(None): "empty"}
    return names.get(type(value), f"a {type(value).__name__}")


def as_mapping(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise SpecError(f"{where} must be a mapping, not {kind_of(value)}")
    return value


def as_list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise SpecError(f"{where} must be a list, not {kind_of(value)}")
    return value
