"""The HTTP API (FastAPI): one module per resource, assembled by `create_app`.

`create_app` is imported when first named, not with the package: a CLI command that shares one
of its pydantic-only modules (`older_shapes`) imports that module, not FastAPI and every route.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["create_app"]

if TYPE_CHECKING:
    from orchestrator.api.app import create_app


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from orchestrator.api.app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
