"""A task's decided actions, page after page: `GET /api/v1/actions?decided=true&task_id=...`.

The console's task page listed them from `any=true&limit=200`, the pending ones taken out in the
browser, and said that only the 200 newest were shown: an older decision (who approved a work
order, and whether the backend has it) could not be reached from the page. `decided=true` lists
every status but `pending_approval`, newest first, with the `next_cursor` every list pages by.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import insert

from orchestrator.runtime import Runtime
from orchestrator.store.tables import actions
from orchestrator.store.types import utcnow
from tests.executions_support import runtime_and_api, simple_task

#: (status, seconds before now) of each action written; two share a time (the id breaks it).
WRITTEN = [
    ("approved", 70),
    ("pending_approval", 60),
    ("rejected", 50),
    ("superseded", 40),
    ("approved", 30),
    ("rejected", 30),
    ("pending_approval", 20),
    ("approved", 10),
]


@pytest.fixture
def env(store_url: str, scripts: Path) -> Iterator[tuple[Runtime, TestClient]]:
    with runtime_and_api(store_url, scripts) as both:
        yield both


def with_actions(rt: Runtime, scripts: Path) -> tuple[str, list[str]]:
    """A completed task with the actions of WRITTEN: its id and the decided ones' ids, newest
    first."""
    task_id = simple_task(rt, scripts)
    assert rt.executions.run(task_id, 1, worker="w:1").outcome == "completed"
    task = rt.tasks.get(task_id)
    now = utcnow()
    rows = [
        {
            "action_id": f"act-{task_id[:8]}-{i:02d}",
            "task_id": task_id,
            "generation": 1,
            "session_id": task.session_id,
            "node_id": "a",
            "kind": "work_order",
            "payload": {"n": i},
            "status": status,
            "decided_by": None if status in ("pending_approval", "superseded") else "ana",
            "decided_at": None if status == "pending_approval" else now,
            "created_at": now - timedelta(seconds=ago),
            "plan_revision": 1,
            "digest": f"{i:064x}",
        }
        for i, (status, ago) in enumerate(WRITTEN)
    ]
    with rt.db.transaction() as conn:
        conn.execute(insert(actions), rows)
    decided = [r for r in rows if r["status"] != "pending_approval"]
    decided.sort(key=lambda r: (r["created_at"], r["action_id"]), reverse=True)
    return task_id, [r["action_id"] for r in decided]


def pages(client: TestClient, query: str) -> list[list[dict[str, Any]]]:
    """Every page of the list `query`, following `next_cursor`."""
    found, cursor = [], None
    while True:
        answer = client.get(f"/api/v1/actions?{query}" + (f"&cursor={cursor}" if cursor else ""))
        assert answer.status_code == 200, answer.text
        body = answer.json()
        found.append(body["items"])
        cursor = body["next_cursor"]
        if cursor is None:
            return found
        assert len(found) < 10, "the cursor does not move on"


def test_a_task_s_decided_actions_page_by_cursor_newest_first(
    env: tuple[Runtime, TestClient], scripts: Path
) -> None:
    rt, client = env
    task_id, decided = with_actions(rt, scripts)
    listed = pages(client, f"decided=true&task_id={task_id}&limit=2")
    assert [len(page) for page in listed] == [2, 2, 2]
    items = [item for page in listed for item in page]
    assert [a["action_id"] for a in items] == decided  # each once, newest first, none pending
    assert {a["status"] for a in items} == {"approved", "rejected", "superseded"}
    assert all("delivery" in a for a in items)  # as every page of actions has it
    # One page of them all, as the first page was before with `any=true`, less the pending.
    (whole,) = pages(client, f"decided=true&task_id={task_id}")
    assert [a["action_id"] for a in whole] == decided


@pytest.mark.parametrize("also", ["any=true", "status=approved", "status=pending_approval"])
def test_decided_with_another_status_filter_is_refused(
    env: tuple[Runtime, TestClient], scripts: Path, also: str
) -> None:
    rt, client = env
    task_id = simple_task(rt, scripts)
    answer = client.get(f"/api/v1/actions?decided=true&{also}&task_id={task_id}")
    assert answer.status_code == 422, answer.text
    error = answer.json()["error"]
    assert error["code"] == "invalid_request"
    assert "decided" in error["message"]
