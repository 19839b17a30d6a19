"""The receipt-backed tool families the agent loop adds beside its own tools."""

from __future__ import annotations

from orchestrator.settings import Settings
from orchestrator.store.receipts import ReceiptLedger
from orchestrator.tools.base import Tool
from orchestrator.tools.command import command_tools
from orchestrator.tools.gateway import gateway_tools
from orchestrator.tools.invocations import GetToolExecution
from orchestrator.tools.results import ReadToolResult, ResultCache

__all__ = ["receipt_tools"]


def receipt_tools(settings: Settings, ledger: ReceiptLedger, results: ResultCache) -> list[Tool]:
    """`call_api`/`describe_api_operation` (when a gateway spec is set), `execute_command`
    (when enabled), `get_tool_execution` and `read_tool_result`.

    Pass the same `results` cache to the `ToolHost` so its previews and `read_tool_result`
    share one store; keep one cache per process (results are per session graph inside it).
    """
    return [
        *gateway_tools(settings),
        *command_tools(settings),
        GetToolExecution(ledger),
        ReadToolResult(results),
    ]
