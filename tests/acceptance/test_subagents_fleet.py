"""Read-only sub-agents in a real worker process: two rounds in a row delegate, and the
sub-agent's write, plan and report are refused at the host (nothing reaches the backend)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.services.tasks import Trigger
from tests.acceptance.fleet import Fleet
from tests.executions_support import runtime_for, wait_for
from tests.integration.fake_backend import SPEC, Backend, running_backend
from tests.integration.receipt_rows import task_receipt_statuses
from tests.integration.test_agent_runtime import sub_agent_scripts
from workers.celery_app import CeleryDispatcher, make_celery


@pytest.fixture
def backend() -> Iterator[Backend]:
    with running_backend() as running:
        yield running
        running.release.set()


@pytest.mark.slow
def test_two_rounds_in_a_row_delegate_and_writes_are_refused(
    pg_url: str, redis_url: str, tmp_path: Path, backend: Backend
) -> None:
    scripts = tmp_path / "scripts"
    sub_agent_scripts(scripts, "probe")
    spec = tmp_path / "backend.json"
    spec.write_text(json.dumps(SPEC))
    backend.settings["pressure"] = {"value": 5}
    env = {
        "ORCH_DATABASE_URL": pg_url,
        "ORCH_REDIS_URL": redis_url,
        "ORCH_MODEL": f"scripted:{scripts}",
        "ORCH_MAX_ROUNDS": "2",
        "ORCH_GATEWAY_SPEC": str(spec),
        "ORCH_GATEWAY_BASE_URL": backend.url,
        "ORCH_HOME": str(tmp_path / "home"),
        "LLM_CONTEXT_WINDOW": "16000",
        "LLM_MAX_OUTPUT_TOKENS": "1000",
    }
    fleet = Fleet(env, tmp_path)
    rt, _ = runtime_for(pg_url, scripts, redis_url=redis_url)
    rt.dispatcher = CeleryDispatcher(make_celery(rt.settings))
    try:
        fleet.worker(concurrency=1)
        task_id = rt.tasks.trigger(Trigger(task_type="probe", title="t")).task.task_id
        wait_for(
            lambda: (
                len(rt.tasks.explain(task_id)["executions"]) == 2
                and rt.tasks.get(task_id).status == "failed"
            ),
            60,
            what="two rounds",
        )
        view = rt.tasks.explain(task_id)
        assert [e["outcome"] for e in view["executions"]] == ["continue", "failed"], fleet.logs()
        assert view["failure_code"] != "model_error", fleet.logs()
        assert backend.count("GET", "/settings/pressure") == 2  # each round's sub-agent read
        assert backend.count("PUT", "/settings/pressure") == 0  # its write was refused
        assert task_receipt_statuses(rt.db, task_id) == []
        assert view["plan"]["nodes"][0]["id"] == "a"  # the sub-agent's plan was refused
    finally:
        fleet.stop()
        rt.close()
