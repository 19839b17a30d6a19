"""Executions on the real OpenAI client against the loopback server, and a claimed generation:
what the transcript, brief and snapshot tests share."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from pydantic import Field

from orchestrator.domain.fences import Fence
from orchestrator.runtime import Runtime
from orchestrator.services.tasks import Trigger
from orchestrator.store import tasks as task_store
from orchestrator.tools.base import Tool, ToolArguments, ToolContext, ToolResult
from tests.executions_support import claim_as_worker, runtime_for
from tests.openai_server import OpenAIServer, call

__all__ = ["DeafWrite", "as_call", "claimed", "openai_runtime", "trigger"]


def openai_runtime(store_url: str, scripts: Path, server: OpenAIServer, **extra: Any) -> Runtime:
    """A runtime whose executions call `server` through the real OpenAI client."""
    rt, _ = runtime_for(
        store_url,
        scripts,
        model="openai:test-model",
        llm_base_url=server.base_url,
        llm_api_key="sk-never-shown",
        llm_max_retries=1,
        **extra,
    )
    return rt


def as_call(raw: dict[str, Any]) -> dict[str, Any]:
    """A scripted-model call (`tests.executions_support`) as a server tool call."""
    return call(raw["id"], raw["name"], raw["arguments"])


def trigger(rt: Runtime, task_type: str = "water") -> str:
    return rt.tasks.trigger(Trigger(task_type=task_type, title="Turbid water")).task.task_id


def claimed(rt: Runtime) -> tuple[Fence, str]:
    """A triggered task whose generation 1 is claimed as a worker would: its fence and session."""
    task_id = trigger(rt)
    token = claim_as_worker(rt, task_id, 1, "w1", ttl=60)
    with rt.db.transaction(readonly=True) as conn:
        task = task_store.get_task(conn, task_id)
    assert task is not None
    assert task.session_id is not None
    return Fence(task_id, 1, token), task.session_id


class DeafWriteArgs(ToolArguments):
    order: str = Field(min_length=1)


class DeafWrite(Tool):
    """A write whose client library never looks at `ctx.cancel` (a hung HTTP call): it returns
    when the test sets `release`."""

    name = "deaf_write"
    description = "a write that ignores its cancellation"
    effect = "write"
    identity = "intent"
    arguments = DeafWriteArgs

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()

    def run(self, ctx: ToolContext, args: Any) -> ToolResult:
        self.started.set()
        self.release.wait(30)
        return ToolResult.ok({"order": args.order})
