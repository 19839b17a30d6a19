"""A cancelled round says it was cancelled, whichever way it stopped: here, a write whose own
fenced record the cancel refused. The recovery snapshot and the execution's detail name the
cancel and its reason, as the other stops do ("the task was cancelled: ..."), not only the
fence's "no longer live"."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from orchestrator.services import executions as executions_module
from orchestrator.store import snapshots as snapshot_store
from tests.openai_server import OpenAIServer, call
from tests.tool_threads import join_tool_threads
from tests.transcript_support import DeafWrite, openai_runtime, trigger


def test_a_write_fenced_by_a_cancel_leaves_a_snapshot_that_names_the_cancel(
    store_url: str, scripts: Path, server: OpenAIServer
) -> None:
    rt = openai_runtime(store_url, scripts, server)
    tool = DeafWrite()
    rt.executions.receipt_tools.append(tool)
    try:
        server.reply(tool_calls=[call("c1", "deaf_write", {"order": "flush main 4"})])
        task_id = trigger(rt)
        results: list[Any] = []
        worker = threading.Thread(
            target=lambda: results.append(rt.executions.run(task_id, 1, worker="w1"))
        )
        worker.start()
        assert tool.started.wait(10)
        rt.tasks.cancel(task_id, "operator stop")
        tool.release.set()  # returns within the cancel's grace: its own record is fenced
        worker.join(timeout=8)
        assert not worker.is_alive()
        join_tool_threads("deaf_write")

        assert "no longer live" in results[0].detail  # the fence refused the tool's record
        assert "the task was cancelled: operator stop" in results[0].detail
        session_id = rt.tasks.explain(task_id)["executions"][0]["session_id"]
        with rt.db.transaction(readonly=True) as conn:
            snapshot = snapshot_store.get_snapshot(conn, session_id)
        assert snapshot is not None
        assert snapshot.reason.startswith("stopped: the task was cancelled: operator stop; ")
        assert [c["call_id"] for c in snapshot.unknown] == ["c1"]
    finally:
        tool.release.set()
        rt.close()


def test_a_cancel_just_before_the_decision_is_named_in_the_round_s_end(
    store_url: str, scripts: Path, server: OpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = openai_runtime(store_url, scripts, server)
    decide = executions_module.finish_generation

    def cancelled_first(db: Any, fence: Any, rule: Any) -> Any:
        rt.tasks.cancel(fence.task_id, "operator stop")  # committed before the decision
        return decide(db, fence, rule)

    monkeypatch.setattr(executions_module, "finish_generation", cancelled_first)
    try:
        server.reply(content="done")
        task_id = trigger(rt)
        result = rt.executions.run(task_id, 1, worker="w1")
        assert result.detail.startswith(
            "stopped before its decision: the task was cancelled: operator stop; "
        ), result.detail
        assert rt.tasks.get(task_id).status == "cancelled"
    finally:
        rt.close()
