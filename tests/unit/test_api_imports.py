"""An API process imports what serving HTTP needs, not the agent nor another back end's client.

`orchestrator api` starts with every route module imported and the app built; the suite starts
dozens of them. The agent's loop, its model clients and tools are imported when a question is
first asked of a task's collaboration session, redis-py only for a configured Redis, and the
broker (Celery) and psycopg not at all on the embedded store. Each case runs in a fresh
interpreter: this process has imported them all already.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent

PROBE = """
import asyncio, json, sys
from orchestrator.api import create_app
from orchestrator.settings import load_settings

app = create_app(load_settings(home=sys.argv[1]))


async def started_and_stopped():
    async with app.router.lifespan_context(app):
        pass


asyncio.run(started_and_stopped())
print(json.dumps(sorted(sys.modules)))
"""

#: Not imported to build and start an API on the embedded store.
NOT_AT_START = (
    "orchestrator.agent.host",
    "orchestrator.agent.loop",
    "orchestrator.agent.model",
    "orchestrator.tools.tasks",
    "httpx",
    "redis",
    "psycopg",
    "celery",
    "kombu",
)


def test_an_embedded_api_starts_without_the_agent_redis_or_psycopg(tmp_path: Path) -> None:
    """The collaboration service imported the agent's loop and its tools (0.24 s of CPU) and
    the readiness checks redis-py (0.1 s) at every start of an API."""
    from tests.cli_in_process import embedded_store

    home = tmp_path / "home"
    embedded_store(home)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORCH_", "LLM_"))}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(home)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    modules = json.loads(done.stdout.splitlines()[-1])
    assert "fastapi" in modules
    loaded = {
        prefix: [name for name in modules if name == prefix or name.startswith(prefix + ".")]
        for prefix in NOT_AT_START
    }
    assert {prefix: names for prefix, names in loaded.items() if names} == {}
