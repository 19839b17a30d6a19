"""A model server that rate-limits the round (HTTP 429) for longer than its retries may wait
does not fail the task: a rate limit is neither the agent's fault nor lasting. The round hands
its generation back, saying why, and the sweeper requeues it once the server's Retry-After has
passed, as it requeues a round stopped by an outage: counted in `handbacks`, so a server that
never lets up parks the task at ORCH_MAX_HANDBACKS instead of looping. Both stores."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest

from orchestrator.runtime import Runtime
from orchestrator.store import executions as execution_store
from orchestrator.store import task_events as event_store
from orchestrator.store.types import utcnow
from tests.executions_support import runtime_for
from tests.openai_server import OpenAIServer, call
from tests.transcript_support import openai_runtime, trigger

KEY = "sk-never-shown"


def execution(rt: Runtime, task_id: str, generation: int) -> execution_store.ExecutionRecord:
    with rt.db.transaction(readonly=True) as conn:
        found = execution_store.get_execution(conn, task_id, generation)
    assert found is not None
    return found


def test_a_retry_after_past_the_retry_budget_hands_the_round_back_until_then(
    store_url: str, scripts: Path, server: OpenAIServer
) -> None:
    rt = openai_runtime(store_url, scripts, server)
    try:
        server.reply(tool_calls=[call("c1", "read_task_context", {})])
        server.fail(429, retry_after=120, message="rate limit reached for requests")
        task_id = trigger(rt)
        result = rt.executions.run(task_id, 1, worker="w1")
        assert (result.ran, result.outcome, result.give_back) == (True, None, True)
        assert "rate limit" in result.detail

        task = rt.tasks.get(task_id)
        assert task.status == "running"  # not failed model_error: handed back
        first = execution(rt, task_id, 1)
        assert first.outcome is None
        assert first.handed_back_at is not None
        assert first.reason is not None
        assert first.reason.startswith("handed back: the model server is rate limiting")
        assert "HTTP 429" in first.reason
        assert "Retry-After" in first.reason
        assert KEY not in first.reason
        # Not requeued before the server's Retry-After has passed.
        assert first.lease_expires_at is not None
        left = (first.lease_expires_at - utcnow()).total_seconds()
        assert 100 < left <= 121
        assert rt.sweeper.sweep().requeued == []
        assert "handed back: the model server is rate limiting" in str(rt.tasks.explain(task_id))
    finally:
        rt.close()


@pytest.mark.parametrize(
    ("code", "said"),
    [(429, "the model server is rate limiting"), ("503", "the model server is unavailable")],
)
def test_a_gateways_upstream_rate_limit_at_200_hands_the_round_back(
    store_url: str, scripts: Path, server: OpenAIServer, code: int | str, said: str
) -> None:
    """OpenRouter answers an upstream's rate limit (or outage) with a 200 whose body is an
    error object carrying the upstream's status: past the retries the round failed the task
    `model_error` ("the model server returned no choices"), for good, where the same status
    sent as the HTTP status hands the round back to run again."""
    error = {
        "message": "Provider returned error",
        "code": code,
        "metadata": {"raw": "z-ai/glm is temporarily rate-limited upstream", "key": KEY},
    }
    rt = openai_runtime(store_url, scripts, server)  # LLM_MAX_RETRIES=1
    try:
        for _ in range(2):
            server.garble(json.dumps({"error": error}), content_type="application/json")
        task_id = trigger(rt)
        result = rt.executions.run(task_id, 1, worker="w1")
        assert (result.outcome, result.give_back) == (None, True), result.detail
        assert rt.tasks.get(task_id).status == "running"  # handed back, not failed
        reason = execution(rt, task_id, 1).reason
    finally:
        rt.close()
    assert reason is not None
    assert reason.startswith(f"handed back: {said} (HTTP {code}: ")
    assert "temporarily rate-limited upstream" in reason  # the upstream's own words
    assert reason.endswith("requeued in 30s")
    assert KEY not in reason


def test_an_error_at_200_without_a_busy_code_still_fails_the_round(
    store_url: str, scripts: Path, server: OpenAIServer
) -> None:
    error = {"message": "model not found", "code": "model_not_found"}
    rt = openai_runtime(store_url, scripts, server)
    try:
        for _ in range(2):
            server.garble(json.dumps({"error": error}), content_type="application/json")
        task_id = trigger(rt)
        result = rt.executions.run(task_id, 1, worker="w1")
    finally:
        rt.close()
    assert (result.outcome, result.give_back) == ("failed", False)
    assert result.detail is not None
    assert "returned no choices (its error: model not found)" in result.detail


def test_a_short_retry_after_the_round_waited_out_is_not_a_requeue_at_the_next_sweep(
    store_url: str, scripts: Path, server: OpenAIServer
) -> None:
    """A server rate-limiting a burst of tasks (tokens per minute) answers 429 with a Retry-After
    of a second or two, again and again. The round already waited it out and was refused
    again: its hand-back waits at least the back-off (30 s, doubled per hand-back in a row).
    Requeued after the 1 s instead, each task burnt its ORCH_MAX_HANDBACKS (10) in a few
    minutes and was parked `failed` for good, where a server that gave no Retry-After at all
    was asked again for an hour and a half."""
    rt = openai_runtime(store_url, scripts, server)  # LLM_MAX_RETRIES=1
    try:
        server.fail(429, retry_after=1, message="rate limit reached for requests")
        server.fail(429, retry_after=1, message="rate limit reached for requests")
        task_id = trigger(rt)
        result = rt.executions.run(task_id, 1, worker="w1")
        assert result.give_back, result.detail
        first = execution(rt, task_id, 1)
        assert first.lease_expires_at is not None
        left = (first.lease_expires_at - utcnow()).total_seconds()
        assert 20 < left <= 30
        assert first.reason is not None
        assert first.reason.endswith("requeued in 30s")
        assert rt.sweeper.sweep().requeued == []
    finally:
        rt.close()


def test_a_server_that_never_lets_up_parks_the_task_at_the_hand_back_limit(
    store_url: str, scripts: Path, server: OpenAIServer
) -> None:
    rt, _ = runtime_for(
        store_url,
        scripts,
        model="openai:test-model",
        llm_base_url=server.base_url,
        llm_api_key=KEY,
        llm_max_retries=0,
        max_handbacks=2,
    )
    try:
        for _ in range(2):
            server.fail(429, retry_after=0.3, message="rate limit reached for requests")
        task_id = trigger(rt)
        for generation in (1, 2):
            result = rt.executions.run(task_id, generation, worker="w1")
            assert result.give_back, result.detail
            # Not at the next sweep (the back-off, though the Retry-After was 0.3 s): after it.
            assert rt.sweeper.sweep().requeued == []
            swept = rt.sweeper.sweep(utcnow() + timedelta(seconds=30 * generation + 1))
            if generation == 1:
                assert swept.requeued == [(task_id, 1, 2)]
                assert execution(rt, task_id, 1).outcome == "lost"
                reason = execution(rt, task_id, 1).reason
                assert reason is not None
                assert reason.startswith("handed back: the model server is rate limiting")
                # The sweeper's log line and the task event say what happened: a planned
                # hand-back, not a worker lost, nor a store or Redis outage.
                line = swept.lines()[0]  # then its wake-up, republished (the sweep's clock)
                assert line.startswith(
                    f"requeued task {task_id}: generation 1 handed back (the model server is "
                    "rate limiting"
                ), line
                assert line.endswith("(LLM_MAX_RETRIES=0)), generation 2 queued"), line
                with rt.db.transaction(readonly=True) as conn:
                    [queued] = event_store.events_of_type(conn, task_id, "queued", 1)
                assert queued.reason == f"generation 1: {reason}"
            else:
                assert swept.parked == [(task_id, 2)]
                line = swept.lines()[0]
                assert line.startswith(
                    f"parked task {task_id} as failed (recovery_limit) after generation 2 "
                    "handed back (the model server is rate limiting"
                ), line
        task = rt.tasks.get(task_id)
        assert (task.status, task.handbacks) == ("failed", 2)
        assert task.last_error == (
            "2 generations in a row were handed back by their workers (the "
            "store, Redis or the model server was away; each execution says which)"
        )
    finally:
        rt.close()
