"""Commands that cannot start say why in one line: a bad gateway spec, an unusable home,
a revision out of range."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ORCHESTRATOR = str(Path(sys.executable).with_name("orchestrator"))
CELERY = str(Path(sys.executable).with_name("celery"))


def _start_worker(tmp_path: Path, settings: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`orchestrator worker` started with only `settings` (and a home and a scripted model)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    env.update(
        {"ORCH_HOME": str(tmp_path / "home"), "ORCH_MODEL": f"scripted:{tmp_path}", **settings}
    )
    return subprocess.run(
        [ORCHESTRATOR, "worker", "--concurrency", "1"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=90,
    )


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        ("paths: [1", "not valid YAML"),
        ("openapi: 3.0.0\npaths: 7\n", "ORCH_GATEWAY_SPEC"),
    ],
)
def test_a_bad_gateway_spec_stops_the_worker_at_start(
    tmp_path: Path, document: str, expected: str
) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(document)
    result = _start_worker(
        tmp_path,
        {
            "ORCH_GATEWAY_SPEC": str(spec),
            "ORCH_GATEWAY_BASE_URL": "http://127.0.0.1:9",
        },
    )
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.startswith("ORCH_GATEWAY_SPEC")]
    assert len(lines) == 1, result.stderr
    assert expected in lines[0]
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("command", [["db", "upgrade"], ["tasks", "list"], ["worker"]])
def test_an_unusable_home_folder_is_one_line_naming_the_setting(
    tmp_path: Path, command: list[str]
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    env["ORCH_HOME"] = str(blocker / "home")
    env["ORCH_MODEL"] = f"scripted:{tmp_path}"  # a usable model: the home folder is what is wrong
    result = subprocess.run(
        [ORCHESTRATOR, *command], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "ORCH_HOME" in lines[0]


@pytest.mark.parametrize("revision", ["0", "-1", "99999999999999999999", "x"])
def test_plans_show_refuses_a_revision_out_of_range(tmp_path: Path, revision: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    env["ORCH_HOME"] = str(tmp_path / "home")
    result = subprocess.run(
        [ORCHESTRATOR, "plans", "show", "some-session", "--revision", revision],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "--revision" in result.stderr


def test_a_bad_data_source_declaration_stops_the_worker_at_start(tmp_path: Path) -> None:
    declaration = tmp_path / "sources.yaml"
    declaration.write_text("sources:\n - {name: a, description: d, kind: scada_sim, origin: live}")
    result = _start_worker(
        tmp_path,
        {
            "ORCH_DATA_SOURCES": str(declaration),
        },
    )
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.startswith("ORCH_DATA_SOURCES")]
    assert len(lines) == 1, result.stderr
    assert "synthetic" in lines[0]
    assert "Traceback" not in result.stderr


def test_a_source_slower_than_the_tool_timeout_stops_the_worker_at_start(tmp_path: Path) -> None:
    """The host would give every slow query of the source up before its own timeout answers."""
    spec = {
        "openapi": "3.0.3",
        "info": {"title": "utility backend", "version": "1"},
        "paths": {"/report": {"get": {"operationId": "getReport", "responses": {"200": {}}}}},
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    declaration = tmp_path / "sources.yaml"
    declaration.write_text(
        "sources:\n - {name: report, description: d, kind: http_json, origin: live, "
        "spec: spec.json, base_url: 'http://127.0.0.1:9', operation_id: getReport, "
        "timeout_seconds: 90}"
    )
    result = _start_worker(
        tmp_path,
        {
            "ORCH_DATA_SOURCES": str(declaration),
            "ORCH_TOOL_TIMEOUT_SECONDS": "60",
        },
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines() == [
        f"ORCH_DATA_SOURCES ({declaration}): report: timeout_seconds must be below "
        "ORCH_TOOL_TIMEOUT_SECONDS (90 >= 60), or the host gives every slow query up first"
    ]


@pytest.mark.parametrize("command", [["worker", "--concurrency", "1"], ["sweeper"]])
def test_a_metrics_port_in_use_is_one_line_naming_the_setting(
    tmp_path: Path, command: list[str]
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORCH_", "PROMETHEUS_"))}
    env.update({"ORCH_HOME": str(tmp_path / "home"), "ORCH_MODEL": f"scripted:{tmp_path}"})
    upgrade = subprocess.run([ORCHESTRATOR, "db", "upgrade"], env=env, cwd=tmp_path, timeout=60)
    assert upgrade.returncode == 0
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        env["ORCH_METRICS_PORT"] = str(taken.getsockname()[1])
        result = subprocess.run(
            [ORCHESTRATOR, *command],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=90,
        )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if "ORCH_METRICS_PORT" in line]
    assert len(lines) == 1, result.stderr
    assert "in use" in lines[0]


def test_celery_worker_on_an_unmigrated_store_stops_at_start_with_one_line(
    pg_empty_url: str, tmp_path: Path
) -> None:
    """`celery -A workers.celery_app worker` works as `orchestrator worker` does: a store that is
    not migrated stops it at start with one line, not a traceback and a worker that runs."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    env.update(
        ORCH_HOME=str(tmp_path / "home"),
        ORCH_MODEL=f"scripted:{tmp_path}",
        ORCH_DATABASE_URL=pg_empty_url,
        ORCH_REDIS_URL="redis://127.0.0.1:9/0",  # never reached: the store is checked first
    )
    try:
        result = subprocess.run(
            [CELERY, "-A", "workers.celery_app", "worker", "--concurrency", "1"],
            capture_output=True,
            text=True,
            env=env,
            cwd=Path(__file__).parents[2],
            timeout=20,
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"the worker went on running: {exc.stderr!r:.3000}") from None
    out = result.stdout + result.stderr
    assert result.returncode == 1, out[-3000:]
    assert "is not migrated" in out
    assert "orchestrator db upgrade" in out
    assert "Traceback" not in out
