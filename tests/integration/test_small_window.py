"""A large tool result in a small context window (`LLM_CONTEXT_WINDOW=4096`), through the real
OpenAI client against the loopback server: its preview and its `read_tool_result` pages fit the
window's budget, and paging by `result_id`/`next_offset` still gives back the whole text."""

from __future__ import annotations

import itertools
import json
import threading
from dataclasses import replace
from typing import Any

from orchestrator.agent.budget import ContextBudget, TokenCounter
from orchestrator.agent.host import ToolHost
from orchestrator.agent.loop import run_round
from orchestrator.agent.request import AgentContext
from orchestrator.agent.subagents import SUBAGENTS, Delegate, RoundDelegations, SubAgentRun
from orchestrator.tools.base import Tool, ToolArguments, ToolCall, ToolContext, ToolResult
from orchestrator.tools.results import RESULT_FIT, ReadToolResult, ResultCache
from tests.integration.test_openai_model import model_for
from tests.openai_server import OpenAIServer, Reply, call

#: A complaint log in Chinese: about a token a character, so 4,000 characters are ~4,000 tokens.
LOG = "".join(f"第{n}号投诉 学校附近的自来水发黄 有氯气味 压力偏低。\n" for n in range(150))
CTX = ToolContext(owner="task:t1", session_id="s1", round_id="intent:1")
PAGES = itertools.count(1)
NO_USAGE = (0, 5)  # a server that reports no prompt size: the count stays uncalibrated


class _Args(ToolArguments):
    pass


class ReadComplaints(Tool):
    name = "read_complaints"
    description = "The complaint log of the district."
    arguments = _Args

    def __init__(self, text: str = LOG) -> None:
        self.text = text

    def run(self, ctx: ToolContext, args: Any) -> ToolResult:
        return ToolResult.ok(self.text)


def next_page(body: dict[str, Any]) -> Reply:
    """Read on from the last answer's `next_offset`, until there is none (a summary call, when
    the pages read so far are compacted, is answered as such)."""
    if body["messages"][-1]["role"] != "tool":
        return Reply(content="pages read so far: the log, in order", usage=NO_USAGE)
    answer = json.loads(body["messages"][-1]["content"])
    page = answer["result"]
    if page.get("next_offset") is None:
        return Reply(content="read it all", usage=NO_USAGE)
    result_id = page["result_id"]
    turn = next(PAGES)  # call ids stay unique after a compaction
    return Reply(
        tool_calls=[
            call(
                f"p{turn}",
                "read_tool_result",
                {"result_id": result_id, "offset": page["next_offset"]},
            )
        ],
        usage=NO_USAGE,
    )


def test_a_large_result_is_previewed_and_paged_within_a_small_window(
    server: OpenAIServer,
) -> None:
    cache = ResultCache()
    host = ToolHost([ReadComplaints(), ReadToolResult(cache)], ledger=None, results=cache)
    budget = ContextBudget(4096, 512)
    counter = TokenCounter()
    server.reply(tool_calls=[call("c1", "read_complaints", {})], usage=NO_USAGE)
    for _ in range(60):
        server.dynamic(next_page)
    end = run_round(
        model_for(server),
        host,
        CTX,
        brief="read the complaint log",
        max_turns=60,
        stop=threading.Event(),
        context=AgentContext(budget, counter),
    )
    assert (end.why, end.final_text) == ("final_answer", "read it all")

    answers = [
        json.loads(b["messages"][-1]["content"])
        for b in server.bodies[1:]
        if b["messages"][-1]["role"] == "tool"
    ]
    preview = answers[0]["result"]
    assert preview["truncated"] is True
    assert preview["total_chars"] == len(LOG)
    text = preview["preview"]
    assert preview["next_offset"] == len(text)
    for answer in answers[1:]:
        assert answer["result"]["offset"] == len(text)
        text += answer["result"]["content"]
    assert text == LOG  # nothing lost or repeated between the pages
    for answer in answers:
        shown = answer["result"].get("preview") or answer["result"]["content"]
        assert counter.text(json.dumps(shown, ensure_ascii=False)) <= budget.result_tokens
    assert len(answers) > 2  # more than one page after the preview


def test_the_default_window_keeps_the_4000_character_preview() -> None:
    """32,768 tokens: a tenth of them holds 4,000 characters of plain text, as before."""
    cache = ResultCache()
    host = ToolHost([ReadComplaints(), ReadToolResult(cache)], ledger=None, results=cache)
    budget, counter = ContextBudget(32768, 4096), TokenCounter()
    # A round's fit when the turn leaves room (`ResultRoom.result_fit`): the share alone.
    ctx = replace(
        CTX, extras={RESULT_FIT: lambda text: counter.fit_chars(text, budget.result_tokens)}
    )
    [preview] = host.run_turn(ctx, [ToolCall("c1", "read_complaints", {})])
    assert preview.payload["next_offset"] < 4000  # Chinese: about a token a character
    plain = "reading 42 NTU at DM-RN-01\n" * 600
    host = ToolHost([ReadComplaints(plain)], ledger=None, results=cache)
    [shown] = host.run_turn(ctx, [ToolCall("c2", "read_complaints", {})])
    assert len(shown.payload["preview"]) == shown.payload["next_offset"] == 4000


def test_a_sub_agent_s_long_answer_fits_the_window_it_returns_to(server: OpenAIServer) -> None:
    """Before, the answer (up to 12,000 characters, not paged) was shown whole and failed the
    round `context_overflow` in a 4,096-token window."""
    answer = LOG[:3000]

    def reply(body: dict[str, Any]) -> Reply:
        messages = body["messages"]
        if messages[0]["content"].startswith("You are a read-only sub-agent"):
            return Reply(content=answer, usage=NO_USAGE)
        if messages[-1]["role"] == "tool":
            return Reply(content="the sub-agent answered", usage=NO_USAGE)
        return Reply(
            tool_calls=[call("d1", "delegate", {"question": "what do the complaints say?"})],
            usage=NO_USAGE,
        )

    for _ in range(3):
        server.dynamic(reply)
    host = ToolHost([ReadComplaints(), Delegate()], ledger=None)
    context = AgentContext(ContextBudget(4096, 512), TokenCounter())
    stop = threading.Event()
    rounds = RoundDelegations(
        "s1",
        SubAgentRun(
            model=lambda: model_for(server), host=host, max_turns=3, stop=stop, context=context
        ),
    )
    end = run_round(
        model_for(server),
        host,
        replace(CTX, extras={SUBAGENTS: rounds}),
        brief="read the complaint log",
        max_turns=3,
        stop=stop,
        context=context,
    )
    assert (end.why, end.final_text) == ("final_answer", "the sub-agent answered")
    shown = json.loads(server.bodies[-1]["messages"][-1]["content"])["result"]
    assert shown["truncated"] is True
    assert answer.startswith(shown["answer"].removesuffix("…"))
    tokens = context.counter.text(json.dumps(shown["answer"], ensure_ascii=False))
    assert tokens <= context.budget.result_tokens
