"""`query_data_source` in a small context window (`LLM_CONTEXT_WINDOW=4096`, a local 4k model),
a real round through the real `openai` client against the loopback server.

Before, the result was shown whole (the bundled simulator's day of readings is about 3,600
tokens) and the round failed `context_overflow` at its next request. Now the tool shows the rows
a quarter of the window takes, says `truncated` with why, and the host's evidence record says
exactly what the model saw (invariant 12: a truncated result cannot support a claim about the
whole range).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from orchestrator.services.task_records import TaskRecords
from orchestrator.services.tasks import Trigger
from tests.executions_support import runtime_for
from tests.openai_server import OpenAIServer, call

KEY = "sk-test-small-window"


def _run(store_url: str, scripts: Path, server: OpenAIServer, window: int) -> dict[str, Any]:
    """One round that queries a day of turbidity readings: what the model was shown of it, and
    the host's evidence record."""
    rt, _ = runtime_for(
        store_url,
        scripts,
        model="openai:test-model",
        llm_base_url=server.base_url,
        llm_api_key=KEY,
        llm_context_window=window,
        llm_max_output_tokens=min(1024, window // 4),
    )
    try:
        day = {"source": "scada_sim", "parameters": {"point": "DM-RN-01", "measure": "turbidity"}}
        server.reply(tool_calls=[call("q1", "query_data_source", day)])
        server.reply(content="looked at the readings")
        task_id = rt.tasks.trigger(Trigger(task_type="looks", title="turbid water")).task.task_id
        result = rt.executions.run(task_id, 1, worker="w1")
        task = rt.tasks.get(task_id)
        assert task.last_error is None, task.last_error
        assert not result.give_back, result.detail
        [record] = TaskRecords(rt.db).evidence(task_id)["items"]
        shown = json.loads(server.bodies[1]["messages"][-1]["content"])["result"]
        return {"record": record, "shown": shown}
    finally:
        rt.close()


def test_a_day_of_readings_fits_a_4096_token_window_and_says_it_is_cut(
    store_url: str, scripts: Path, server: OpenAIServer
) -> None:
    seen = _run(store_url, scripts, server, 4096)
    shown, record = seen["shown"], seen["record"]
    rows = shown["rows"]
    assert 0 < len(rows) < 144  # a day every 10 minutes: 144 readings
    assert shown["row_count"] == len(rows)
    assert shown["truncated"] is True
    assert "LLM_CONTEXT_WINDOW" in shown["truncation"]
    assert f"takes {len(rows)} of 14" in shown["truncation"]  # 144, or 145 on a boundary
    # The host's record is what the model saw: truncated, with as many rows.
    assert record["truncated"] is True
    assert record["row_count"] == len(rows)
    # Whole rows from the start of the range; the next one's time is named to query on from.
    next_time = shown["truncation"].split("the next row's time is ")[1].split(")")[0]
    assert next_time > rows[-1]["time"]
    assert len(json.dumps(shown)) < 4 * 4096  # well inside the window


def test_the_default_window_shows_the_whole_day(
    store_url: str, scripts: Path, server: OpenAIServer
) -> None:
    seen = _run(store_url, scripts, server, 32768)
    shown, record = seen["shown"], seen["record"]
    assert shown["truncated"] is False
    assert len(shown["rows"]) >= 144
    assert (record["truncated"], record["row_count"]) == (False, len(shown["rows"]))
