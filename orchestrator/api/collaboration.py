"""Collaboration sessions over HTTP: open a task's session, ask, page the questions and answers.

`POST /api/v1/tasks/{task_id}/collaboration` opens (or returns) the caller's session about the
task; a session is read and asked in by its owner only (a shared account speaks for anyone);
`POST /api/v1/sessions/{session_id}/messages` asks (idempotent with an `Idempotency-Key`
header); `GET` on the same path pages the messages.
"""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Depends, Header, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from orchestrator.api.auth import caller_of, current_operator
from orchestrator.api.contract import FilledText, IsoTime, Page, error_responses
from orchestrator.operators import Operator
from orchestrator.services.collaboration import MAX_LIMIT, CollaborationService
from orchestrator.store.collaboration import MessageRecord
from orchestrator.store.sessions import SessionRecord

__all__ = ["MessageOut", "router"]

router = APIRouter(tags=["collaboration"])


def get_collaboration(request: Request) -> CollaborationService:
    service: CollaborationService | None = getattr(request.app.state, "collaboration", None)
    if service is None:
        service = CollaborationService(request.app.state.db, request.app.state.settings)
        request.app.state.collaboration = service
    return service


class CollaborationSessionOut(BaseModel):
    session_id: str
    purpose: Literal["task_collaboration"]
    task_id: str
    owner: str
    title: str
    created_at: IsoTime
    created: bool = Field(description="False when the task's session already existed")

    @classmethod
    def of(cls, record: SessionRecord, created: bool) -> CollaborationSessionOut:
        assert record.task_id is not None
        return cls(
            session_id=record.session_id,
            purpose="task_collaboration",
            task_id=record.task_id,
            owner=record.owner,
            title=record.title,
            created_at=record.created_at,
            created=created,
        )


class MessageOut(BaseModel):
    message_id: str
    session_id: str
    role: Literal["user", "agent"]
    text: str
    created_at: IsoTime

    @classmethod
    def of(cls, record: MessageRecord) -> MessageOut:
        return cls(
            message_id=record.message_id,
            session_id=record.session_id,
            role="user" if record.role == "user" else "agent",
            text=record.text,
            created_at=record.created_at,
        )


class AskBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: FilledText = Field(min_length=1, max_length=4000, description="the question")


class AnswerOut(BaseModel):
    question: MessageOut
    answer: MessageOut


@router.post(
    "/api/v1/tasks/{task_id}/collaboration",
    response_model=CollaborationSessionOut,
    responses={201: {"model": CollaborationSessionOut}, **error_responses(401, 403, 404)},
)
def open_collaboration(
    task_id: str,
    response: Response,
    service: CollaborationService = Depends(get_collaboration),
    operator: Operator = Depends(current_operator),
) -> CollaborationSessionOut:
    """Open the caller's collaboration session about the task (201), or return it (200)."""
    record, created = service.open(task_id, owner=operator.name)
    response.status_code = 201 if created else 200
    return CollaborationSessionOut.of(record, created)


@router.post(
    "/api/v1/sessions/{session_id}/messages",
    status_code=201,
    response_model=AnswerOut,
    responses={200: {"model": AnswerOut}, **error_responses(401, 403, 404, 409, 422, 502)},
)
def ask(
    session_id: str,
    body: AskBody,
    response: Response,
    idempotency_key: str | None = Header(
        default=None,
        alias="Idempotency-Key",
        description="1-200 visible ASCII characters: a retry with the same key and question "
        "returns the first answer (200) without asking again; another question is 409 "
        "`idempotency_conflict`",
    ),
    service: CollaborationService = Depends(get_collaboration),
    operator: Operator = Depends(current_operator),
) -> AnswerOut:
    """Ask a question; the agent answers from the task's plan, report and evidence only (201).
    A retry with the same `Idempotency-Key` returns the stored answer (200). Another person's
    session is 403 `not_session_owner`."""
    answered = service.ask(
        session_id, body.text, caller=caller_of(operator), idempotency_key=idempotency_key
    )
    if answered.replayed:
        response.status_code = 200
    return AnswerOut(
        question=MessageOut.of(answered.question), answer=MessageOut.of(answered.answer)
    )


@router.get(
    "/api/v1/sessions/{session_id}/messages",
    response_model=Page[MessageOut],
    responses=error_responses(401, 403, 404, 409, 422),
)
def list_messages(
    session_id: str,
    cursor: str | None = Query(default=None, max_length=512),
    limit: int = Query(default=50, ge=1, le=MAX_LIMIT),
    service: CollaborationService = Depends(get_collaboration),
    operator: Operator = Depends(current_operator),
) -> Page[MessageOut]:
    """The session's questions and answers, oldest first; its owner's only (403
    `not_session_owner` for another person)."""
    page, next_cursor = service.messages(
        session_id, caller=caller_of(operator), cursor=cursor, limit=limit
    )
    return Page[MessageOut](items=[MessageOut.of(m) for m in page], next_cursor=next_cursor)
