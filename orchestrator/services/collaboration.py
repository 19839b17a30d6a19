"""Collaboration sessions: a person asks about a task, the agent answers (seed 004, DESIGN §8).

The answer is made from authorised snapshots only: the task's current plan, its latest report
and its evidence records, as the store returns them, plus this session's own earlier questions
and answers. Never an execution's transcript, tool calls or reasoning: those are not read here.
The model (ORCH_MODEL; the scripted model plays `DIR/<task_type>.collaboration.json`) may call
read tools only: the host runs it as a read-only caller with read tools alone.

A collaboration session is its owner's: each person has one per task, and only they read it or
ask in it (`caller`); `None` stands for a caller who speaks for anyone (the shared API token,
the CLI on the store). Another person's questions are neither shown nor given to the model.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from orchestrator.agent.budget import TokenCounter
from orchestrator.agent.sensitive import hide_configured
from orchestrator.domain.cursors import decode_cursor, encode_cursor
from orchestrator.domain.fingerprints import fingerprint
from orchestrator.domain.storable import storable_text
from orchestrator.errors import (
    ConflictError,
    ConstraintViolation,
    Forbidden,
    NotFound,
    OrchestratorError,
    ValidationFailed,
    echoed,
)
from orchestrator.logs import secrets_of
from orchestrator.services.sessions import create_session_txn
from orchestrator.settings import Settings
from orchestrator.store import collaboration as store
from orchestrator.store import evidence as evidence_store
from orchestrator.store import executions as execution_store
from orchestrator.store import plans as plan_store
from orchestrator.store import reports as report_store
from orchestrator.store import sessions as session_store
from orchestrator.store import tasks as task_store
from orchestrator.store.collaboration import KeyedAsk, MessageRecord
from orchestrator.store.db import Database
from orchestrator.store.records import TaskRecord
from orchestrator.store.sessions import SessionRecord
from orchestrator.store.types import utcnow
from orchestrator.tools.base import Tool, ToolContext

__all__ = ["Answer", "CollaborationService", "ModelUnavailable", "bounded_evidence", "snapshots"]

MAX_LIMIT = 200
_SYSTEM = (
    "You answer a person's questions about a condition task. Explain and judge only from the "
    "authorised snapshots you are given (the task's current plan, its latest report and its "
    "evidence records) and from read tools. You cannot change anything: no tool here writes, "
    "and work orders or commands are only ever proposed by the task's execution and approved "
    "by a person. Say so when the snapshots do not support an answer."
)


class ModelUnavailable(OrchestratorError):
    """The model could not answer (a broken script, an unreachable service); nothing was stored."""

    code = "model_error"
    http_status = 502


@dataclass(frozen=True)
class Answer:
    question: MessageRecord
    answer: MessageRecord
    #: True when an earlier ask with the same idempotency key stored them (a client's retry).
    replayed: bool = False


#: What an `Idempotency-Key` may be: 1-200 visible ASCII characters (no spaces).
_KEY = re.compile(r"[\x21-\x7e]{1,200}")


def _checked_key(key: str | None) -> str | None:
    if key is not None and not _KEY.fullmatch(key):
        raise ValidationFailed(
            "the Idempotency-Key must be 1-200 visible ASCII characters, without spaces",
            code="invalid_idempotency_key",
        )
    return key


def _replay(session_id: str, key: str, stored: KeyedAsk, digest: str) -> Answer:
    """The stored ask of a retry; another question under the same key is refused."""
    if stored.request_digest != digest:
        raise ConflictError(
            f"Idempotency-Key {key!r} already asked another question in session {session_id}; "
            "use a new key for a new question",
            code="idempotency_conflict",
        )
    return Answer(stored.question, stored.answer, replayed=True)


def snapshots(conn: Any, task: TaskRecord, evidence_tokens: int) -> dict[str, Any]:
    """The authorised snapshots of a task: current plan, latest report, and its evidence
    records within about `evidence_tokens` (`bounded_evidence`)."""
    executions = execution_store.list_executions(conn, task.task_id)
    plan = None
    for execution in sorted(executions, key=lambda e: e.generation, reverse=True):
        plan = plan_store.latest_revision(conn, execution.session_id)
        if plan is not None:
            break
    report = None
    for execution in sorted(executions, key=lambda e: e.generation, reverse=True):
        report = report_store.latest_report(conn, task.task_id, execution.generation)
        if report is not None:
            break
    authorised: dict[str, Any] = {
        "task": {
            "task_id": task.task_id,
            "task_type": task.task_type,
            "title": task.title,
            "status": task.status,
            "generation": task.generation,
            "origin": task.origin,
        },
        "plan": plan.to_dict() if plan is not None else None,
        "report": report,
    }
    shown, not_shown = bounded_evidence(conn, task.task_id, _cited_ids(authorised), evidence_tokens)
    authorised["evidence"] = shown
    if not_shown:
        authorised["evidence_not_shown"] = not_shown
    return authorised


#: The share of the model's context window the evidence of the snapshots may take: a task of
#: thousands of records would otherwise make one question larger than any window.
EVIDENCE_SHARE = 4
#: Records read at a time, newest first, while the budget has room.
_EVIDENCE_READ = 50


def bounded_evidence(
    conn: Any, task_id: str, cited: set[str], tokens: int
) -> tuple[list[dict[str, Any]], int]:
    """The task's records within about `tokens`, oldest first as stored: those `cited` (by the
    report, its findings, the plan's nodes) first, then the newest, up to the first that does
    not fit; and how many are not shown, so that the answer does not take the records shown
    for all there are. Read as they are taken, newest first, a few at a time: a task of
    thousands of records read them all to send a few dozen."""
    counter, used = TokenCounter(), 0
    kept: list[tuple[Any, dict[str, Any]]] = []

    def taken(key: Any, record: dict[str, Any]) -> bool:
        nonlocal used
        size = counter.text(json.dumps(record, ensure_ascii=False, default=str))
        if used + size > tokens and kept:
            return False
        kept.append((key, record))
        used += size
        return True

    full = bool(cited) and not all(
        taken(key, record)
        for key, record in evidence_store.keyed_evidence(conn, task_id, limit=len(cited), ids=cited)
    )
    before = None
    while not full:
        page = evidence_store.keyed_evidence(
            conn, task_id, limit=_EVIDENCE_READ, after=before, newest_first=True
        )
        rest = [(key, record) for key, record in page if record["evidence_id"] not in cited]
        full = not all(taken(key, record) for key, record in rest) or len(page) < _EVIDENCE_READ
        before = page[-1][0] if page else None
    shown = [record for _, record in sorted(kept, key=lambda pair: pair[0])]
    return shown, evidence_store.evidence_count(conn, task_id) - len(shown)


def _cited_ids(authorised: dict[str, Any]) -> set[str]:
    report = authorised.get("report") or {}
    plan = authorised.get("plan") or {}
    # A stored report keeps what it cites as `evidence_refs` (`save_report`'s `evidence_ids`).
    cited = {str(i) for i in report.get("evidence_refs") or ()}
    for finding in report.get("findings") or ():
        if isinstance(finding, dict):
            cited.update(str(i) for i in finding.get("evidence_ids") or ())
    for node in plan.get("nodes") or ():
        if isinstance(node, dict):
            cited.update(str(i) for i in node.get("evidence_ids") or ())
    return cited


class CollaborationService:
    def __init__(self, db: Database, settings: Settings) -> None:
        self.db = db
        self.settings = settings

    def open(self, task_id: str, owner: str) -> tuple[SessionRecord, bool]:
        """`owner`'s collaboration session about the task, made on first use: (session, created)."""
        with self.db.transaction() as conn:
            task = task_store.get_task(conn, task_id, lock=True)  # one session per task
            if task is None:
                raise NotFound(f"task {echoed(task_id)} does not exist")
            existing = store.collaboration_session_of(conn, task_id, owner)
            if existing is not None:
                return existing, False
            title = f"Collaboration: {task.title}"[:200]
            created = create_session_txn(
                conn, purpose="task_collaboration", title=title, owner=owner, task_id=task_id
            )
            return created, True

    def _session(
        self, conn: Any, session_id: str, caller: str | None, *, lock: bool = False
    ) -> SessionRecord:
        session = session_store.get_session(conn, session_id, lock=lock)
        if session is None:
            raise NotFound(f"session {echoed(session_id)} does not exist")
        if session.purpose != "task_collaboration" or session.task_id is None:
            raise ConflictError(
                f"session {session_id} is a {session.purpose} session, not a task collaboration",
                code="not_collaboration",
            )
        if caller is not None and caller != session.owner:
            raise Forbidden(
                f"session {session_id} is another person's collaboration session; "
                f"POST /api/v1/tasks/{session.task_id}/collaboration opens yours",
                code="not_session_owner",
            )
        return session

    def ask(
        self,
        session_id: str,
        text: str,
        *,
        caller: str | None,
        idempotency_key: str | None = None,
    ) -> Answer:
        """Store the question and the agent's answer; a model failure stores nothing.

        `caller` is who asks: a session of another owner is refused (403 `not_session_owner`).
        With `idempotency_key`, a retry (same key, same question) returns the stored question
        and answer (`replayed`) without asking the model; the same key with another question
        is 409 `idempotency_conflict`. Two asks with one key at once may both reach the model,
        but one question is stored and both get it.
        """
        if not text.strip():
            raise ValidationFailed("the question is empty", code="invalid_request")
        try:
            storable_text(text)  # before the model is asked: the question could not be stored
        except ValueError as exc:
            raise ValidationFailed(f"the question: {exc}", code="invalid_request") from None
        key = _checked_key(idempotency_key)
        digest = fingerprint({"text": text})
        with self.db.transaction(readonly=True) as conn:
            session = self._session(conn, session_id, caller)
            assert session.task_id is not None
            stored = store.asked_with_key(conn, session_id, key) if key else None
            if key and stored:
                return _replay(session_id, key, stored, digest)
            task = task_store.get_task(conn, session.task_id)
            if task is None:
                raise NotFound(f"task {session.task_id} does not exist")
            authorised = snapshots(conn, task, self.settings.llm_context_window // EVIDENCE_SHARE)
            history = store.latest_messages(conn, session_id, MAX_LIMIT)
        # A configured secret the model repeats (read in an old record, or guessed) is not
        # stored or served: wholly `***`, as in an execution's writes and transcript.
        reply = hide_configured(
            self._answer(task, session_id, authorised, history, text), secrets_of(self.settings)
        )
        try:
            storable_text(reply)  # a NUL or a lone surrogate: the model's fault, not the asker's
        except ValueError as exc:
            raise ModelUnavailable(f"the model's answer cannot be stored: {exc}") from None
        try:
            with self.db.transaction() as conn:
                # The session's row lock orders the exchanges: each is stamped after the ones
                # stored before it, so a page never splits one exchange around another (an ask
                # answered sooner, stored while this one waited on the model) and a cursor never
                # passes an exchange that commits later. The page order is (created_at, id).
                self._session(conn, session_id, caller, lock=True)
                # A retry that came in while the model answered this one may have stored first.
                stored = store.asked_with_key(conn, session_id, key) if key else None
                if key and stored:
                    return _replay(session_id, key, stored, digest)
                newest = store.latest_messages(conn, session_id, 1)
                tick = timedelta(microseconds=1)
                asked_at = max([utcnow(), *(m.created_at + tick for m in newest)])
                answered_at = asked_at + tick
                keyed = {"idempotency_key": key, "request_digest": digest if key else None}
                question = store.insert_message(conn, session_id, "user", text, asked_at, **keyed)
                answer = store.insert_message(
                    conn, session_id, "agent", reply, answered_at, **keyed
                )
        except ConstraintViolation:
            if not key:
                raise
            # ... or committed between that read and this commit (Postgres): its ask wins.
            with self.db.transaction(readonly=True) as conn:
                stored = store.asked_with_key(conn, session_id, key)
            if stored is None:
                raise
            return _replay(session_id, key, stored, digest)
        return Answer(question, answer)

    def _answer(
        self,
        task: TaskRecord,
        session_id: str,
        authorised: dict[str, Any],
        history: list[MessageRecord],
        text: str,
    ) -> str:
        # The agent's loop, its model clients and the read tool, imported when a question is
        # asked: an API process that is never asked one does not import them (0.24 s at start).
        from orchestrator.agent.host import ToolHost
        from orchestrator.agent.loop import run_calls
        from orchestrator.agent.model import ModelError, load_model
        from orchestrator.agent.repeats import RepeatedRefusals
        from orchestrator.tools.tasks import ReadTaskContext

        messages: list[dict[str, Any]] = [
            {"role": "system", "content": _SYSTEM},
            {
                "role": "user",
                "content": "Authorised snapshots of the task (plan, report, evidence):\n"
                + json.dumps(authorised, ensure_ascii=False, default=str),
            },
        ]
        for earlier in history:
            role = "user" if earlier.role == "user" else "assistant"
            messages.append({"role": role, "content": earlier.text})
        messages.append({"role": "user", "content": text})
        # Read tools only, and no execution's transcript: not the recovery built from it.
        tools: list[Tool] = [ReadTaskContext(self.db, recovery=False)]
        host = ToolHost(
            tools,
            ledger=None,
            call_timeout=self.settings.tool_timeout_seconds,
            # Masked in what the tools answer (a context that holds a key), as in a round.
            secrets=secrets_of(self.settings),
        )
        ctx = ToolContext(
            owner=f"collaboration:{session_id}",
            session_id=session_id,
            round_id=f"collaboration:{utcnow().isoformat()}",
            task_id=task.task_id,
            generation=task.generation,
            readonly=True,
        )
        stop = threading.Event()
        try:
            model = load_model(
                self.settings.model, f"{task.task_type}.collaboration", settings=self.settings
            )
            model.check_tools(list(host.tools))
            schemas = host.schemas()
            refusals = RepeatedRefusals()
            for _ in range(self.settings.max_turns):
                turn = model.next_turn(messages, schemas, stop)
                if turn.final and turn.unparsed is not None:
                    raise ModelError(turn.unparsed)  # a call the server did not parse
                if turn.final and turn.cut_off is not None:
                    # Half a sentence is not the agent's answer (as in a round: model_error).
                    raise ModelError(f"{turn.cut_off} before it finished its answer")
                if turn.final:
                    return turn.content or "(the agent gave no answer)"
                messages.append(
                    {
                        "role": "assistant",
                        "content": turn.content,
                        "tool_calls": [
                            {"id": c.id, "name": c.name, "arguments": c.arguments}
                            for c in turn.tool_calls
                        ],
                    }
                )
                results = run_calls(host, ctx, turn)  # unreadable arguments: failed, not run
                repeated = refusals.observe(turn.tool_calls, results)
                if repeated is not None:
                    raise ModelError(repeated)  # as in a round: not every turn of the budget
                for call, result in zip(turn.tool_calls, results, strict=True):
                    messages.append(
                        {
                            "role": "tool",
                            "tool_call_id": call.id,
                            "content": result.message_text,
                        }
                    )
        except ModelError as exc:
            # It may repeat what the model wrote (a tool's name): the caller is shown it.
            why = hide_configured(str(exc), secrets_of(self.settings))
            raise ModelUnavailable(f"the model could not answer: {why}") from None
        return "(the agent ran out of turns before answering)"

    def messages(
        self, session_id: str, *, caller: str | None, cursor: str | None = None, limit: int = 50
    ) -> tuple[list[MessageRecord], str | None]:
        """One page of the session's messages, oldest first, and the next page's cursor; only
        for its owner (`caller`), or a caller who speaks for anyone (None)."""
        after = decode_cursor(cursor) if cursor else None
        with self.db.transaction(readonly=True) as conn:
            self._session(conn, session_id, caller)
            page = store.list_messages(conn, session_id, after=after, limit=limit + 1)
        more = len(page) > limit
        page = page[:limit]
        last = page[-1] if more and page else None
        return page, encode_cursor(last.created_at, last.message_id) if last else None
