"""A model (or a server) that returns an empty reply, no text and no tool call, through the
real `openai` client against the loopback server and a real store. Before, each such round
ended "the round saved no report", and the task went to its round limit with nothing saying
that the model had returned nothing; now each round's reason, and the round limit's, say so
and where in the round it came."""

from __future__ import annotations

from pathlib import Path

from orchestrator.services.tasks import Trigger
from tests.executions_support import report_call, runtime_for
from tests.openai_server import OpenAIServer, call

EMPTY = "the model returned an empty answer (no text and no tool call)"


def test_empty_answers_say_so_in_each_round_and_at_the_round_limit(
    store_url: str, scripts: Path, server: OpenAIServer
) -> None:
    rt, _ = runtime_for(
        store_url,
        scripts,
        model="openai:test-model",
        llm_base_url=server.base_url,
        max_rounds=3,
    )
    try:
        server.reply(content=None)  # round 1: nothing at all to the first request
        server.reply(tool_calls=[call("c1", "read_task_context", {})])  # round 2
        server.reply(content="", reasoning_content="I have nothing to add.")
        # Round 3, the round limit: only thinking, from a server without a reasoning parser.
        server.reply(content="<think>\nNothing to do.\n</think>\n\n")
        task_id = rt.tasks.trigger(Trigger(task_type="looks", title="turbid water")).task.task_id
        first = rt.executions.run(task_id, 1, worker="w1")
        assert first.outcome == "continue"
        assert first.detail == (f"the round saved no report: {EMPTY} to the round's first request")
        second = rt.executions.run(task_id, 2, worker="w1")
        assert second.detail == (
            f"the round saved no report: {EMPTY} at turn 2 of the round, after 1 turn(s) of "
            "tool calls"
        )
        third = rt.executions.run(task_id, 3, worker="w1")
        assert third.outcome == "failed"
        view = rt.tasks.explain(task_id)
        assert view["failure_code"] == "round_limit"
        assert view["last_error"] == (
            f"the task did not finish within 3 rounds; in the last round {EMPTY} to the "
            "round's first request"
        )
    finally:
        rt.close()


def test_an_empty_reply_after_the_report_is_the_round_ending_as_usual(
    store_url: str, scripts: Path, server: OpenAIServer
) -> None:
    """Many models answer nothing once their report is saved: that is no empty answer."""
    rt, _ = runtime_for(store_url, scripts, model="openai:test-model", llm_base_url=server.base_url)
    try:
        report = report_call("r1", "waiting")
        server.reply(tool_calls=[call("r1", report["name"], report["arguments"])])
        server.reply(content=None)
        task_id = rt.tasks.trigger(Trigger(task_type="looks", title="turbid water")).task.task_id
        result = rt.executions.run(task_id, 1, worker="w1")
        assert result.detail is not None
        assert "empty answer" not in result.detail
    finally:
        rt.close()
