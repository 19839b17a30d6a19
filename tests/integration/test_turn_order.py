"""The calls of one turn run concurrently, but a model that sends its report in the same reply
as the plan it rests on (or as an action proposal) means them in their order of dependence:
the plan, then proposals, then the report (invariant 10: the report is saved last). Before, the
report could commit first and the plan publish was refused ("already saved its report"): the
round ended on a report without a plan. Real OpenAI client and loopback server, both stores."""

from __future__ import annotations

import json
from pathlib import Path

from tests.executions_support import node, plan_call, report_call
from tests.openai_server import OpenAIServer
from tests.transcript_support import as_call, openai_runtime, trigger


def test_a_report_sent_with_its_plan_in_one_reply_is_saved_after_it(
    store_url: str, scripts: Path, server: OpenAIServer
) -> None:
    rt = openai_runtime(store_url, scripts, server)
    try:
        plan = plan_call(
            "c1", "r1", [node("check", "running"), node("sample", "waiting", actor="human")]
        )
        # The report first, as models often write it: the order of the reply is not the order
        # of dependence.
        server.reply(tool_calls=[as_call(report_call("c2", "waiting")), as_call(plan)])
        server.reply(content="waiting for the crew")
        task_id = trigger(rt)
        result = rt.executions.run(task_id, 1, worker="w1")
        answers = {
            m["tool_call_id"]: json.loads(m["content"])
            for m in server.bodies[1]["messages"]
            if m["role"] == "tool"
        }
        assert answers["c1"]["status"] == "succeeded", answers["c1"]
        assert answers["c2"]["status"] == "succeeded", answers["c2"]
        assert result.outcome == "waiting", result.detail
        assert rt.tasks.get(task_id).status == "waiting"
        # The model is answered in the order it called, as strict servers want.
        order = [m["tool_call_id"] for m in server.bodies[1]["messages"] if m["role"] == "tool"]
        assert order == ["c2", "c1"]
    finally:
        rt.close()
