"""Dependencies routes share: the services `create_app` put on the application state."""

from __future__ import annotations

from fastapi import Request

from orchestrator.events import PlanHub
from orchestrator.services.plans import PlanService
from orchestrator.services.sessions import SessionService
from orchestrator.store.db import Database

__all__ = ["get_db", "get_hub", "get_plans", "get_sessions"]


def get_db(request: Request) -> Database:
    db: Database = request.app.state.db
    return db


def get_plans(request: Request) -> PlanService:
    plans: PlanService = request.app.state.plans
    return plans


def get_sessions(request: Request) -> SessionService:
    sessions: SessionService = request.app.state.sessions
    return sessions


def get_hub(request: Request) -> PlanHub:
    hub: PlanHub = request.app.state.hub
    return hub
