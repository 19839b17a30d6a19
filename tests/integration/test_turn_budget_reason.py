"""A round that runs out of turns says which setting bounds it, and the round limit says the
last round ran out. Before, "the turn budget of the round ran out" named no setting, and the
round limit's "the task did not finish within N rounds" did not say why the last round ended."""

from __future__ import annotations

from pathlib import Path

from orchestrator.services.tasks import Trigger
from tests.executions_support import runtime_for
from tests.openai_server import OpenAIServer, Reply, call


def test_the_turn_budget_names_its_setting_in_each_round_and_at_the_round_limit(
    store_url: str, scripts: Path, server: OpenAIServer
) -> None:
    rt, _ = runtime_for(
        store_url,
        scripts,
        model="openai:test-model",
        llm_base_url=server.base_url,
        max_rounds=2,
        max_turns=2,
    )
    try:
        # A model that calls an unknown tool round after round: every call fails, none ends it.
        server.converse(
            [Reply(tool_calls=[call(f"c{n}", "save_reprt", {"summary": "x"})]) for n in range(2)]
        )
        task_id = rt.tasks.trigger(Trigger(task_type="looks", title="turbid water")).task.task_id
        first = rt.executions.run(task_id, 1, worker="w1")
        assert first.detail == "the turn budget of the round ran out (ORCH_MAX_TURNS=2)"
        assert rt.executions.run(task_id, 2, worker="w1").outcome == "failed"
        view = rt.tasks.explain(task_id)
        assert view["failure_code"] == "round_limit"
        assert view["last_error"] == (
            "the task did not finish within 2 rounds; in the last round the turn budget of the "
            "round ran out (ORCH_MAX_TURNS=2)"
        )
    finally:
        rt.close()
