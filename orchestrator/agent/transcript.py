"""The durable transcript writer: what came back from the model, and what the model was shown.

The loop calls `model_turn` after each model turn, before any of its tool calls runs, and
`tool_results` with the envelopes it is about to show the model. Both are written to the store
fenced, like every execution write: a generation that lost its lease writes nothing more. The
model turn is written before the loop goes on; the results are written in the background while
the model thinks, and the next model turn, `flush()` or the end of the round waits for them.

What is written is redacted: the argument values of a sensitive operation (`sensitive_read`, or a
business operation marked `x-sensitive`) become `"***"`, as do the values of a tool's secret
arguments (`Tool.secret_arguments`: a command's `env`); a call of a tool the host does not have,
or whose arguments its tool refused, keeps their shape with what may be secret masked
(`sensitive.kept_arguments`: no schema vouches for them), and a configured secret's text is
masked in any call's arguments, in a result that echoes it and in the model's own text (its
answer, its thinking, a compaction's summary: a model that read the key in a tool's answer
writes it back as readily as into a call); a sensitive result keeps its
status and receipt id but not its body; a page of a large result (`read_tool_result`) is not
kept, only which result and offset it was; everything else is the envelope exactly as shown (a
large result is already a preview with its `result_id`).

The writer also remembers the calls and results of its round, so a round that ends by an
exception, a cancel or a lost lease leaves a recovery snapshot that includes results the store
could no longer take (`snapshot`).

Once the round's stop event is set (the lease is in doubt, the generation fenced or cancelled)
the writer no longer tries: the fence would refuse a superseded generation's entries, but a
lease in doubt is not yet superseded, and a round that stops writes nothing more. A model turn
or a compaction summary then raises `LeaseLost`; results that came back are remembered for the
snapshot only.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from orchestrator.agent.compaction import Compaction
from orchestrator.agent.loop import LeaseLost, stop_reason
from orchestrator.agent.model import ModelTurn
from orchestrator.agent.sensitive import (
    REDACTED,
    hide_configured,
    hide_cut_secret,
    hide_secret_arguments,
    hide_unknown_arguments,
    is_sensitive,
    kept_arguments,
    may_be_sensitive,
    redact_values,
)
from orchestrator.agent.text import clean, clean_json, storable_json
from orchestrator.domain.fences import Fence
from orchestrator.domain.recovery import CallRecord, Snapshot
from orchestrator.errors import StaleGeneration
from orchestrator.logs import Secret
from orchestrator.store import transcripts as transcript_store
from orchestrator.store.db import Database
from orchestrator.store.fencing import check_fence
from orchestrator.tools.base import Tool, ToolCall, ToolResult
from orchestrator.tools.results import ReadToolResult

__all__ = [
    "REDACTED",
    "TranscriptWriter",
    "hide_secret_arguments",
    "is_sensitive",
    "may_be_sensitive",
    "redact_values",
]

#: The longest tool name the transcript's column holds (a model may call any name).
_NAME_CHARS = 128


#: Where tool results are written while the model thinks (one write in flight per round).
_BACKGROUND = ThreadPoolExecutor(max_workers=16, thread_name_prefix="transcript")


class _Counter:
    """The next entry number of a session, shared by a round's writer and its sub-agents'."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.next: int | None = None


class TranscriptWriter:
    """One round's transcript: fenced writes, and the memory a recovery snapshot is built from."""

    def __init__(
        self,
        db: Database,
        fence: Fence,
        session_id: str,
        tools: Mapping[str, Tool],
        *,
        parent_call_id: str | None = None,
        stop: threading.Event | None = None,
        secrets: Iterable[Secret] = (),
    ) -> None:
        """`secrets`: the configured secrets (`orchestrator.logs.secrets_of`), masked wherever
        they appear in what is written (see the module docstring)."""
        self.db = db
        self.secrets = list(secrets)
        forms = {
            form
            for secret in self.secrets
            if isinstance(secret, str) and len(secret) >= 4
            for form in (secret, json.dumps(secret, ensure_ascii=False)[1:-1])
        }
        #: Any configured secret's text in a result's JSON (`_holds_a_secret`).
        self._secret_text = (
            re.compile("|".join(map(re.escape, sorted(forms, key=len, reverse=True))))
            if forms
            else None
        )
        #: The round's stop event: once set, nothing more is written (see the module docstring).
        self.stop = stop
        self.fence = fence
        self.session_id = session_id
        self.tools = dict(tools)
        self.parent_call_id = parent_call_id
        self._counter = _Counter()
        self._pending: Future[None] | None = None
        self._sensitive: dict[str, bool] = {}
        self.calls: dict[str, CallRecord] = {}
        self._last_turn = 0

    def child(
        self, parent_call_id: str, tools: Mapping[str, Tool] | None = None
    ) -> TranscriptWriter:
        """The writer of a sub-agent started by `parent_call_id`: its entries go to the same
        session, numbered in the same sequence, marked with the parent call. Its calls are not
        part of this round's recovery snapshot (a sub-agent only reads)."""
        child = TranscriptWriter(
            self.db,
            self.fence,
            self.session_id,
            self.tools if tools is None else tools,
            parent_call_id=parent_call_id,
            stop=self.stop,
            secrets=self.secrets,
        )
        child._counter = self._counter
        return child

    # -- TurnRecorder ------------------------------------------------------------------------

    def model_turn(self, turn_number: int, message: dict[str, Any], turn: ModelTurn) -> None:
        self._check_stop()  # before its calls are remembered: a turn not written never runs
        self.flush()  # the previous results first: the transcript stays in order
        self._last_turn = turn_number
        calls = []
        raw = dict(turn.raw_arguments)
        for call in turn.tool_calls:
            tool = self.tools.get(call.name)
            sensitive = is_sensitive(tool, call.arguments)
            self._sensitive[call.id] = sensitive
            arguments = (
                # Its keys too may hold a configured secret: masked before its shape is kept.
                redact_values(hide_configured(call.arguments, self.secrets))
                if sensitive
                else clean(kept_arguments(tool, call.arguments, self.secrets))
            )
            # A name the host does not have is the model's text, like its arguments.
            name = hide_configured(call.name, self.secrets)
            shown: dict[str, Any] = {"id": call.id, "name": name, "arguments": arguments}
            if call.sent_name is not None:
                # The name the model sent, which the host resolved to `name` (`tool_names`).
                sent_name = hide_configured(call.sent_name, self.secrets)
                shown["sent_name"] = clean(sent_name[:_NAME_CHARS])
            if call.sent_markers:
                # The markers around the arguments as sent, cut to read them
                # (`argument_markers`): with `arguments`, what the server sent.
                shown["arguments_markers"] = clean(call.sent_markers)
            if call.id in raw:
                # Unreadable arguments: what the model sent, unless it may hold a secret.
                text = raw[call.id]
                hidden = may_be_sensitive(tool) or bool(tool and tool.secret_arguments)
                # No schema vouches for them: masked by the rule for such arguments, a
                # configured secret wholly (the logs' rule kept its first 4 characters).
                shown["raw_arguments"] = (
                    REDACTED
                    if hidden
                    else clean(
                        hide_cut_secret(hide_unknown_arguments(text, self.secrets), self.secrets)
                    )
                )
            calls.append(shown)
            self.calls[call.id] = CallRecord(call.id, name, arguments, turn_number)
        body: dict[str, Any] = {
            "content": hide_configured(turn.content, self.secrets),
            "tool_calls": calls,
        }
        if turn.reasoning_content is not None:
            body["reasoning_content"] = hide_configured(turn.reasoning_content, self.secrets)
        if turn.malformed:
            body["malformed"] = dict(turn.malformed)
        if turn.cut_off is not None:
            body["cut_off"] = turn.cut_off
        usage = turn.usage
        self._write(
            [
                transcript_store.Entry(
                    turn=turn_number,
                    kind="model_turn",
                    body=body,
                    parent_call_id=self.parent_call_id,
                    prompt_tokens=usage.prompt_tokens if usage else None,
                    completion_tokens=usage.completion_tokens if usage else None,
                )
            ]
        )

    def tool_results(
        self, turn_number: int, calls: list[ToolCall], results: list[ToolResult]
    ) -> None:
        entries = []
        for call, result in zip(calls, results, strict=True):
            record = self.calls.get(call.id)
            if record is not None:
                self.calls[call.id] = record.answered(result.status, result.invocation_id)
            body, body_json = self._kept(call, result)
            entries.append(
                transcript_store.Entry(
                    turn=turn_number,
                    kind="tool_result",
                    body=body,
                    body_json=body_json,
                    call_id=call.id,
                    tool_name=hide_configured(call.name, self.secrets),
                    status=result.status,
                    parent_call_id=self.parent_call_id,
                )
            )
        if self._stopped():
            return  # remembered for the snapshot; the round stops at its next check
        # Off the turn's path: written while the model thinks about them; the next model turn,
        # `flush()` and the end of the round wait for it (and raise what it raised).
        self.flush()
        self._pending = _BACKGROUND.submit(self._write, entries)

    def flush(self, timeout: float | None = None) -> None:
        """Wait for the results written in the background; raises what their write raised,
        or `TimeoutError` after `timeout` seconds (the write goes on by itself)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result(timeout=timeout)

    # -- TranscriptHook (compaction and sub-agents) -------------------------------------------

    def compacted(self, compaction: Compaction) -> None:
        """A compaction's summary, in order with the turns it replaces in later requests."""
        self.flush()
        self._write(
            [
                transcript_store.Entry(
                    turn=self._last_turn,
                    kind="summary",
                    body={
                        "summary": hide_configured(compaction.summary, self.secrets),
                        "source": compaction.source,
                        "messages_replaced": compaction.messages_replaced,
                        "tokens_before": compaction.tokens_before,
                        "tokens_after": compaction.tokens_after,
                    },
                    parent_call_id=self.parent_call_id,
                    prompt_tokens=compaction.prompt_tokens,
                    completion_tokens=compaction.completion_tokens,
                )
            ]
        )

    def subagent(self, parent_call_id: str) -> TranscriptWriter:
        return self.child(parent_call_id)

    # -- what is kept ------------------------------------------------------------------------

    def envelope(self, call: ToolCall, result: ToolResult) -> dict[str, Any]:
        """The envelope the model was shown, redacted for the transcript."""
        # Exactly the JSON the model was shown.
        shown: dict[str, Any] = json.loads(result.message_text)
        if "result" not in shown:
            return shown
        if self._sensitive.get(call.id, False):
            shown["result"] = "(a sensitive result is not kept in the transcript)"
        elif self._is_page(call):
            # A page of a large result: which one, not its text. Other tools that are not
            # paged (a data-source query, a sub-agent's answer) keep what the model was shown.
            shown["result"] = {
                "note": "a page of a large result is not kept in the transcript",
                "arguments": call.arguments,
            }
        return shown

    def _kept(self, call: ToolCall, result: ToolResult) -> tuple[dict[str, Any], str | None]:
        """A result's entry body and, when the envelope is kept as shown, the JSON text the
        model was shown: the store writes that text as it is, neither parsed nor written again
        (a query's answer is ~15 KB), and reads back what the model read. `body` is then the
        value the text was written from (a tuple there is a list in the text)."""
        redacted = result.payload is not None and (
            self._sensitive.get(call.id, False) or self._is_page(call)
        )
        if self._holds_a_secret(result.message_text):
            # A tool that echoed a configured secret the model sent it ("unknown source
            # 'sk-...'"): its text masked, as in the call's arguments. Rare: found by a scan.
            return hide_configured(self.envelope(call, result), self.secrets), None
        if not redacted and storable_json(result.message_text):
            return result.to_message(), result.message_text
        return self.envelope(call, result), None

    def _holds_a_secret(self, text: str) -> bool:
        """Does `text` (JSON) hold a configured secret's text, as it is or JSON-escaped? One
        pass (about 70 us for a 20 KB result) on the background writer's thread."""
        return self._secret_text is not None and self._secret_text.search(text) is not None

    def _is_page(self, call: ToolCall) -> bool:
        return isinstance(self.tools.get(call.name), ReadToolResult)

    def snapshot(self, reason: str, last_plan: dict[str, Any] | None) -> Snapshot:
        """What this round did and what is unknown, from memory (see `domain.recovery`)."""
        return Snapshot.from_calls(
            list(self.calls.values()),
            reason=reason,
            generation=self.fence.generation,
            last_plan=last_plan,
        )

    # -- writing -----------------------------------------------------------------------------

    def _stopped(self) -> bool:
        return self.stop is not None and self.stop.is_set()

    def _check_stop(self) -> None:
        if self._stopped():
            # Why first (a cancel, a lost lease): the recovery snapshot's reason is this line.
            raise LeaseLost(
                f"{stop_reason(self.stop)}; generation {self.fence.generation} of task "
                f"{self.fence.task_id} stopped, its transcript takes nothing more"
            )

    def _write(self, entries: list[transcript_store.Entry]) -> None:
        if not entries:
            return
        self._check_stop()  # checked again here: results are written in the background
        entries = [_cleaned(entry) for entry in entries]
        with self._counter.lock:
            if self.db.dialect == "postgresql":
                self._write_in_one_statement(entries)
                return
            self._write_in_a_transaction(entries)

    def _write_in_one_statement(self, entries: list[transcript_store.Entry]) -> None:
        # One statement in autocommit; the first write numbers its rows in the statement
        # itself (no separate read).
        next_seq = transcript_store.insert_entries_fenced(
            self.db.engine,
            self.fence,
            session_id=self.session_id,
            first_seq=self._counter.next,
            entries=entries,
        )
        if next_seq is None:
            raise StaleGeneration(
                f"generation {self.fence.generation} of task {self.fence.task_id} no longer "
                "holds its lease; the transcript takes nothing more from it"
            )
        self._counter.next = next_seq

    def _write_in_a_transaction(self, entries: list[transcript_store.Entry]) -> None:
        with self.db.transaction() as conn:
            check_fence(conn, self.fence)
            if self._counter.next is None:
                self._counter.next = transcript_store.next_seq(conn, self.session_id)
            transcript_store.insert_entries(
                conn,
                session_id=self.session_id,
                task_id=self.fence.task_id,
                generation=self.fence.generation,
                first_seq=self._counter.next,
                entries=entries,
            )
            self._counter.next += len(entries)


def _cleaned(entry: transcript_store.Entry) -> transcript_store.Entry:
    """`entry` as the store can hold it, with its body's JSON text (written once, while
    checking it needs no cleaning) for the store to send; a text the entry has already was
    checked when it was given."""
    body, body_json = entry.body, entry.body_json
    if body_json is None:
        body, body_json = clean_json(body)
    return replace(
        entry,
        body=body,
        body_json=body_json,
        call_id=clean(entry.call_id),
        tool_name=clean(entry.tool_name[:_NAME_CHARS]) if entry.tool_name else None,
    )
