"""Through a real worker process: the honest agent queries the simulated SCADA source, cites the
evidence and completes; the same agent lying (closing its human node, reporting without
evidence, presenting synthetic data as live) is refused and its task does not complete."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.services.tasks import Trigger
from tests.acceptance.fleet import Fleet
from tests.executions_support import (
    CITED,
    node,
    plan_call,
    query_call,
    report_call,
    runtime_for,
    wait_for,
)
from tests.executions_support import write_script as write
from workers.celery_app import CeleryDispatcher, make_celery

HONEST = [
    {"tool_calls": [query_call()]},
    {"tool_calls": [plan_call("p1", "r1", [node("a", "completed")])]},
    {"tool_calls": [report_call("rep", "completed")]},
    {"content": "done"},
]

SAMPLE = node("sample", "pending", actor="human")
LIAR = [
    {"tool_calls": [query_call()]},
    {"tool_calls": [plan_call("p1", "r1", [node("a", "running"), SAMPLE])]},
    {
        "tool_calls": [
            plan_call(
                "p2",
                "r2",
                [node("a", "completed"), dict(SAMPLE, status="completed", evidence="done")],
            )
        ]
    },
    {"tool_calls": [report_call("rep1", "completed", cite=[])]},  # no evidence
    {
        "tool_calls": [
            {
                "id": "rep2",
                "name": "save_report",
                "arguments": {
                    "summary": "live SCADA shows nothing wrong",
                    "evidence_ids": [CITED],
                    "presented_origin": "live",
                    "outcome": "completed",
                },
            }
        ]
    },
    {"content": "all done, trust me"},
]


@pytest.mark.slow
def test_a_real_worker_completes_the_honest_agent_and_not_the_liar(
    pg_url: str, redis_url: str, tmp_path: Path
) -> None:
    scripts = tmp_path / "scripts"
    write(scripts, "honest", HONEST)
    write(scripts, "liar", LIAR)
    env = {
        "ORCH_DATABASE_URL": pg_url,
        "ORCH_REDIS_URL": redis_url,
        "ORCH_MODEL": f"scripted:{scripts}",
        "ORCH_HOME": str(tmp_path / "home"),
    }
    fleet = Fleet(env, tmp_path)
    rt, _ = runtime_for(pg_url, scripts, redis_url=redis_url)
    rt.dispatcher = CeleryDispatcher(make_celery(rt.settings))
    try:
        worker = fleet.worker(concurrency=2)
        wait_for(lambda: fleet.ready(worker), 30, what="the worker")
        honest = rt.tasks.trigger(Trigger(task_type="honest", title="t")).task.task_id
        liar = rt.tasks.trigger(Trigger(task_type="liar", title="t")).task.task_id
        wait_for(lambda: rt.tasks.get(honest).status == "completed", 30, what="the honest task")
        wait_for(lambda: rt.tasks.get(liar).status == "waiting", 30, what="the liar's round")
        view = rt.tasks.explain(liar)
        assert view["report"] is None, fleet.logs()  # both reports were refused
        assert view["plan"]["revision"] == 1  # the human node was not closed
        assert "human node(s) not completed: sample" in view["executions"][0]["reason"]
        listed = fleet.cli("tasks", "evidence", honest, "--json")
        assert listed.returncode == 0, listed.stderr
        [record] = json.loads(listed.stdout)
        assert (record["source"], record["origin"]) == ("scada_sim", "synthetic")
        assert rt.tasks.explain(honest)["report"]["evidence_refs"] == [record["evidence_id"]]
    finally:
        fleet.stop()
        rt.close()
