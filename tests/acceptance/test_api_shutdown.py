"""`orchestrator api` stopped by SIGTERM after a clean shutdown exits 0 (uvicorn re-raises the
signal it caught once it has shut down; without a handler of ours that is exit 143, which a
supervisor takes for a failure), and a readiness check that hangs on the store does not hold
the stop."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.acceptance.fleet import answering_api_on
from tests.services import on_a_free_port


def stop_after(tmp_path: Path, env: dict[str, str], expected_status: int) -> tuple[int, float, str]:
    """Start the API, wait until /readyz answers `expected_status`, send SIGTERM; the exit
    code, the seconds the stop took, and the log."""
    log_path = tmp_path / "api.log"

    def start(port: int) -> tuple[subprocess.Popen[bytes], int]:
        return answering_api_on(port, env, log_path), port

    api, port = on_a_free_port(start)  # a new port if another process took it first
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                url = f"http://127.0.0.1:{port}/readyz"
                with urllib.request.urlopen(url, timeout=10) as response:
                    status = response.status
            except urllib.error.HTTPError as exc:
                status = exc.code
            except OSError:
                assert api.poll() is None, log_path.read_text()
                assert time.monotonic() < deadline, log_path.read_text()
                time.sleep(0.1)
                continue
            break
        assert status == expected_status, log_path.read_text()
        started = time.monotonic()
        api.send_signal(signal.SIGTERM)
        code = api.wait(timeout=30)
        took = time.monotonic() - started
    finally:
        if api.poll() is None:
            api.kill()
            api.wait(timeout=10)
    return code, took, log_path.read_text()


def base_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    env["ORCH_HOME"] = str(tmp_path / "home")
    return env


def test_a_sigterm_after_a_clean_shutdown_exits_0(tmp_path: Path) -> None:
    code, _, text = stop_after(tmp_path, base_env(tmp_path), 200)
    assert code == 0, text
    assert "Finished server process" in text, text
    assert "Traceback" not in text, text


def test_a_readiness_check_hanging_on_the_store_does_not_hold_the_stop(tmp_path: Path) -> None:
    # A store that takes the connection and never answers: the check gives up after 2 s with a
    # 503; its thread waits on (the 10 s connect timeout) but must not keep the process alive.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        env = base_env(tmp_path)
        env["ORCH_DATABASE_URL"] = (
            f"postgresql+psycopg://orch:pw@127.0.0.1:{silent.getsockname()[1]}/orch"
        )
        code, took, text = stop_after(tmp_path, env, 503)
    assert code == 0, text
    assert took < 5, (took, text)
    assert "Traceback" not in text, text
