"""`get_tool_execution`: the latest observed status of a receipt, for its own owner only.

A chat sees only its own session's receipts; a task execution sees every receipt of its task,
whatever the generation or session, so a recovered generation can check its predecessor's write.
Another owner's id reads exactly like an unknown one.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from orchestrator.store.receipts import Receipt, ReceiptLedger
from orchestrator.tools.base import Tool, ToolArguments, ToolContext, ToolResult

__all__ = ["GetToolExecution", "visible_to"]


def visible_to(receipt: Receipt, ctx: ToolContext) -> bool:
    """Whether the caller of `ctx` may see `receipt`."""
    if receipt.owner != ctx.owner:
        return False
    if ctx.task_id is not None:
        return True
    return receipt.session_id == ctx.session_id


class GetToolExecutionArgs(ToolArguments):
    invocation_id: str = Field(min_length=1, max_length=64)


class GetToolExecution(Tool):
    name = "get_tool_execution"
    description = (
        "Look up the latest observed status of an earlier write by the invocation_id the host "
        "returned (running, succeeded, failed, pending or unknown). It never changes a status; "
        "check the actual state with a read-only query before retrying an unknown write."
    )
    effect = "read"
    arguments = GetToolExecutionArgs
    look_up = True  # one row of the store, by its key

    def __init__(self, ledger: ReceiptLedger) -> None:
        self.ledger = ledger

    def run(self, ctx: ToolContext, args: Any) -> ToolResult:
        receipt = self.ledger.get(args.invocation_id)
        if receipt is None or not visible_to(receipt, ctx):
            return ToolResult.failed(
                f"no invocation {args.invocation_id!r} for this conversation", code="not_found"
            )
        view = receipt.public()
        del view["owner"]
        return ToolResult.ok(view)
