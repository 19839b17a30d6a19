"""The receipt-backed tool families the agent loop adds beside its own tools."""

from __future__ import annotations

from orchestrator.settings import Settings
from orchestrator.store.receipts import ReceiptLedger
from orchestrator.tools.base import Tool
from orchestrator.tools.command import command_tools
from orchestrator.tools.gateway import gateway_tools
from orchestrator.tools.invocations import GetToolExecution
from orchestrator.tools.openapi import SPEC_SETTING
from orchestrator.tools.results import ReadToolResult, ResultCache
from orchestrator.tools.spec_errors import SpecError

__all__ = ["SpecError", "check_gateway", "receipt_tools"]


def check_gateway(settings: Settings) -> None:
    """Raise `SpecError` (one line) when the configured gateway cannot be set up."""
    _gateway(settings)


def receipt_tools(settings: Settings, ledger: ReceiptLedger, results: ResultCache) -> list[Tool]:
    """`call_api`/`describe_api_operation` (when a gateway spec is set), `execute_command`
    (when enabled), `get_tool_execution` and `read_tool_result`.

    Pass the same `results` cache to the `ToolHost` so its previews and `read_tool_result`
    share one store; keep one cache per process (results are per session graph inside it).

    Raises `SpecError` (`orchestrator.tools.spec_errors`), and only that, when the gateway cannot
    be set up from `ORCH_GATEWAY_SPEC`/`ORCH_GATEWAY_BASE_URL`: an unreadable file, invalid
    JSON/YAML, a document of the wrong shape, no base URL. Its message is one line starting
    with `ORCH_GATEWAY_SPEC (<path>):`; call this at worker start so the worker stops there.
    """
    return [
        *_gateway(settings),
        *command_tools(settings),
        GetToolExecution(ledger),
        ReadToolResult(results),
    ]


def _gateway(settings: Settings) -> list[Tool]:
    try:
        return gateway_tools(settings)
    except SpecError:
        raise
    except Exception as exc:  # anything else from the gateway set-up is still a spec problem
        raise SpecError(
            f"{SPEC_SETTING} ({settings.gateway_spec}): the gateway cannot be set up: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
