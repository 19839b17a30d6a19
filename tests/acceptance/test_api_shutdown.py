"""`orchestrator api` stopped by SIGTERM after a clean shutdown exits 0 (uvicorn re-raises the
signal it caught once it has shut down; without a handler of ours that is exit 143, which a
supervisor takes for a failure). A second signal, or a shutdown that fails, still does not."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

from tests.acceptance.fleet import ORCHESTRATOR
from tests.services import free_port


def test_a_sigterm_after_a_clean_shutdown_exits_0(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    env["ORCH_HOME"] = str(tmp_path / "home")
    log_path = tmp_path / "api.log"
    with log_path.open("wb") as log:
        api = subprocess.Popen(
            [ORCHESTRATOR, "api", "--port", str(port)], env=env, stdout=log, stderr=log
        )
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    url = f"http://127.0.0.1:{port}/readyz"
                    with urllib.request.urlopen(url, timeout=5) as response:
                        assert response.status == 200
                    break
                except OSError:
                    assert api.poll() is None, log_path.read_text()
                    assert time.monotonic() < deadline, log_path.read_text()
                    time.sleep(0.1)
            api.send_signal(signal.SIGTERM)
            code = api.wait(timeout=20)
        finally:
            if api.poll() is None:
                api.kill()
                api.wait(timeout=10)
    text = log_path.read_text()
    assert code == 0, text
    assert "Finished server process" in text, text
    assert "Traceback" not in text, text
