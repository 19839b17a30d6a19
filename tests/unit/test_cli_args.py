"""CLI arguments a first-time user gets wrong end in one line and exit code 2 before anything
starts: an address `orchestrator api` cannot listen on, a port already taken, a malformed
`tasks ask --idempotency-key`, a `demo --timeout` that is not a positive number. And `cleanup`
says everything it deleted."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from orchestrator.cli import main
from orchestrator.services.cleanup import CleanupReport


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):
        if name.startswith(("ORCH_", "LLM_")) or name == "AGENT_INTERNAL_TOKEN":
            monkeypatch.delenv(name)
    monkeypatch.setenv("ORCH_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("ORCH_API_TOKEN", "t0ken-for-the-test")
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """What uvicorn was asked to serve; nothing is served for real."""
    import uvicorn

    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kwargs: calls.append(kwargs))
    return calls


def run(*args: str) -> int:
    """`orchestrator ARGS` in this process: its exit code (argparse's usage errors exit)."""
    try:
        return main(list(args))
    except SystemExit as stop:
        return int(stop.code or 0)


def one_line_exit_2(code: int, capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_api_on_a_port_in_use_is_one_line_and_serves_nothing(
    taken_port: int, served: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    line = one_line_exit_2(run("api", "--port", str(taken_port)), capsys)
    assert f"127.0.0.1:{taken_port}" in line
    assert "in use" in line
    assert served == []


def test_api_on_a_host_that_does_not_resolve_is_one_line_and_serves_nothing(
    monkeypatch: pytest.MonkeyPatch,
    served: list[dict[str, Any]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Before: uvicorn started the app (and its Redis listener), failed to bind, and its
    # shutdown could hang for ever on that listener, deaf to SIGTERM.
    def no_such_host(*_args: Any, **_kwargs: Any) -> Any:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_such_host)
    line = one_line_exit_2(run("api", "--host", "nosuchhost.invalid"), capsys)
    assert "--host nosuchhost.invalid" in line
    assert "Name or service not known" in line
    assert served == []


def test_api_on_an_address_of_another_machine_is_one_line(
    served: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    line = one_line_exit_2(run("api", "--host", "192.0.2.1", "--port", "8000"), capsys)
    assert "192.0.2.1:8000" in line
    assert served == []


def test_api_with_an_empty_host_is_refused(
    served: list[dict[str, Any]],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # "" would listen on every interface, which nobody means by typing --host "". Said as
    # such even without a token (not as a refusal to listen without one).
    monkeypatch.delenv("ORCH_API_TOKEN", raising=False)
    monkeypatch.delenv("ORCH_OPERATORS", raising=False)
    line = one_line_exit_2(run("api", "--host", ""), capsys)
    assert "--host is empty" in line
    assert served == []


def test_api_on_a_free_loopback_port_still_serves(served: list[dict[str, Any]]) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert run("api", "--port", str(port)) == 0
    assert [(call["host"], call["port"]) for call in served] == [("127.0.0.1", port)]


@pytest.mark.parametrize("key", ["has space", "x" * 201, "caf\u00e9"])
def test_a_malformed_idempotency_key_is_a_usage_error(
    key: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Checked before the store or the model is reached: no task, no store, still exit 2.
    line = one_line_exit_2(
        run("tasks", "ask", "no-such-task", "q", "--idempotency-key", key), capsys
    )
    assert "--idempotency-key" in line


@pytest.mark.parametrize("value", ["-1", "0", "nan", "soon"])
def test_a_demo_timeout_that_is_not_a_positive_number_is_a_usage_error(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: the demo started its worker and sweeper, then gave up at once (exit 1).
    line = one_line_exit_2(run("demo", "--timeout", value), capsys)
    assert "--timeout" in line


def test_cleanup_says_how_many_transcript_entries_it_deleted(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    report = CleanupReport(
        enabled=True,
        reason="",
        retention_days=30,
        receipts_deleted=2,
        batches=1,
        cutoff=datetime(2026, 11, 4, tzinfo=UTC),
        orphans_deleted=1,
        of_finished_tasks_deleted=1,
        transcript_entries_deleted=7,
    )
    monkeypatch.setattr("orchestrator.services.cleanup.run_cleanup", lambda *_a, **_k: report)
    assert run("cleanup") == 0
    out = capsys.readouterr().out
    assert "2 invocation receipts" in out
    assert "7 transcript entries" in out


def test_actions_list_takes_a_status_or_all_not_both(capsys: pytest.CaptureFixture[str]) -> None:
    line = one_line_exit_2(run("actions", "list", "--status", "approved", "--all"), capsys)
    assert "--all" in line
    assert "--status" in line
