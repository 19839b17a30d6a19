"""Operators' view of write receipts: `GET /api/v1/invocations/{invocation_id}`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends

from orchestrator.api.contract import error_responses
from orchestrator.api.deps import get_db
from orchestrator.errors import NotFound
from orchestrator.store.db import Database
from orchestrator.store.receipts import ReceiptLedger

__all__ = ["router"]

router = APIRouter(prefix="/api/v1/invocations", tags=["invocations"])


@router.get("/{invocation_id}", responses=error_responses(404))
def get_invocation(invocation_id: str, db: Database = Depends(get_db)) -> dict[str, Any]:
    """The latest observed status of one receipt: never its arguments, token or output."""
    receipt = ReceiptLedger(db).get(invocation_id)
    if receipt is None:
        raise NotFound(f"no invocation {invocation_id}")
    return receipt.public()
