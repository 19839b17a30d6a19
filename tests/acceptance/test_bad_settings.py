"""A bad setting stops the real `orchestrator` process with one line naming it and exit 2.

The cases of the settings that once passed validation and failed later (a Redis port that is
not a number, an unsupported database driver, an infinite or NaN duration).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ORCHESTRATOR = str(Path(sys.executable).with_name("orchestrator"))
SECRET = "s3cret-pw"


def run(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    merged = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    merged.pop("AGENT_INTERNAL_TOKEN", None)
    merged.update(env)
    return subprocess.run(
        [ORCHESTRATOR, *args], capture_output=True, text=True, env=merged, cwd=cwd, timeout=120
    )


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("ORCH_REDIS_URL", "redis://localhost:abc"),
        ("ORCH_REDIS_URL", f"redis://:{SECRET}@localhost:99999/0"),
        ("ORCH_DATABASE_URL", f"postgresql+psycopg2://orch:{SECRET}@localhost/orch"),
        ("ORCH_LEASE_SECONDS", "inf"),
        ("ORCH_SWEEP_SECONDS", "nan"),
        # httpx would send it as `back%20end`: every delivery would fail, silently.
        ("ORCH_WEBHOOK_URL", f"http://hooks:{SECRET}@back end/x"),
    ],
)
def test_bad_setting_is_one_line_and_exit_2(name: str, value: str, tmp_path: Path) -> None:
    result = run("db", "upgrade", env={name: value}, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert name in lines[0]
    assert "Traceback" not in result.stderr
    assert SECRET not in result.stderr + result.stdout
    assert not (tmp_path / ".orchestrator").exists()


@pytest.mark.parametrize(
    ("env", "named", "part"),
    [
        ({}, "ORCH_MODEL", "not set"),
        ({"ORCH_MODEL": "scripted:no-such-folder"}, "ORCH_MODEL", "no-such-folder"),
        ({"ORCH_MODEL": "gpt-4o"}, "ORCH_MODEL", "openai:MODEL"),
        ({"ORCH_MODEL": "openai:qwen3", "LLM_API_KEY": SECRET}, "LLM_BASE_URL", "needs"),
        # No scheme: every round would fail on a connection error after its retries.
        ({"ORCH_MODEL": "openai:qwen3", "LLM_BASE_URL": "vllm:8000/v1"}, "LLM_BASE_URL", "http"),
        (
            {"ORCH_MODEL": "openai:qwen3", "LLM_BASE_URL": f"http://u:{SECRET}@:8000/v1"},
            "LLM_BASE_URL",
            "host",
        ),
        # A key copied with its line ending: before, every round failed "the model server is
        # unreachable" after its retries, as httpx refused to send the header.
        (
            {
                "ORCH_MODEL": "openai:qwen3",
                "LLM_BASE_URL": "http://127.0.0.1:9/v1",
                "LLM_API_KEY": f"sk-{SECRET}\r\n",
            },
            "LLM_API_KEY",
            "a line break",
        ),
    ],
)
def test_a_worker_without_a_usable_model_refuses_to_start(
    tmp_path: Path, env: dict[str, str], named: str, part: str
) -> None:
    env = {"ORCH_HOME": str(tmp_path / "home"), **env}
    result = run("worker", "--concurrency", "1", env=env, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert f"invalid setting {named}: " in lines[0]
    assert part in lines[0]
    assert SECRET not in result.stderr + result.stdout
