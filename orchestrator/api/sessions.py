"""Sessions by purpose: ordinary chats are listed by default, task sessions only when asked."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints

from orchestrator.api.auth import caller_of, current_operator
from orchestrator.api.contract import FilledText, Page, error_responses
from orchestrator.api.deps import get_sessions
from orchestrator.api.enums import SessionPurpose
from orchestrator.api.models import SessionView
from orchestrator.domain.storable import Name, storable_text
from orchestrator.operators import Operator
from orchestrator.services.sessions import MAX_LIMIT, SessionService

__all__ = ["CreateSession", "readable_session", "router"]

router = APIRouter(prefix="/api/v1/sessions", tags=["sessions"])


#: An optional text with its limit before the check (`FilledText`).
_TaskId = Annotated[str, StringConstraints(max_length=36), AfterValidator(storable_text)]


class CreateSession(BaseModel):
    """Body of `POST /api/v1/sessions`."""

    model_config = ConfigDict(extra="forbid")

    purpose: SessionPurpose
    # Refused up front, naming the field, when no store keeps it (a NUL character).
    title: FilledText = Field(min_length=1, max_length=200)
    task_id: _TaskId | None = None
    # A person, named as who acted is (`Name`): the account that makes it, or whom the token names.
    owner: Name | None = Field(
        default=None,
        description="whose session: an account's own name whatever this says; the shared "
        "API token may name anyone (default: the caller's account)",
    )


@router.post("", status_code=201, response_model=SessionView, responses=error_responses(404, 409))
def create_session(
    body: CreateSession,
    service: SessionService = Depends(get_sessions),
    operator: Operator = Depends(current_operator),
) -> dict[str, Any]:
    # As a decision's `by`: a named account owns what it makes; the shared token speaks for others.
    owner = (body.owner or operator.name) if operator.shared else operator.name
    record = service.create_session(
        purpose=str(body.purpose), title=body.title, owner=owner, task_id=body.task_id
    )
    return record.to_dict()


@router.get("", response_model=Page[SessionView])
def list_sessions(
    purpose: SessionPurpose | None = None,
    task_id: str | None = Query(default=None, max_length=36),
    limit: int = Query(default=50, ge=1, le=MAX_LIMIT),
    cursor: str | None = Query(default=None, max_length=512),
    service: SessionService = Depends(get_sessions),
    operator: Operator = Depends(current_operator),
) -> dict[str, Any]:
    """Newest first; only `ordinary_chat` unless `purpose` or `task_id` asks for others. A
    named account sees its own chats and collaborations (and every task's execution sessions);
    the shared token sees all."""
    page = service.list_sessions(
        purpose=str(purpose) if purpose else None,
        task_id=task_id,
        limit=limit,
        cursor=cursor,
        owner=caller_of(operator),
    )
    return {
        "items": [record.to_dict() for record in page.items],
        "next_cursor": page.next_cursor,
    }


def readable_session(
    session_id: str,
    service: SessionService = Depends(get_sessions),
    operator: Operator = Depends(current_operator),
) -> str:
    """A route dependency for what a session holds (its plans, their stream): the session's
    id, or `403 not_session_owner` for another person's chat or collaboration, as the session
    itself is (404 for no session)."""
    service.get_session(session_id, caller=caller_of(operator))
    return session_id


@router.get("/{session_id}", response_model=SessionView, responses=error_responses(403, 404))
def get_session(
    session_id: str,
    service: SessionService = Depends(get_sessions),
    operator: Operator = Depends(current_operator),
) -> dict[str, Any]:
    """One session; another person's chat or collaboration is `403 not_session_owner` for a
    named account (a task's execution session is the task's)."""
    return service.get_session(session_id, caller=caller_of(operator)).to_dict()


class DeletedSession(BaseModel):
    session_id: str
    receipts_deleted: int = Field(
        description="finished receipts that went with the session; running and unknown ones "
        "stay, as orphans, for a recovery to verify"
    )


@router.delete(
    "/{session_id}", response_model=DeletedSession, responses=error_responses(403, 404, 409)
)
def delete_session(
    session_id: str,
    service: SessionService = Depends(get_sessions),
    operator: Operator = Depends(current_operator),
) -> dict[str, Any]:
    """Delete a chat or a collaboration session with its plans, messages and finished receipts
    (a named account its own; `409 execution_session` for a task's execution session). Its
    plan stream ends within a keep-alive."""
    deleted = service.delete_session(session_id, caller=caller_of(operator))
    return {"session_id": session_id, "receipts_deleted": deleted}
