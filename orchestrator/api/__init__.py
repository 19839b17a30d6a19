"""The HTTP API (FastAPI): one module per resource, assembled by `create_app`."""

from __future__ import annotations

from orchestrator.api.app import create_app

__all__ = ["create_app"]
