"""A server that cuts prompts past its window without an error (Ollama's OpenAI API at its
context length), through the real `openai` client against the loopback server: its prompt
counts stop growing with the requests. Before, nothing said so (the model never saw the start
of its request, and answered as if it had), and the token counter was calibrated by the cut
counts, so that every later request of the process looked half its size."""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

import pytest

from orchestrator.agent.budget import ContextBudget, TokenCounter
from orchestrator.agent.host import ToolHost
from orchestrator.agent.loop import run_round
from orchestrator.agent.request import AgentContext
from tests.integration.test_openai_model import model_for
from tests.integration.test_small_window import CTX, ReadComplaints
from tests.openai_server import OpenAIServer, Reply, call

#: About 3,000 tokens of plain text: the second request is that much larger than the first.
LOG = "reading 42 NTU at DM-RN-01, pressure low, chlorine smell reported\n" * 200


def _play(server: OpenAIServer, window: int | None) -> TokenCounter:
    """A round of two requests whose prompt counts the server reports as it counts them, or
    cut at `window` tokens (None: never); the counter the round calibrated."""

    def counted(body: dict[str, Any]) -> int:
        size = len(json.dumps(body["messages"]) + json.dumps(body.get("tools")))
        return min(size // 4, window) if window else size // 4

    def answer(body: dict[str, Any]) -> Reply:
        if body["messages"][-1]["role"] == "tool":
            return Reply(content="read it", usage=(counted(body), 3))
        return Reply(tool_calls=[call("c1", "read_complaints", {})], usage=(counted(body), 3))

    server.dynamic(answer)
    server.dynamic(answer)
    counter = TokenCounter()
    end = run_round(
        model_for(server),
        ToolHost([ReadComplaints(LOG)], ledger=None),
        CTX,
        brief="read the complaint log",
        max_turns=4,
        stop=threading.Event(),
        context=AgentContext(ContextBudget(32768, 1024), counter),
    )
    assert end.final_text == "read it"
    return counter


def test_a_server_cutting_its_prompts_is_named_and_not_calibrated_by(
    server: OpenAIServer, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="orchestrator.agent.request"):
        cut = _play(server, window=800)
    [warning] = [r.getMessage() for r in caplog.records if "cut prompts" in r.getMessage()]
    assert "the model server counted 800 prompt tokens for a request of about " in warning
    assert "LLM_CONTEXT_WINDOW=32768 (Ollama: OLLAMA_CONTEXT_LENGTH" in warning
    # Calibrated by the first count only (about 1.15 here); before, the cut count dragged the
    # ratio to about half, and every later request looked half its size.
    assert cut.ratio > 1.0
    # A server counting faithfully is not taken for one that cuts.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="orchestrator.agent.request"):
        _play(server, window=None)
    assert not [r for r in caplog.records if "cut prompts" in r.getMessage()]
