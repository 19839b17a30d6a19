"""A sensitive result never reaches a compaction's summary request, on the real loopback server.

The model sees a `sensitive_read`'s body in its own turns; the transcript keeps its status, not
its body. A summary call's answer is recorded as it comes, so a model that copies the facts it
was given into its summary (as the summary prompt asks) carried the body into the transcript:
the summary request shows such a result by its status only.
"""

from __future__ import annotations

import threading
from typing import Any

from orchestrator.agent.budget import ContextBudget, TokenCounter
from orchestrator.agent.compaction import Compaction
from orchestrator.agent.host import ToolHost
from orchestrator.agent.loop import run_round
from orchestrator.agent.model import load_model
from orchestrator.agent.request import AgentContext
from orchestrator.settings import load_settings
from orchestrator.tools.base import Tool, ToolArguments, ToolContext, ToolResult
from tests.openai_server import OpenAIServer, Reply, call

CTX = ToolContext(owner="task:t1", session_id="s1", round_id="intent:1")
PASSWORD = "hunter2-do-not-keep"


class NoArgs(ToolArguments):
    pass


class ReadPassword(Tool):
    name = "read_password"
    description = "The pump station's maintenance password."
    arguments = NoArgs
    effect = "sensitive_read"

    def run(self, ctx: ToolContext, args: Any) -> ToolResult:
        return ToolResult.ok({"password": PASSWORD})


class ReadLog(Tool):
    name = "read_log"
    description = "A page of the station's log."
    arguments = NoArgs

    def run(self, ctx: ToolContext, args: Any) -> ToolResult:
        return ToolResult.ok({"lines": ["pressure 3.1 bar at the north main"] * 60})


class Summaries:
    def __init__(self) -> None:
        self.records: list[Compaction] = []

    def compacted(self, compaction: Compaction) -> None:
        self.records.append(compaction)

    def subagent(self, parent_call_id: str) -> Summaries:
        return self


def summarised_round(
    server: OpenAIServer, first: list[Any], tools: list[Tool], *, max_turns: int
) -> tuple[Any, Summaries]:
    """A round on `server` whose model makes the calls `first`, one a turn, then reads the log
    for seven turns (the window is small: the turns are compacted) and answers; its summary
    calls are answered by a model that copies what it was given."""
    asked: list[int] = []

    def answer(body: dict[str, Any]) -> Reply:
        if not body.get("tools"):  # the summary call: a model that copies what it was given
            return Reply(content=body["messages"][-1]["content"])
        turns = len(asked)
        asked.append(turns)
        if turns < len(first):
            return Reply(tool_calls=[first[turns]])
        if turns < len(first) + 7:
            return Reply(tool_calls=[call(f"l{turns}", "read_log", {})])
        return Reply(content="done")

    for _ in range(30):
        server.dynamic(answer)
    settings = load_settings(
        model="openai:test-model", llm_base_url=server.base_url, llm_timeout_seconds=5
    )
    model = load_model(settings.model, "water", settings=settings)
    transcript = Summaries()
    end = run_round(
        model,
        ToolHost(tools, ledger=None),
        CTX,
        brief="check the pump station",
        max_turns=max_turns,
        stop=threading.Event(),
        context=AgentContext(ContextBudget(3000), TokenCounter()),
        transcript=transcript,
    )
    return end, transcript


def test_a_summary_request_shows_a_sensitive_result_by_its_status_only(
    server: OpenAIServer,
) -> None:
    end, transcript = summarised_round(
        server, [call("p1", "read_password", {})], [ReadPassword(), ReadLog()], max_turns=12
    )
    assert end.why == "final_answer"
    # The model itself was shown the password, before the turn holding it was compacted.
    assert PASSWORD in str(server.bodies[1]["messages"])
    summary_requests = [b for b in server.bodies if not b.get("tools")]
    assert summary_requests
    assert transcript.records
    first = summary_requests[0]["messages"][-1]["content"]
    assert "[tool result p1] (a sensitive result: status succeeded; its body is not shown)" in first
    for body in summary_requests:
        assert PASSWORD not in str(body)
    for record in transcript.records:
        assert PASSWORD not in record.summary


class StationArgs(ToolArguments):
    station: str


class ReadStationPassword(Tool):
    name = "read_station_password"
    description = "A station's maintenance password."
    arguments = StationArgs
    effect = "sensitive_read"

    def run(self, ctx: ToolContext, args: Any) -> ToolResult:
        return ToolResult.ok({"password": PASSWORD})


class EnvArgs(ToolArguments):
    env: dict[str, str]


class CheckWithEnv(Tool):
    name = "check_with_env"
    description = "Runs the station check with these environment variables."
    arguments = EnvArgs
    secret_arguments = frozenset({"env"})

    def run(self, ctx: ToolContext, args: Any) -> ToolResult:
        return ToolResult.ok({"checked": sorted(args.env)})


def test_a_summary_request_shows_arguments_as_the_transcript_keeps_them(
    server: OpenAIServer,
) -> None:
    """A sensitive call's argument values and a secret argument's values (a command's `env`)
    are not in a summary request either: its answer is recorded as it comes."""
    station, token = "station-kept-private", "tok-never-summarised"
    first = [
        call("p1", "read_station_password", {"station": station}),
        call("e1", "check_with_env", {"env": {"TOKEN": token}}),
    ]
    end, transcript = summarised_round(
        server, first, [ReadStationPassword(), CheckWithEnv(), ReadLog()], max_turns=14
    )
    assert end.why == "final_answer"
    assert token in str(server.bodies[2]["messages"])  # the model sent it and sees it
    summary_requests = [b for b in server.bodies if not b.get("tools")]
    assert summary_requests
    shown = " ".join(b["messages"][-1]["content"] for b in summary_requests)
    assert '"TOKEN": "***"' in shown
    for body in summary_requests:
        assert station not in str(body)
        assert token not in str(body)
    for record in transcript.records:
        assert token not in record.summary
