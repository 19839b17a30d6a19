"""The tool host: the boundary between the model's tool calls and the tools.

It validates arguments before anything runs, refuses unknown tools, keeps read-only callers
(sub-agents) away from every write, puts each write behind a durable receipt claimed before the
side effect, maps what happened to `succeeded`/`failed`/`pending`/`unknown`, and pages large
results through the in-memory cache. `StaleGeneration` and cancellation propagate to the caller.
No Celery, FastAPI or executions code is imported here.

A cancel (or a lease in doubt) ends a turn within `CANCEL_GRACE_SECONDS` even when a tool does
not look at `ctx.cancel`: the calls that have not returned by then are left to end by themselves
on their own threads (a write's receipt stays `running`, which the end of the generation makes
`unknown`; its late finish is refused by the fence), and the turn raises `ToolCancelled`.

Every call also has a time limit (`call_timeout`, ORCH_TOOL_TIMEOUT_SECONDS; longer for a tool
that bounds itself, e.g. a command's own timeout): a call that has not returned by then is given
up (`orchestrator.agent.deadline`), answered `failed` (a read) or `unknown` (a write, its receipt
`unknown` at once; a plan, proposal or report write, which may still commit), left to end by
itself, and the turn goes on. It is not a cancel.

What a write keeps (a report, a plan's nodes, a proposal's payload, a business write's fields)
is stored and served as the model wrote it: to the API, the console and the business backend.
A configured secret (`orchestrator.logs.secrets_of`: the model's API key, the API tokens, the
store's password) that the model copied into a write's arguments is masked wholly (`***`, as the
transcript masks it: `agent.sensitive.hide_configured`) before the tool sees them, here, for
every write tool at once; the result tells the model so (`MASKED_NOTE`), so that it neither
takes the `***` it reads back for a fault nor writes the secret again.

The same secrets are masked in every tool's result (its payload, keys included, and its
message) before it is paged, cited, written to the transcript or shown to the model: a command
that prints a file holding the model's key (`cat .env`), an answer or an error that echoes it.
The model reads `***` and why (`sensitive.RESULT_MASKED_NOTE`); the evidence record is of the masked
result, which is what the model and the transcript have.
"""

from __future__ import annotations

import contextvars
import json
import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import replace
from functools import partial
from typing import Any

from orchestrator.agent.call_prep import (
    Prepared,
    leave_for_later,
    phases,
    prepare,
    reused_id,
)
from orchestrator.agent.call_threads import CallThreads
from orchestrator.agent.deadline import SETTING, CallWatch, timed_out
from orchestrator.agent.evidence import EvidenceRecorder
from orchestrator.agent.loop import RECEIVED, LeaseLost, stop_reason
from orchestrator.agent.receipted import run_write
from orchestrator.agent.sensitive import (
    MASKED_NOTE,
    RESULT_MASKED_NOTE,
    ResultMask,
    hide_configured,
    noted,
)
from orchestrator.agent.transcript import is_sensitive
from orchestrator.agent.turn_room import TURN_ANSWERED
from orchestrator.domain.outcomes import summary_for
from orchestrator.errors import OrchestratorError, StaleGeneration
from orchestrator.logs import Secret
from orchestrator.store.receipts import ReceiptLedger
from orchestrator.tools.base import (
    CALL_ID,
    Tool,
    ToolCall,
    ToolCancelled,
    ToolContext,
    ToolResult,
)
from orchestrator.tools.results import (
    NO_PREVIEW_NOTE,
    PAGE_NOTE,
    PREVIEW_CHARS,
    ResultCache,
    fitting,
)

__all__ = ["CANCEL_GRACE_SECONDS", "MASKED_NOTE", "RESULT_MASKED_NOTE", "ToolHost"]

log = logging.getLogger(__name__)

_STATUSES = frozenset({"succeeded", "failed", "pending", "unknown"})
#: How long a turn waits, once cancelled, for its calls to stop by themselves before it leaves
#: them behind: long enough for a tool that honours the cancel to record its receipt.
CANCEL_GRACE_SECONDS = 2.0
_CANCEL_POLL_SECONDS = 0.05
#: The threads every host of this process runs its calls on.
_THREADS = CallThreads("tool")


class ToolHost:
    """Runs the tool calls of one model turn; one `ToolResult` per call, in call order."""

    def __init__(
        self,
        tools: Sequence[Tool],
        *,
        ledger: ReceiptLedger | None,
        results: ResultCache | None = None,
        max_workers: int = 8,
        preview_chars: int = PREVIEW_CHARS,
        evidence: EvidenceRecorder | None = None,
        call_timeout: float | None = None,
        secrets: Sequence[Secret] = (),
    ) -> None:
        self._tools: dict[str, Tool] = {}
        for tool in tools:
            if tool.name in self._tools:
                raise ValueError(f"two tools are named {tool.name!r}")
            self._tools[tool.name] = tool
        self.ledger = ledger
        self.results = results
        self.max_workers = max(1, max_workers)
        self.preview_chars = preview_chars
        self.evidence = evidence
        #: Seconds a call may run before it is given up (None: no limit of the host's).
        self.call_timeout = call_timeout
        #: The configured secrets (`orchestrator.logs.secrets_of`), masked in a write's arguments
        #: and in every result.
        self.secrets = tuple(secrets)
        #: What masks them in every result (`sensitive.ResultMask`).
        self._mask = ResultMask(self.secrets)
        # Call ids already seen per (session, round): a reused id with other arguments is
        # refused in any later turn of the round, not only within one turn.
        self._seen_ids: dict[tuple[str, str], dict[str, str]] = {}

    @property
    def tools(self) -> dict[str, Tool]:
        return dict(self._tools)

    def schemas(self) -> list[dict[str, Any]]:
        """The definitions to send to the model, in registration order."""
        return [tool.schema() for tool in self._tools.values()]

    def run_turn(self, ctx: ToolContext, calls: Sequence[ToolCall]) -> list[ToolResult]:
        """Run every call of one turn (concurrently when there are several) and return results.

        Raises `StaleGeneration` when the store refuses this generation's writes, and
        `ToolCancelled` when the round was cancelled; receipts are recorded before either.
        """
        results: list[ToolResult | None] = [None] * len(calls)
        units: dict[tuple[str, ...], list[int]] = {}
        prepared: dict[tuple[str, ...], Prepared] = {}
        seen_ids = self._seen_ids.setdefault((ctx.session_id, ctx.round_id), {})
        for index, call in enumerate(calls):
            if reused_id(seen_ids, call):
                # Seed 000: the same call id with other arguments is refused, not run.
                results[index] = ToolResult.failed(
                    f"call id {call.id!r} was already used in this round with other arguments; "
                    "it was not run",
                    code="invocation_conflict",
                )
                continue
            outcome = prepare(
                ctx, call, tools=self._tools, secrets=self.secrets, receipts=self.ledger is not None
            )
            if isinstance(outcome, ToolResult):
                # A refusal may echo what the model sent (a key, a tool's name).
                results[index] = self._mask.hidden(outcome)
                continue
            units.setdefault(outcome.unit_key, []).append(index)
            prepared.setdefault(outcome.unit_key, outcome)
        leave_for_later(ctx, calls, results, units, prepared)

        done: dict[tuple[str, ...], ToolResult] = {}
        raised: BaseException | None = None
        answered = ctx.extras.get(TURN_ANSWERED)
        for ordered in phases(units, prepared):
            if len(ordered) == 1 and ctx.cancel is None and self.call_timeout is None:
                try:
                    done[ordered[0]] = self._run_unit(ctx, prepared[ordered[0]])
                except BaseException as error:
                    raised = error
            else:
                ran, raised = self._run_concurrently(ctx, [(key, prepared[key]) for key in ordered])
                done.update(ran)
            if raised is not None:
                break  # the later phases do not start: their calls are not answered
            if callable(answered):
                # The calls after fit their results to the room these answers leave.
                for key in ordered:
                    for index in units[key] if key in done else ():
                        answered(calls[index].id, done[key])
        for key, indexes in units.items():
            if key in done:
                for index in indexes:
                    results[index] = done[key]
        if raised is not None:
            # The calls that did return keep their results (a recovery snapshot shows them
            # received, with their receipts, not unknown): `loop.RECEIVED`.
            setattr(
                raised,
                RECEIVED,
                [(call, result) for call, result in zip(calls, results, strict=True) if result],
            )
            raise raised
        return [result for result in results if result is not None]

    # -- execution --------------------------------------------------------------------------

    def _run_concurrently(
        self, ctx: ToolContext, units: list[tuple[tuple[str, ...], Prepared]]
    ) -> tuple[dict[tuple[str, ...], ToolResult], BaseException | None]:
        """Run the units on threads of their own (at most `max_workers` at once) and wait for
        each until it returns or passes its time limit, or, once `ctx.cancel` is set, for at
        most `CANCEL_GRACE_SECONDS` more."""
        slots = threading.BoundedSemaphore(min(self.max_workers, len(units)))
        watches = [CallWatch(self._limit(unit), slots) for _, unit in units]
        futures = [
            self._start(ctx, unit, watch) for (_, unit), watch in zip(units, watches, strict=True)
        ]
        index = {future: number for number, future in enumerate(futures)}
        pending = set(futures)
        done: dict[tuple[str, ...], ToolResult] = {}
        raised: list[BaseException] = []
        # Calls given up: answered (or refused by the fence) here, never waited for again.
        given_up: set[int] = set()
        while pending:
            if ctx.cancel is not None and ctx.cancel.is_set():
                _, pending = wait(pending, timeout=CANCEL_GRACE_SECONDS)
                break
            now = time.monotonic()
            wake: float | None = None
            for future in list(pending):
                number = index[future]
                watch = watches[number]
                if watch.give_up(now):
                    pending.discard(future)
                    given_up.add(number)
                    key, unit = units[number]
                    try:
                        done[key] = self._give_up(ctx, unit, watch)
                    except StaleGeneration as stale_error:
                        raised.append(stale_error)
                    continue
                at = watch.wake_at(now)
                if at is not None and (wake is None or at < wake):
                    wake = at
            if not pending:
                break
            timeout = None if wake is None else max(0.0, wake - now)
            if ctx.cancel is not None:
                # Whichever comes first: a call returns or passes its limit, or the cancel.
                poll = _CANCEL_POLL_SECONDS
                timeout = poll if timeout is None else min(timeout, poll)
            if timeout is None:
                _, pending = wait(pending)  # nothing to time: no call can pass a limit now
            else:
                _, pending = wait(pending, timeout=timeout, return_when=FIRST_COMPLETED)
        left = []
        for number, future in enumerate(futures):
            key, unit = units[number]
            if key in done or number in given_up:
                continue
            if future in pending:
                left.append(unit.call.id)
                continue
            error = future.exception()
            if error is not None:
                raised.append(error)
            else:
                done[key] = future.result()
        # A fenced write says most about why the turn ended; then the tools' own cancels.
        stale = [error for error in raised if isinstance(error, StaleGeneration)]
        if stale:
            return done, stale[0]
        if left:
            # The stop signal says why it was set (a cancel, a requeue, a lease in doubt).
            why = stop_reason(ctx.cancel, "the round was cancelled")
            return done, ToolCancelled(
                f"{why}; call(s) {', '.join(left)} did not stop within "
                f"{CANCEL_GRACE_SECONDS:g} s and were left to end by themselves"
            )
        return done, raised[0] if raised else None

    def _limit(self, unit: Prepared) -> float | None:
        if self.call_timeout is None:
            return None
        return unit.tool.time_limit(unit.args, self.call_timeout)

    def _give_up(self, ctx: ToolContext, unit: Prepared, watch: CallWatch) -> ToolResult:
        """Answer a call that passed its time limit; a write's receipt becomes `unknown` now
        (its late finish is refused: the receipt is no longer `running`)."""
        assert watch.limit is not None
        write = unit.effect == "write"
        receipt = watch.receipt
        log.warning(
            "tool call %s (%s) gave no result within %g s (%s); given up and left to end by itself",
            unit.call.id,
            unit.tool.name,
            watch.limit,
            SETTING,
        )
        if write and receipt is not None and self.ledger is not None:
            try:
                self.ledger.finish(
                    receipt.invocation_id,
                    receipt.claim_token,
                    status="unknown",
                    summary=summary_for("time_limit"),
                    fence=ctx.fence,
                )
            except StaleGeneration:
                raise
            except Exception:  # left `running`: the end of the generation makes it `unknown`
                log.exception("recording the time-out of %s failed", receipt.invocation_id)
        # A store write (plan, proposal, report) has no receipt but may still commit: unknown.
        unsure = write or unit.effect == "internal_write"
        result = timed_out(unit.tool.name, watch.limit, write=unsure, receipt=receipt)
        from orchestrator import metrics  # on use: see orchestrator.metrics on prefork

        metrics.TOOL_CALLS.labels(unit.tool.name, result.status).inc()
        metrics.TOOL_TIMEOUTS.labels(unit.tool.name).inc()
        return result

    def _start(self, ctx: ToolContext, unit: Prepared, watch: CallWatch) -> Future[ToolResult]:
        """Run `unit` on a daemon thread of its own (`call_threads`: one the round leaves
        behind never holds up the worker's exit), named `tool-<name>` while it runs, in a copy
        of the caller's context: its log lines name the task."""
        future: Future[ToolResult] = Future()

        def work() -> None:
            thread = threading.current_thread()
            thread.name = f"tool-{unit.tool.name}"
            future.set_running_or_notify_cancel()
            try:
                watch.enter()
                try:
                    future.set_result(self._run_unit(ctx, unit, watch))
                finally:
                    watch.leave()
            except BaseException as error:  # handed to the waiting turn, which raises it
                future.set_exception(error)
            finally:
                thread.name = "tool"

        _THREADS.run(partial(contextvars.copy_context().run, work))
        return future

    def _run_unit(
        self, ctx: ToolContext, unit: Prepared, watch: CallWatch | None = None
    ) -> ToolResult:
        if ctx.cancel is not None and ctx.cancel.is_set():
            raise ToolCancelled("the round was cancelled before the call started")
        if unit.effect == "write":
            assert self.ledger is not None
            assert unit.digest is not None
            assert unit.identity is not None
            result = run_write(
                self.ledger,
                ctx,
                unit.tool,
                unit.args,
                digest=unit.digest,
                identity=unit.identity,
                watch=watch,
            )
        else:
            result = self._run_read(ctx, unit)
        if watch is not None and not watch.returned():
            return result  # given up: the turn answered it; a late result records nothing
        from orchestrator import metrics  # on use: see orchestrator.metrics on prefork

        metrics.TOOL_CALLS.labels(unit.tool.name, result.status).inc()
        if unit.masked:
            result = replace(result, message=noted(result.message, MASKED_NOTE))
        # Before it is paged (a page is read later, unmasked no more) and cited.
        result = self._mask.hidden(result)
        if unit.held is not None and unit.shown is not None:
            # A look-up the window had no room for: whole if it is no larger than `held`.
            return result if unit.shown(result) else unit.held
        return self._cite(ctx, unit, result, self._page(ctx, unit, result))

    def _cite(
        self, ctx: ToolContext, unit: Prepared, full: ToolResult, shown: ToolResult
    ) -> ToolResult:
        """Record what the tool really returned as evidence and hand the model its id."""
        if self.evidence is None or ctx.fence is None:
            return shown
        facts = unit.tool.evidence_facts(unit.args, full)
        if facts is None:
            return shown
        if facts.described is not None and is_sensitive(unit.tool, unit.call.arguments):
            # What a sensitive call was asked stays out of the record, as out of the transcript.
            facts = replace(facts, described=None)
        elif facts.described is not None:
            facts = replace(facts, described=hide_configured(facts.described, self.secrets))
        cut = shown is not full and shown.payload is not full.payload
        result_id = (
            shown.payload.get("result_id") if cut and isinstance(shown.payload, dict) else None
        )
        cited = self.evidence.cite(
            ctx, facts, cut=cut, result_id=result_id if isinstance(result_id, str) else None
        )
        if cited is None:
            return shown
        return replace(
            shown,
            evidence_id=cited.evidence_id,
            queried_at=cited.queried_at,
            content_ref=cited.content_ref,
        )

    @staticmethod
    def _run_read(ctx: ToolContext, unit: Prepared) -> ToolResult:
        if unit.tool.wants_call_id:
            ctx = replace(ctx, extras={**ctx.extras, CALL_ID: unit.call.id})
        try:
            result = unit.tool.run(ctx, unit.args)
        except (StaleGeneration, ToolCancelled, LeaseLost):
            raise
        except OrchestratorError as exc:
            return ToolResult.failed(exc.message, code=exc.code)
        except Exception as exc:
            return ToolResult.failed(
                f"{unit.tool.name} failed: {type(exc).__name__}", code="tool_error"
            )
        if not isinstance(result, ToolResult) or result.status not in _STATUSES:
            return ToolResult.failed(
                f"{unit.tool.name} returned no valid result", code="tool_error"
            )
        return result

    # -- large results ----------------------------------------------------------------------

    def _page(self, ctx: ToolContext, unit: Prepared, result: ToolResult) -> ToolResult:
        if result.payload is None or not unit.tool.pageable:
            return result
        # A string is measured and paged as itself, not as its JSON text.
        plain = isinstance(result.payload, str)
        written = None if plain else result.written_payload()
        text = _as_text(result.payload) if written is None else written
        # At most `preview_chars`, and what the model's context window can take (`PREVIEW_FIT`:
        # none when that is too little to show anything worth showing).
        shown = fitting(ctx, text[: self.preview_chars], preview=len(text))
        if shown >= len(text):
            return result if plain or written is not None else result.with_payload_text(text)
        preview: dict[str, Any] = {
            "truncated": True,
            "preview": text[:shown],
            "total_chars": len(text),
        }
        if is_sensitive(unit.tool, unit.call.arguments):  # sensitive_read, or marked x-sensitive
            preview["note"] = "sensitive results are not kept for paging; narrow the query"
        elif self.results is None:
            preview["note"] = "large results cannot be paged here; narrow the query"
        else:
            stored = self.results.put(ctx, text)
            if stored.result_id is None:
                preview["note"] = stored.reason
            else:
                preview["result_id"] = stored.result_id
                preview["next_offset"] = shown
                preview["note"] = NO_PREVIEW_NOTE if not shown else PAGE_NOTE
        return replace(result, payload=preview, unpaged=result.payload)


def _as_text(payload: Any) -> str:
    if isinstance(payload, str):
        return payload
    return json.dumps(payload, ensure_ascii=False, default=str)
