"""`receipt_tools` offers `execute_command` only when `ORCH_ENABLE_COMMAND_TOOL` is true."""

from __future__ import annotations

from typing import cast

import pytest

from orchestrator.settings import Settings
from orchestrator.store.receipts import ReceiptLedger
from orchestrator.tools.results import ResultCache
from orchestrator.tools.toolsets import receipt_tools

# The readers only keep the ledger; no store is touched by building the list.
LEDGER = cast(ReceiptLedger, object())


def _names(settings: Settings) -> list[str]:
    return [tool.name for tool in receipt_tools(settings, LEDGER, ResultCache())]


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ORCH_ENABLE_COMMAND_TOOL", "ORCH_GATEWAY_SPEC", "ORCH_GATEWAY_BASE_URL"):
        monkeypatch.delenv(name, raising=False)


def test_the_command_tool_is_off_by_default() -> None:
    settings = Settings(_env_file=None)
    assert settings.enable_command_tool is False
    names = _names(settings)
    assert "execute_command" not in names
    assert names == ["get_tool_execution", "read_tool_result"]


@pytest.mark.parametrize("value", ["false", "0", "no"])
def test_a_false_setting_keeps_it_off(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("ORCH_ENABLE_COMMAND_TOOL", value)
    assert "execute_command" not in _names(Settings(_env_file=None))


@pytest.mark.parametrize("value", ["true", "1", "yes"])
def test_the_environment_switch_turns_it_on(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("ORCH_ENABLE_COMMAND_TOOL", value)
    names = _names(Settings(_env_file=None))
    assert names.count("execute_command") == 1
    assert {"get_tool_execution", "read_tool_result"} <= set(names)
