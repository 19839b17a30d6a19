"""`orchestrator demo` on a fresh folder with nothing configured: kill, recover, finish."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.acceptance.fleet import ORCHESTRATOR


def test_demo_recovers_from_a_killed_worker_and_completes(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORCH_", "LLM_"))}
    # A shell set up for the fleet (README: "Run it against Postgres and Redis") names a real
    # model; the demo's agent still follows its bundled script, never that server (here none).
    env.update(ORCH_MODEL="openai:qwen3-32b", LLM_BASE_URL="http://127.0.0.1:9/v1")
    result = subprocess.run(
        [ORCHESTRATOR, "demo"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=90
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "lease 3s, renewed every 1s, sweep every 1s" in out
    assert "agent: the bundled script" in out
    assert "killing worker-1 with SIGKILL mid-round" in out
    recovered = re.search(r"generation 2 started ([\d.]+)s after the kill", out)
    assert recovered is not None, out
    assert float(recovered.group(1)) <= 3 + 1 + 1
    assert re.search(r"^  1  lost ", out, re.MULTILINE), out
    assert re.search(r"^  2  completed ", out, re.MULTILINE), out
    assert "final status: completed" in out
    # The embedded store keeps what happened for the operator commands.
    listed = subprocess.run(
        [ORCHESTRATOR, "tasks", "list", "--json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert '"status": "completed"' in listed.stdout
    assert (tmp_path / ".orchestrator" / "orchestrator.db").is_file()


SECRET = "demo-s3cret-pw"


@pytest.mark.postgres
@pytest.mark.redis
def test_demo_masks_the_passwords_of_the_urls_it_prints(
    tmp_path: Path, pg_url: str, redis_url: str
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    env["ORCH_HOME"] = str(tmp_path / "home")
    # Trust authentication on the test server: the password is sent and ignored.
    env["ORCH_DATABASE_URL"] = pg_url.replace("://postgres@", f"://postgres:{SECRET}@")
    env["ORCH_REDIS_URL"] = redis_url.replace("redis://", f"redis://:{SECRET}@")
    # Too short to finish: what matters is what it printed first.
    result = subprocess.run(
        [ORCHESTRATOR, "demo", "--timeout", "0.5"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    out = result.stdout
    assert "  store: postgresql+psycopg://postgres:***@127.0.0.1:" in out, out + result.stderr
    assert "  broker: redis://:***@127.0.0.1:" in out, out + result.stderr
    assert SECRET not in out + result.stderr
    # It gave up, and says where its logs are: under ORCH_HOME, not the default folder.
    assert result.returncode == 1
    assert f"logs are in {tmp_path / 'home' / 'demo'}" in result.stderr, result.stderr
