"""`orchestrator demo` on a fresh folder with nothing configured: kill, recover, finish."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

from tests.acceptance.fleet import ORCHESTRATOR

SECRET = "demo-s3cret-pw"


def test_demo_recovers_from_a_killed_worker_and_completes(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORCH_", "LLM_"))}
    # A shell set up for the fleet (README: "Run it against Postgres and Redis") names a real
    # model, the fleet's store and broker and its business backend; the demo uses none of them
    # (here nothing answers at those addresses): its agent follows its bundled script on the
    # embedded store, where no worker of the fleet takes its task.
    env.update(
        ORCH_MODEL="openai:qwen3-32b",
        LLM_BASE_URL="http://127.0.0.1:9/v1",
        ORCH_DATABASE_URL=f"postgresql+psycopg://orch:{SECRET}@127.0.0.1:9/orchestrator",
        ORCH_REDIS_URL=f"redis://:{SECRET}@127.0.0.1:9/0",
        ORCH_WEBHOOK_URL="http://127.0.0.1:9/events",
        ORCH_WEBHOOK_SECRET=SECRET,
    )
    result = subprocess.run(
        [ORCHESTRATOR, "demo"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=90
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert SECRET not in out + result.stderr
    home = (tmp_path / ".orchestrator").resolve()
    assert f"  store: sqlite:///{home / 'orchestrator.db'}" in out, out
    assert f"  broker: Kombu filesystem transport in {Path('.orchestrator')}" in out, out
    assert "(ORCH_DATABASE_URL and ORCH_REDIS_URL of this shell are not used by the demo)" in out
    assert "lease 3s, renewed every 1s, sweep every 1s" in out
    assert "agent: the bundled script" in out
    assert "killing worker-1 with SIGKILL mid-round" in out
    recovered = re.search(r"generation 2 started ([\d.]+)s after the kill", out)
    assert recovered is not None, out
    assert float(recovered.group(1)) <= 3 + 1 + 1
    assert re.search(r"^  1  lost ", out, re.MULTILINE), out
    assert re.search(r"^  2  completed ", out, re.MULTILINE), out
    assert "final status: completed" in out
    # The embedded store keeps what happened for the operator commands, read in the same shell
    # as the demo's last line says.
    hint = re.search(r"^look again with: (.*); (.*)$", out, re.MULTILINE)
    assert hint is not None, out
    assert hint.group(1) == "ORCH_DATABASE_URL= ORCH_REDIS_URL= orchestrator tasks list"
    listed = subprocess.run(
        ["env", *shlex.split(hint.group(1).replace("orchestrator", ORCHESTRATOR)), "--json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert '"status": "completed"' in listed.stdout, listed.stdout + listed.stderr
    assert (tmp_path / ".orchestrator" / "orchestrator.db").is_file()


def test_a_demo_that_gives_up_says_where_its_logs_are(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORCH_", "LLM_"))}
    env["ORCH_HOME"] = str(tmp_path / "home")
    # Too short to finish.
    result = subprocess.run(
        [ORCHESTRATOR, "demo", "--timeout", "0.5"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert "not used by the demo" not in result.stdout  # nothing of a fleet's was set
    # It gave up, and says where its logs are: under ORCH_HOME, not the default folder.
    assert result.returncode == 1
    assert f"logs are in {tmp_path / 'home' / 'demo'}" in result.stderr, result.stderr


def test_a_fleet_store_named_in_the_env_file_is_not_used_either(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORCH_", "LLM_"))}
    (tmp_path / ".env").write_text(
        f"ORCH_DATABASE_URL=postgresql+psycopg://orch:{SECRET}@127.0.0.1:9/orchestrator\n"
    )
    result = subprocess.run(
        [ORCHESTRATOR, "demo", "--timeout", "0.5"],  # what matters is what it printed first
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert "(ORCH_DATABASE_URL of this shell is not used by the demo)" in result.stdout
    assert "  store: sqlite:///" in result.stdout
    assert SECRET not in result.stdout + result.stderr
