"""The fleet files: docker-compose.yml read as YAML, and `docker compose config` when installed."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.cli import build_parser
from orchestrator.cli.fleet import HEARTBEAT
from orchestrator.settings import load_settings, setting_names

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
APPS = ("migrate", "api", "worker", "sweeper")
LONG_RUNNING = ("api", "worker", "sweeper")


def _compose() -> dict[str, Any]:
    loaded = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(loaded, dict)
    return loaded


def _services() -> dict[str, dict[str, Any]]:
    services = _compose()["services"]
    assert isinstance(services, dict)
    return services


def _command(service: dict[str, Any]) -> list[str]:
    command = service["command"]
    return command.split() if isinstance(command, str) else [str(part) for part in command]


def test_every_role_of_the_fleet_is_a_service() -> None:
    assert set(_services()) == {"postgres", "redis", *APPS}


def test_backing_services_have_health_checks() -> None:
    services = _services()
    assert services["postgres"]["image"].startswith("postgres:15")
    assert services["redis"]["image"].startswith("redis:7")
    for name in ("postgres", "redis"):
        check = services[name]["healthcheck"]
        assert check["test"], name
        assert check["retries"] >= 1, name
    assert "pg_isready" in " ".join(services["postgres"]["healthcheck"]["test"])
    assert "ping" in services["redis"]["healthcheck"]["test"]


def test_redis_keeps_its_data_and_never_evicts() -> None:
    command = _command(_services()["redis"])
    assert command[0] == "redis-server"
    flags = dict(zip(command[1::2], command[2::2], strict=True))
    assert flags["--appendonly"] == "yes"
    # An evicted lease key would let a second worker start the same task.
    assert flags["--maxmemory-policy"] == "noeviction"


def test_migrate_runs_once_after_postgres_is_healthy() -> None:
    migrate = _services()["migrate"]
    assert _command(migrate) == ["db", "upgrade"]
    assert migrate["restart"] == "no"
    assert migrate["depends_on"]["postgres"]["condition"] == "service_healthy"


def test_apps_wait_for_healthy_services_and_a_finished_migration() -> None:
    services = _services()
    for name in LONG_RUNNING:
        depends = services[name]["depends_on"]
        assert depends["postgres"]["condition"] == "service_healthy", name
        assert depends["redis"]["condition"] == "service_healthy", name
        assert depends["migrate"]["condition"] == "service_completed_successfully", name


def test_apps_run_the_orchestrator_image_against_postgres_and_redis() -> None:
    services = _services()
    assert _command(services["api"]) == ["api", "--host", "0.0.0.0", "--port", "8000"]
    assert _command(services["worker"]) == ["worker"]
    assert _command(services["sweeper"]) == ["sweeper"]
    images = {services[name]["image"] for name in APPS}
    assert len(images) == 1
    for name in APPS:
        environment = services[name]["environment"]
        assert environment["ORCH_DATABASE_URL"].startswith("postgresql+psycopg://"), name
        assert "@postgres:5432/" in environment["ORCH_DATABASE_URL"], name
        assert environment["ORCH_REDIS_URL"] == "redis://redis:6379/0", name


def test_every_app_command_is_one_the_cli_accepts() -> None:
    parser = build_parser()
    for name in APPS:
        arguments = parser.parse_args(_command(_services()[name]))
        assert callable(getattr(arguments, "handler", None)), name


def test_api_requires_its_token_from_the_environment() -> None:
    api = _services()["api"]
    # `${VAR:?message}`: compose refuses to start anything while the token is unset.
    assert api["environment"]["ORCH_API_TOKEN"].startswith("${ORCH_API_TOKEN:?")
    assert "healthz" in " ".join(api["healthcheck"]["test"])
    for name in ("worker", "sweeper", "migrate"):
        assert "ORCH_API_TOKEN" not in _services()[name]["environment"], name


MODEL_ENV = {
    "ORCH_MODEL": "openai:test",
    "LLM_BASE_URL": "http://model:8000/v1",
    "POSTGRES_PASSWORD": "a-test-password",
}


def test_the_store_password_is_required_from_the_environment_not_shipped() -> None:
    """No default password in the file: compose refuses to start without POSTGRES_PASSWORD."""
    services = _services()
    assert services["postgres"]["environment"]["POSTGRES_PASSWORD"].startswith(
        "${POSTGRES_PASSWORD:?"
    )
    for name in APPS:
        url = services[name]["environment"]["ORCH_DATABASE_URL"]
        assert ":${POSTGRES_PASSWORD:?" in url, name
    assert ":-orch}" not in COMPOSE.read_text()


def test_the_readme_s_compose_command_sets_every_required_variable() -> None:
    """The fleet command the README shows works as shown: it sets every `${VAR:?...}`."""
    required = set(re.findall(r"\$\{(\w+):\?", COMPOSE.read_text()))
    assert {"ORCH_API_TOKEN", "ORCH_MODEL", "LLM_BASE_URL", "POSTGRES_PASSWORD"} <= required
    lines = (ROOT / "README.md").read_text().splitlines()
    commands = []
    for index, line in enumerate(lines):
        if "docker compose up" in line:
            start = index
            while start > 0 and lines[start - 1].rstrip().endswith("\\"):
                start -= 1
            commands.append(" ".join(lines[start : index + 1]))
    assert commands
    for command in commands:
        missing = [name for name in sorted(required) if f"{name}=" not in command]
        assert not missing, (command, missing)


def test_the_model_settings_reach_every_app_and_the_model_is_required() -> None:
    services = _services()
    for name in APPS:
        environment = services[name]["environment"]
        # `${VAR:?message}`: no silent default model; compose refuses to start without one.
        assert environment["ORCH_MODEL"].startswith("${ORCH_MODEL:?"), name
        assert environment["LLM_BASE_URL"].startswith("${LLM_BASE_URL:?"), name
        # The key comes from the environment, never written in the file.
        assert environment["LLM_API_KEY"] == "${LLM_API_KEY:-}", name
        for setting in (
            "LLM_CONTEXT_WINDOW",
            "LLM_MAX_OUTPUT_TOKENS",
            "LLM_TIMEOUT_SECONDS",
            "LLM_MAX_RETRIES",
        ):
            # The shell's value or none: a default written here would shadow the code's own
            # (LLM_MAX_OUTPUT_TOKENS unset is at most a quarter of the window).
            assert environment[setting] is None, (name, setting)


def test_every_llm_setting_is_passed_through_to_every_app() -> None:
    """The README: `LLM_API_KEY` and the other `LLM_*` settings are passed through when set."""
    llm = sorted(name for name in setting_names() if name.startswith("LLM_"))
    assert "LLM_TEMPERATURE" in llm
    for name in APPS:
        environment = _services()[name]["environment"]
        missing = [setting for setting in llm if setting not in environment]
        assert not missing, (name, missing)
        # A bare name (no value) passes the shell's value, and nothing when it is unset: an
        # empty LLM_TEMPERATURE would be refused, where unset means the server's default.
        assert environment["LLM_TEMPERATURE"] is None, name


def test_the_outbox_and_operations_settings_are_passed_through() -> None:
    """A compose fleet's sweeper delivers once ORCH_ACTIONS_URL or ORCH_WEBHOOK_URL is set in
    the shell (the README: a fleet that runs a sweeper already delivers)."""
    passed = (
        "ORCH_ACTIONS_URL",
        "ORCH_ACTIONS_SECRET",
        "ORCH_WEBHOOK_URL",
        "ORCH_WEBHOOK_SECRET",
        "ORCH_LOG_FORMAT",
        "ORCH_METRICS_PORT",
    )
    for name in APPS:
        environment = _services()[name]["environment"]
        for setting in passed:
            assert setting in environment, (name, setting)
            # The shell's value, never one written in the file (the secret above all).
            assert environment[setting] is None, (name, setting)


def test_worker_and_sweeper_have_health_checks() -> None:
    services = _services()
    worker = " ".join(services["worker"]["healthcheck"]["test"])
    assert "celery -A workers.celery_app inspect ping" in worker
    assert "celery@$$HOSTNAME" in worker  # this container's node, not any node
    sweeper = " ".join(services["sweeper"]["healthcheck"]["test"])
    assert HEARTBEAT in sweeper
    for name in ("worker", "sweeper"):
        assert services[name]["healthcheck"]["retries"] >= 1, name


def test_docker_compose_v1_accepts_the_file() -> None:
    # Debian's docker-compose package; scripts/ensure-services.sh installs it under `make test`.
    binary = shutil.which("docker-compose")
    assert binary, "docker-compose is not installed: run scripts/ensure-services.sh as root"
    env = {key: value for key, value in os.environ.items() if not key.startswith(("ORCH_", "LLM_"))}
    command = [binary, "-f", str(COMPOSE), "config", "-q"]
    accepted = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=60,
        env={**env, **MODEL_ENV, "ORCH_API_TOKEN": "test-token"},
        cwd=ROOT,
    )
    assert accepted.returncode == 0, accepted.stderr
    refused = subprocess.run(
        command, capture_output=True, text=True, timeout=60, env={**env, **MODEL_ENV}, cwd=ROOT
    )
    assert refused.returncode != 0
    assert "ORCH_API_TOKEN" in refused.stderr
    no_password = {k: v for k, v in MODEL_ENV.items() if k != "POSTGRES_PASSWORD"}
    refused = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=60,
        env={**env, **no_password, "ORCH_API_TOKEN": "test-token"},
        cwd=ROOT,
    )
    assert refused.returncode != 0
    assert "POSTGRES_PASSWORD" in refused.stderr


def _resolved_environments(shell: dict[str, str]) -> dict[str, dict[str, str]]:
    """Each app's environment as `docker-compose config` resolves it from `shell`."""
    binary = shutil.which("docker-compose")
    assert binary, "docker-compose is not installed: run scripts/ensure-services.sh as root"
    env = {key: value for key, value in os.environ.items() if not key.startswith(("ORCH_", "LLM_"))}
    config = subprocess.run(
        [binary, "-f", str(COMPOSE), "config"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**env, **MODEL_ENV, "ORCH_API_TOKEN": "test-token", **shell},
        cwd=ROOT,
        check=True,
    )
    services = yaml.safe_load(config.stdout)["services"]
    return {
        service: {
            name: str(value)
            for name, value in services[service]["environment"].items()
            if value is not None
        }
        for service in APPS
    }


def test_a_small_context_window_alone_starts_the_compose_fleet(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The advice of docs/model.md for a local 4k model, `LLM_CONTEXT_WINDOW` alone, holds in the
    compose fleet too: an output budget the shell did not set stays unset, a quarter of the
    window, rather than the file's 4096, which a 4,096-token window refuses at start."""
    for name in os.environ:
        if name.startswith(("ORCH_", "LLM_")):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)  # no .env of the developer's
    for environment in _resolved_environments({"LLM_CONTEXT_WINDOW": "4096"}).values():
        for name, value in environment.items():
            monkeypatch.setenv(name, value)
        settings = load_settings()
        assert (settings.llm_context_window, settings.llm_max_output_tokens) == (4096, 1024)


def test_worker_can_be_scaled() -> None:
    worker = _services()["worker"]
    # Either would make `--scale worker=N` fail: names and host ports must be unique.
    assert "container_name" not in worker
    assert "ports" not in worker


def test_dockerfile_builds_the_package_with_the_cli_as_entrypoint() -> None:
    lines = [
        line.strip()
        for line in (ROOT / "Dockerfile").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    assert lines[0] == "FROM python:3.11-slim"
    assert 'ENTRYPOINT ["orchestrator"]' in lines
    assert any("pip install" in line and "-e ." in line for line in lines)
    assert any(line.startswith("USER ") and line != "USER root" for line in lines)


def test_dockerignore_keeps_state_and_secrets_out_of_the_image() -> None:
    ignored = set((ROOT / ".dockerignore").read_text().split())
    assert {".git", ".venv", ".env", ".orchestrator"} <= ignored


def _docker_compose_works() -> bool:
    """True when a docker client with the compose plugin is installed and answers."""
    if shutil.which("docker") is None:
        return False
    try:
        probe = subprocess.run(
            ["docker", "compose", "version"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


def test_docker_compose_accepts_the_file() -> None:
    # The YAML checks always run; `docker compose config` only where the plugin exists (it needs
    # no daemon), so this test never skips and never passes on an unreadable file.
    assert _compose()["services"]
    if not _docker_compose_works():
        return
    env = {key: value for key, value in os.environ.items() if not key.startswith("ORCH_")}
    command = ["docker", "compose", "-f", str(COMPOSE), "config", "-q"]
    accepted = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=60,
        env={**env, **MODEL_ENV, "ORCH_API_TOKEN": "test-token"},
        cwd=ROOT,
    )
    assert accepted.returncode == 0, accepted.stderr
    refused = subprocess.run(
        command, capture_output=True, text=True, timeout=60, env={**env, **MODEL_ENV}, cwd=ROOT
    )
    assert refused.returncode != 0
    assert "ORCH_API_TOKEN" in refused.stderr
