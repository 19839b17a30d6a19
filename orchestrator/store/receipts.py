"""The invocation receipt ledger: claim before a side effect, finish with the claim token.

A receipt never holds raw arguments or output: only the owner, session, tool name, an identity
key, the SHA-256 of the canonical arguments, a claim token, a status and a fixed host summary.
Claims are `INSERT ... ON CONFLICT DO NOTHING` on `(owner, identity_key)` followed by a read back,
so concurrent claimers (threads, processes, workers) agree on one grant and one token.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Connection, Row, delete, select, update
from sqlalchemy.dialects import postgresql, sqlite

from orchestrator.domain.fences import Fence
from orchestrator.domain.outcomes import UNRESOLVED, summary_for
from orchestrator.domain.times import wire_time
from orchestrator.domain.vocabulary import TERMINAL_TASK_STATUSES
from orchestrator.errors import ConflictError, ValidationFailed
from orchestrator.store import fastclaim
from orchestrator.store.db import Database
from orchestrator.store.fencing import check_fence
from orchestrator.store.tables import invocation_receipts as r
from orchestrator.store.tables import sessions, tasks, unresolved_receipt
from orchestrator.store.types import utcnow

__all__ = [
    "Claim",
    "CleanupResult",
    "Receipt",
    "ReceiptLedger",
    "delete_session_txn",
    "new_token",
]

#: Statuses a receipt may be deleted in, with its session or after the retention period.
#: `running` and `unknown` are recovery boundaries and are never deleted for age (seed 000).
_FINISHED = ("succeeded", "failed", "pending")
_STATUSES = frozenset({"running", "succeeded", "failed", "pending", "unknown"})
_CLAIMED = summary_for("claimed")


def new_token() -> str:
    """A fresh claim token."""
    return uuid.uuid4().hex


def _new_ids() -> tuple[str, str]:
    """A fresh invocation id (a uuid4 as text) and claim token (32 hex digits), from one read
    of the system's random source: `uuid.uuid4()` twice costs four times as much per claim."""
    random = os.urandom(32)
    digits = random.hex()
    variant = "89ab"[random[8] >> 6]  # RFC 4122: the variant bits are 10
    invocation_id = (
        f"{digits[:8]}-{digits[8:12]}-4{digits[13:16]}-{variant}{digits[17:20]}-{digits[20:32]}"
    )
    return invocation_id, digits[32:]


@dataclass(frozen=True)
class Receipt:
    """One stored receipt."""

    invocation_id: str
    owner: str
    session_id: str | None
    tool_name: str
    identity_key: str
    args_digest: str
    claim_token: str
    status: str
    summary: str
    created_at: datetime
    updated_at: datetime

    @classmethod
    def from_row(cls, row: Row[Any]) -> Receipt:
        return cls(**{key: row._mapping[key] for key in cls.__dataclass_fields__})

    def public(self) -> dict[str, Any]:
        """What operators and the model may see: no token, no digest, no identity."""
        return {
            "invocation_id": self.invocation_id,
            "owner": self.owner,
            "session_id": self.session_id,
            "tool_name": self.tool_name,
            "status": self.status,
            "summary": self.summary,
            "created_at": wire_time(self.created_at),
            "updated_at": wire_time(self.updated_at),
        }


# The fast claim builds receipts positionally from its rows.
if tuple(field.name for field in fields(Receipt)) != fastclaim.COLUMNS:
    raise ImportError("Receipt's fields and fastclaim.COLUMNS must list the same names in order")


@dataclass(frozen=True)
class Claim:
    """The answer to a claim: `granted` only for the one caller that inserted the row."""

    granted: bool
    receipt: Receipt


@dataclass(frozen=True)
class CleanupResult:
    """What one cleanup pass did."""

    enabled: bool
    reason: str
    deleted: int
    batches: int
    cutoff: datetime | None
    orphans: int = 0
    of_finished_tasks: int = 0


def delete_session_txn(conn: Connection, session_id: str) -> int:
    """In the caller's transaction: the session's finished receipts, then the session (what it
    holds goes with it by the foreign keys); `running` and `unknown` receipts stay as orphans.
    How many receipts went."""
    result = conn.execute(delete(r).where(r.c.session_id == session_id, r.c.status.in_(_FINISHED)))
    conn.execute(delete(sessions).where(sessions.c.session_id == session_id))
    return int(result.rowcount)


class ReceiptLedger:
    """Receipts in the store. Each public method is one transaction."""

    def __init__(self, db: Database) -> None:
        self.db = db

    # -- claim -------------------------------------------------------------------------------

    def claim(
        self,
        *,
        owner: str,
        session_id: str | None,
        tool_name: str,
        identity_key: str,
        args_digest: str,
        fence: Fence | None = None,
    ) -> Claim:
        """Claim `identity_key` for `owner`; the side effect may run only if `granted`.

        The same identity with another tool or digest raises `ConflictError`
        (`invocation_conflict`): the same call id with other arguments is refused, not run.
        """
        if len(args_digest) != 64:
            raise ValidationFailed("args_digest must be a SHA-256 hex digest")
        if fence is None and self.db.dialect == "postgresql":
            return self._claim_single_statement(
                owner=owner,
                session_id=session_id,
                tool_name=tool_name,
                identity_key=identity_key,
                args_digest=args_digest,
            )
        with self.db.transaction() as conn:
            if fence is not None:
                check_fence(conn, fence)
            return self._claim_txn(
                conn,
                owner=owner,
                session_id=session_id,
                tool_name=tool_name,
                identity_key=identity_key,
                args_digest=args_digest,
            )

    def _claim_single_statement(
        self,
        *,
        owner: str,
        session_id: str | None,
        tool_name: str,
        identity_key: str,
        args_digest: str,
    ) -> Claim:
        """Postgres without a fence: insert-or-read in one autocommit statement (`fastclaim`)."""
        row = self._new_row(owner, session_id, tool_name, identity_key, args_digest)
        receipt = Receipt(*fastclaim.claim_row(self.db.engine, row))
        return self._decide(receipt, row[0], tool_name, args_digest)

    @staticmethod
    def _new_row(
        owner: str, session_id: str | None, tool_name: str, identity_key: str, args_digest: str
    ) -> tuple[Any, ...]:
        """A running receipt's values in `fastclaim.COLUMNS` (and `Receipt`) order."""
        invocation_id, token = _new_ids()
        now = utcnow()
        return (
            invocation_id,
            owner,
            session_id,
            tool_name,
            identity_key,
            args_digest,
            token,
            "running",
            _CLAIMED,
            now,
            now,
        )

    @staticmethod
    def _decide(receipt: Receipt, invocation_id: str, tool_name: str, args_digest: str) -> Claim:
        if receipt.tool_name != tool_name or receipt.args_digest != args_digest:
            raise ConflictError(
                "this call's identity is already claimed with other arguments or another tool; "
                "it was not run",
                code="invocation_conflict",
                details=[{"code": "invocation_conflict", "invocation_id": receipt.invocation_id}],
            )
        return Claim(granted=receipt.invocation_id == invocation_id, receipt=receipt)

    def _claim_txn(
        self,
        conn: Connection,
        *,
        owner: str,
        session_id: str | None,
        tool_name: str,
        identity_key: str,
        args_digest: str,
    ) -> Claim:
        row = self._new_row(owner, session_id, tool_name, identity_key, args_digest)
        values = dict(zip(fastclaim.COLUMNS, row, strict=True))
        insert = postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert
        statement = (
            insert(r)
            .values(**values)
            .on_conflict_do_nothing(index_elements=["owner", "identity_key"])
            .returning(r.c.invocation_id)
        )
        conn.execute(statement)
        row = conn.execute(
            select(r).where(r.c.owner == owner, r.c.identity_key == identity_key)
        ).one()
        return self._decide(Receipt.from_row(row), values["invocation_id"], tool_name, args_digest)

    # -- finish and resolve -------------------------------------------------------------------

    def finish(
        self,
        invocation_id: str,
        token: str,
        *,
        status: str,
        summary: str,
        fence: Fence | None = None,
    ) -> bool:
        """Record the outcome of a granted claim; False when the token no longer matches.

        Only a `running` receipt held with `token` changes: after a cold start the token is new,
        so a finisher from before the restart changes nothing.
        """
        self._check_status(status)
        with self.db.transaction() as conn:
            if fence is not None:
                check_fence(conn, fence)
            result = conn.execute(
                update(r)
                .where(
                    r.c.invocation_id == invocation_id,
                    r.c.claim_token == token,
                    r.c.status == "running",
                )
                .values(status=status, summary=summary, updated_at=utcnow())
            )
            return result.rowcount == 1

    def resolve_verified(
        self, invocation_id: str, observed_token: str, *, fence: Fence | None = None
    ) -> bool:
        """Turn an unresolved receipt into `succeeded` after a matching read-only read-back.

        The token observed before verifying must still be in place, and the token rotates, so
        a late finisher of the original call cannot overwrite the verified state.
        """
        with self.db.transaction() as conn:
            if fence is not None:
                check_fence(conn, fence)
            result = conn.execute(
                update(r)
                .where(
                    r.c.invocation_id == invocation_id,
                    r.c.claim_token == observed_token,
                    r.c.status.in_(UNRESOLVED),
                )
                .values(
                    status="succeeded",
                    summary=summary_for("verified"),
                    claim_token=new_token(),
                    updated_at=utcnow(),
                )
            )
            return result.rowcount == 1

    def cold_start(self) -> int:
        """Every `running` receipt becomes `unknown` with a fresh token, in one statement.

        Nothing is replayed: an unknown write waits for a read-only verification.
        """
        with self.db.transaction() as conn:
            result = conn.execute(
                update(r)
                .where(r.c.status == "running")
                .values(
                    status="unknown",
                    summary=summary_for("recovered"),
                    claim_token=f"cold-{new_token()}",
                    updated_at=utcnow(),
                )
            )
            return int(result.rowcount)

    # -- reads --------------------------------------------------------------------------------

    def get(self, invocation_id: str) -> Receipt | None:
        with self.db.transaction(readonly=True) as conn:
            row = conn.execute(select(r).where(r.c.invocation_id == invocation_id)).one_or_none()
        return None if row is None else Receipt.from_row(row)

    def find_unresolved(
        self,
        *,
        owner: str,
        tool_name: str,
        args_digest: str,
        session_id: str | None = None,
        exclude_identity: str | None = None,
    ) -> Receipt | None:
        """The latest identical write of `owner` still `running` or `unknown`, if any.

        For a task the owner spans all its generations and sessions (`session_id=None`); a chat
        passes its session so one conversation does not block another.
        """
        query = select(r).where(
            r.c.owner == owner,
            r.c.tool_name == tool_name,
            r.c.args_digest == args_digest,
            unresolved_receipt,  # as the partial index's predicate, so that it is used
        )
        if session_id is not None:
            query = query.where(r.c.session_id == session_id)
        if exclude_identity is not None:
            query = query.where(r.c.identity_key != exclude_identity)
        query = query.order_by(r.c.created_at.desc(), r.c.invocation_id).limit(1)
        with self.db.transaction(readonly=True) as conn:
            row = conn.execute(query).one_or_none()
        return None if row is None else Receipt.from_row(row)

    def list_for_owner(self, owner: str, limit: int = 100) -> Sequence[Receipt]:
        with self.db.transaction(readonly=True) as conn:
            rows = conn.execute(
                select(r).where(r.c.owner == owner).order_by(r.c.created_at).limit(limit)
            ).all()
        return [Receipt.from_row(row) for row in rows]

    def unknown_for_owner(
        self, owner: str, limit: int = 100, *, status: str = "unknown"
    ) -> Sequence[Receipt]:
        """`owner`'s `unknown` (or `status`) receipts, newest first, filtered in SQL (the
        explain view)."""
        if limit < 1:
            raise ValidationFailed("limit must be at least 1")
        with self.db.transaction(readonly=True) as conn:
            rows = conn.execute(
                select(r)
                .where(r.c.owner == owner, r.c.status == status)
                .order_by(r.c.created_at.desc(), r.c.invocation_id.desc())
                .limit(limit)
            ).all()
        return [Receipt.from_row(row) for row in rows]

    # -- retention ----------------------------------------------------------------------------

    def delete_session(self, session_id: str) -> int:
        """Delete a session and, with it, its finished receipts; returns how many receipts went.

        `running` and `unknown` receipts stay, as orphans (the foreign key sets their session to
        NULL), and are never deleted for age: they are the boundary a recovery verifies.
        """
        with self.db.transaction() as conn:
            return delete_session_txn(conn, session_id)

    def delete_expired(
        self,
        *,
        retention_days: int,
        enabled: bool = True,
        batch_size: int = 500,
        now: datetime | None = None,
    ) -> CleanupResult:
        """One retention pass: delete expired finished receipts in batches.

        Two scopes, both only `succeeded`, `failed` and `pending` receipts last changed before
        the cutoff: orphans (no session), and the receipts of background executions, whose
        session (`task_execution`) belongs to a task that is finished (`completed`, `failed`,
        `cancelled`) and has not changed since before the cutoff. Receipts of chats and
        collaboration sessions go with their session (`delete_session`). `running` and
        `unknown` are never deleted for age. Disabled, or a retention of 0, deletes nothing.
        """
        if not enabled:
            return CleanupResult(False, "DATA_CLEANUP_ENABLE is false", 0, 0, None)
        if retention_days <= 0:
            return CleanupResult(False, "retention of 0 days disables cleanup", 0, 0, None)
        if batch_size < 1:
            raise ValidationFailed("batch_size must be at least 1")
        cutoff = (now or utcnow()) - timedelta(days=retention_days)
        finished_task_sessions = (
            select(sessions.c.session_id)
            .join(tasks, tasks.c.task_id == sessions.c.task_id)
            .where(
                sessions.c.purpose == "task_execution",
                tasks.c.status.in_(TERMINAL_TASK_STATUSES),
                tasks.c.updated_at < cutoff,
            )
        )
        orphans, orphan_batches = self._delete_in_batches(
            r.c.session_id.is_(None), cutoff, batch_size
        )
        of_tasks, task_batches = self._delete_in_batches(
            r.c.session_id.in_(finished_task_sessions), cutoff, batch_size
        )
        return CleanupResult(
            True,
            "deleted expired finished receipts (orphans, and those of finished tasks)",
            orphans + of_tasks,
            orphan_batches + task_batches,
            cutoff,
            orphans=orphans,
            of_finished_tasks=of_tasks,
        )

    def _delete_in_batches(
        self, scope: ColumnElement[bool], cutoff: datetime, batch_size: int
    ) -> tuple[int, int]:
        expired = (r.c.status.in_(_FINISHED), r.c.updated_at < cutoff)
        deleted = batches = 0
        while True:
            # One short transaction a batch: a long cleanup never holds locks that claims wait on.
            with self.db.transaction() as conn:
                ids = (
                    conn.execute(
                        select(r.c.invocation_id)
                        .where(scope, *expired)
                        .order_by(r.c.updated_at, r.c.invocation_id)
                        .limit(batch_size)
                    )
                    .scalars()
                    .all()
                )
                if not ids:
                    break
                # The status is checked again: a receipt is never deleted in `running`/`unknown`.
                result = conn.execute(delete(r).where(r.c.invocation_id.in_(ids), *expired))
                deleted += int(result.rowcount)
                batches += 1
            if len(ids) < batch_size:
                break
        return deleted, batches

    @staticmethod
    def _check_status(status: str) -> None:
        if status not in _STATUSES:
            raise ValidationFailed(f"not a receipt status: {status!r}")
