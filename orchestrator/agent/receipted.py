"""One write call behind a durable receipt (seed 000, 写工具的持久执行记录).

Order: look for an identical earlier write still `running`/`unknown` (verify it read-only, never
resend), claim the identity (commit before the side effect), run, record the outcome with the
claim token. The model cannot set a receipt's status; only the host's observations do.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any, Final

from sqlalchemy.exc import InterfaceError, OperationalError

from orchestrator.agent.deadline import CallWatch, timed_out
from orchestrator.domain.outcomes import (
    OUTCOMES,
    UNRESOLVED,
    Outcome,
    default_outcome,
    model_message,
    receipt_status,
    summary_for,
    tool_status,
)
from orchestrator.errors import ConflictError, StaleGeneration
from orchestrator.store.db import cause_line
from orchestrator.store.receipts import Receipt, ReceiptLedger
from orchestrator.tools.base import Tool, ToolCancelled, ToolContext, ToolResult

__all__ = ["answer_texts", "run_write"]

log = logging.getLogger(__name__)

_VALID = frozenset({"succeeded", "failed", "pending", "unknown"})

#: What the model is told of an identical call this round already settled (`_existing`).
_SETTLED: Final[dict[str, str]] = {
    "succeeded": "This identical call already succeeded in this round; it was not run again "
    "(its output is not kept).",
    "pending": "This identical call was already submitted in this round and is not finished; "
    "it was not submitted again.",
    "failed": "This identical call already failed in this round; it was not run again. "
    "Change the arguments or start a new round.",
}
#: How the read-back of an unresolved identical write went (`_verify_previous`).
_HOW: Final[dict[bool | None, str]] = {
    True: "the read-back matched but could not be recorded",
    False: "a read-only read-back does not show the intended value",
    None: "no automatic read-only verification is available for this call",
}
#: The codes a write's answer may carry beside the outcomes' (`orchestrator.domain.outcomes`).
_CODES: Final = ("already_claimed", "verify_first", "invocation_conflict", "receipt_unavailable")


def _unresolved(invocation_id: str, status: str, how: str) -> str:
    return (
        f"An identical earlier write ({invocation_id}) is {status}: its outcome is unknown and "
        f"it was not sent again; {how}. Check the actual state with a read-only query or "
        "get_tool_execution before deciding anything."
    )


def answer_texts(invocation_id: str, tool_name: str) -> tuple[list[str], list[str]]:
    """The host's fixed messages a write's answer may carry (for a receipt `invocation_id` of
    a tool `tool_name`), and its codes: a small context window reserves room for the longest
    beside every write (`orchestrator.agent.result_room`). A tool's own message (a command's, an
    outcome's with the gateway's detail) is no longer than these."""
    late = timed_out(tool_name, 86400.0, write=True, receipt=None)
    messages = [late.message or "", *(model_message(outcome) for outcome in OUTCOMES)]
    messages += _SETTLED.values()
    messages += [
        _unresolved(invocation_id, status, how) for status in UNRESOLVED for how in _HOW.values()
    ]
    return messages, [late.code or "", *OUTCOMES, *_CODES]


def run_write(
    ledger: ReceiptLedger,
    ctx: ToolContext,
    tool: Tool,
    args: Any,
    *,
    digest: str,
    identity: str,
    watch: CallWatch | None = None,
) -> ToolResult:
    """Run a validated write at most once for its identity and return the host's verdict.

    With a `watch` (the per-call deadline, `orchestrator.agent.deadline`), a call the host gave
    up is not run once claimed, and its late return records nothing: the host has recorded it.
    """
    # A task's owner spans all its generations and sessions: a generation recovered after a
    # crash must find the write its predecessor left unresolved. A chat looks at its session.
    # Ordinary tools (identity = call id) are not merged across calls: running the same
    # diagnostic twice is two intents.
    if tool.identity == "intent":
        scope = None if ctx.task_id is not None else ctx.session_id
        try:
            previous = ledger.find_unresolved(
                owner=ctx.owner,
                tool_name=tool.name,
                args_digest=digest,
                session_id=scope,
                exclude_identity=identity,
            )
        except StaleGeneration:
            raise
        except Exception:
            log.exception("receipt lookup failed for %s", tool.name)
            return _store_down()
        if previous is not None:
            return _verify_previous(ledger, ctx, tool, args, previous, watch)

    try:
        claim = ledger.claim(
            owner=ctx.owner,
            session_id=ctx.session_id,
            tool_name=tool.name,
            identity_key=identity,
            args_digest=digest,
            fence=ctx.fence,
        )
    except StaleGeneration:
        raise
    except ConflictError as exc:
        if exc.code == "invocation_conflict":
            return ToolResult.failed(
                "this call id was already used with other arguments; it was not run",
                code="invocation_conflict",
            )
        log.warning("receipt claim refused for %s: %s", tool.name, exc.code)
        return _store_down()
    except Exception:
        log.exception("receipt claim failed for %s", tool.name)
        return _store_down()
    receipt = claim.receipt
    if not claim.granted:
        return _existing(ledger, ctx, tool, args, receipt, watch)
    if watch is not None and not watch.claimed(receipt):
        # Given up while its receipt was being claimed: it never runs, which the host knows
        # (the model was told unknown at the deadline; the receipt keeps the fact).
        _record_quietly(ledger, ctx, receipt, "not_started")
        return ToolResult(status="unknown", invocation_id=receipt.invocation_id)
    if ctx.cancel is not None and ctx.cancel.is_set():
        # The round stopped (a cancel, a requeue, a lease in doubt) while the claim committed:
        # no side effect starts after that, and the receipt says it never ran.
        _record_quietly(ledger, ctx, receipt, "not_started")
        raise ToolCancelled("the round stopped before the write started; it was not run")

    outcome, result = _execute(ledger, ctx, tool, args, receipt)
    if watch is not None and not watch.returned():
        # A late return: the host answered and recorded `unknown` at the deadline; what the
        # tool says now changes nothing (the receipt is no longer `running` either).
        return result
    try:
        recorded = ledger.finish(
            receipt.invocation_id,
            receipt.claim_token,
            status=receipt_status(outcome),
            summary=summary_for(outcome),
            fence=ctx.fence,
        )
    except StaleGeneration:
        raise
    except (OperationalError, InterfaceError) as exc:  # the store away: unknown, as below
        log.warning(
            "recording the outcome of %s failed (%s)", receipt.invocation_id, cause_line(exc)
        )
        recorded = False
    except Exception:
        log.exception("recording the outcome of %s failed", receipt.invocation_id)
        recorded = False
    if not recorded:
        # The receipt stays as it is (`running`, or what a cold start made of it): the host
        # cannot show the outcome, so the model is told it is unknown.
        return ToolResult(
            status="unknown",
            payload=result.payload,
            message=model_message("record_failed"),
            invocation_id=receipt.invocation_id,
            code="record_failed",
            outcome="record_failed",
        )
    return ToolResult(
        status=tool_status(outcome),
        payload=result.payload,
        message=result.message or model_message(outcome),
        invocation_id=receipt.invocation_id,
        code=result.code,
        outcome=outcome,
    )


def _execute(
    ledger: ReceiptLedger, ctx: ToolContext, tool: Tool, args: Any, receipt: Receipt
) -> tuple[Outcome, ToolResult]:
    # The tool learns its receipt (a background command's is settled when the round ends).
    with_receipt = replace(ctx, extras={**ctx.extras, "invocation_id": receipt.invocation_id})
    try:
        result = tool.run(with_receipt, args)
    except StaleGeneration:
        raise
    except ToolCancelled:
        _record_quietly(ledger, ctx, receipt, "cancelled")
        raise
    except Exception as exc:
        log.warning("write tool %s raised %s", tool.name, type(exc).__name__)
        return "raised", ToolResult(status="unknown", message=model_message("raised"))
    except BaseException:
        # Interpreter shutdown, KeyboardInterrupt: the effect may have happened.
        _record_quietly(ledger, ctx, receipt, "cancelled")
        raise
    if not isinstance(result, ToolResult) or result.status not in _VALID:
        return "indeterminate", ToolResult(status="unknown")
    if result.outcome in OUTCOMES:
        outcome: Outcome = result.outcome
        if tool_status(outcome) == result.status:
            return outcome, result
    return default_outcome(result.status), result


def _record_quietly(
    ledger: ReceiptLedger, ctx: ToolContext, receipt: Receipt, outcome: Outcome
) -> None:
    try:
        ledger.finish(
            receipt.invocation_id,
            receipt.claim_token,
            status=receipt_status(outcome),
            summary=summary_for(outcome),
            fence=ctx.fence,
        )
    except StaleGeneration:  # the usual end of a cancel: the fence refuses, nothing to say
        log.info("%s: its generation is over; the receipt stays as it is", receipt.invocation_id)
    except Exception:  # already propagating a cancellation; the cold start will fence it
        log.exception("recording the cancellation of %s failed", receipt.invocation_id)


def _existing(
    ledger: ReceiptLedger,
    ctx: ToolContext,
    tool: Tool,
    args: Any,
    receipt: Receipt,
    watch: CallWatch | None,
) -> ToolResult:
    """The identity was already claimed (this round, or the same call id): never run again."""
    if receipt.status in ("running", "unknown"):
        return _verify_previous(ledger, ctx, tool, args, receipt, watch)
    return ToolResult(
        status=receipt.status,  # type: ignore[arg-type]
        message=_SETTLED[receipt.status],
        invocation_id=receipt.invocation_id,
        code="already_claimed",
    )


def _verify_previous(
    ledger: ReceiptLedger,
    ctx: ToolContext,
    tool: Tool,
    args: Any,
    previous: Receipt,
    watch: CallWatch | None = None,
) -> ToolResult:
    """An identical write is unresolved: read back if the tool can, never send it again."""
    try:
        verdict = tool.verify(ctx, args)
    except (StaleGeneration, ToolCancelled):
        raise
    except Exception as exc:
        log.warning("verifier of %s raised %s", tool.name, type(exc).__name__)
        verdict = None
    if watch is not None and not watch.returned():
        return ToolResult(status="unknown")  # given up: a late read-back resolves nothing
    from orchestrator import metrics  # on use: see orchestrator.metrics on prefork

    metrics.VERIFICATIONS.labels(
        {True: "matched", False: "differs", None: "unavailable"}[verdict]
    ).inc()
    if verdict is True:
        try:
            resolved = ledger.resolve_verified(
                previous.invocation_id, previous.claim_token, fence=ctx.fence
            )
            if not resolved:
                fresh = ledger.get(previous.invocation_id)
                resolved = fresh is not None and fresh.status == "succeeded"
        except StaleGeneration:
            raise
        except Exception:
            log.exception("recording the verification of %s failed", previous.invocation_id)
            resolved = False
        if resolved:
            return ToolResult(
                status="succeeded",
                message=model_message("verified"),
                invocation_id=previous.invocation_id,
                code="verified",
                outcome="verified",
            )
    return ToolResult(
        status="unknown",
        message=_unresolved(previous.invocation_id, previous.status, _HOW[verdict]),
        payload={
            "previous_invocation_id": previous.invocation_id,
            "previous_status": previous.status,
        },
        invocation_id=previous.invocation_id,
        code="verify_first",
    )


def _store_down() -> ToolResult:
    return ToolResult.failed(
        "the receipt could not be claimed, so nothing was run; try again later",
        code="receipt_unavailable",
    )
