"""Real fleet processes for acceptance tests: `orchestrator worker`, `sweeper`, `outbox dispatch`
and `api`."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from orchestrator.runtime import Runtime
from tests.executions_support import runtime_for
from tests.services import on_a_free_port, wait_until_answering
from workers.celery_app import CeleryDispatcher, make_celery

__all__ = [
    "ORCHESTRATOR",
    "Fleet",
    "answering_api_on",
    "celery_runtime",
    "fleet_env",
    "running_fleet",
]

ORCHESTRATOR = str(Path(sys.executable).with_name("orchestrator"))


def answering_api_on(port: int, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """`orchestrator api --port PORT` with `env`, its output in `log` (written anew), once it
    answers; killed when it does not (`PortTaken` when another process had the port: give this
    to `on_a_free_port` for a new one)."""
    with log.open("wb") as out:
        api = subprocess.Popen(
            [ORCHESTRATOR, "api", "--port", str(port)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_until_answering(f"http://127.0.0.1:{port}", api, log)
    except AssertionError:
        if api.poll() is None:
            api.kill()
        api.wait(timeout=10)
        raise
    return api


@dataclass
class Fleet:
    """Starts, kills and finally stops the processes of one test; logs go to `folder`."""

    env: dict[str, str]
    folder: Path
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _logs: list[IO[bytes]] = field(default_factory=list)
    _paths: dict[int, Path] = field(default_factory=dict)

    def _start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        merged = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
        merged.update(self.env)
        path = self.folder / f"{name}-{len(self.processes)}.log"
        log = path.open("wb")
        process = subprocess.Popen(
            [ORCHESTRATOR, *args],
            env=merged,
            cwd=self.folder,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: a kill takes the pool children too
        )
        self.processes.append(process)
        self._logs.append(log)
        self._paths[process.pid] = path
        return process

    def log_of(self, process: subprocess.Popen[bytes]) -> Path:
        """The file a process of this fleet writes its output to."""
        return self._paths[process.pid]

    def ready(self, process: subprocess.Popen[bytes]) -> bool:
        """True once a Celery worker says it is ready to take wake-ups."""
        return " ready." in self.log_of(process).read_text(errors="replace")

    def worker(self, concurrency: int = 2, *more: str) -> subprocess.Popen[bytes]:
        return self._start(
            "worker", "worker", "--concurrency", str(concurrency), "--loglevel", "INFO", *more
        )

    def sweeper(self) -> subprocess.Popen[bytes]:
        return self._start("sweeper", "sweeper")

    def dispatcher(self) -> subprocess.Popen[bytes]:
        return self._start("dispatcher", "outbox", "dispatch")

    def api(self, port: int) -> subprocess.Popen[bytes]:
        return self._start("api", "api", "--port", str(port))

    def answering_api(self) -> tuple[subprocess.Popen[bytes], str]:
        """`orchestrator api` on a free port (a new one if another process took it first),
        once it answers: the process and its URL."""

        def start(port: int) -> tuple[subprocess.Popen[bytes], str]:
            process = self.api(port)
            url = f"http://127.0.0.1:{port}"
            wait_until_answering(url, process, self.log_of(process))
            return process, url

        return on_a_free_port(start)

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        merged = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
        merged.update(self.env)
        return subprocess.run(
            [ORCHESTRATOR, *args],
            env=merged,
            cwd=self.folder,
            capture_output=True,
            text=True,
            timeout=60,
        )

    @staticmethod
    def kill(process: subprocess.Popen[bytes]) -> None:
        """SIGKILL the whole process group, as a dead machine would."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGTERM)
                    process.wait(timeout=10)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    self.kill(process)
        for log in self._logs:
            log.close()

    def logs(self) -> str:
        return "\n".join(
            f"--- {path.name}\n{path.read_text(errors='replace')[-4000:]}"
            for path in sorted(self.folder.glob("*.log"))
        )


def fleet_env(pg_url: str, redis_url: str, tmp_path: Path) -> dict[str, str]:
    """A fleet's environment on the test's Postgres and Redis, its home under `tmp_path`;
    add the test's own settings with `|`."""
    return {
        "ORCH_DATABASE_URL": pg_url,
        "ORCH_REDIS_URL": redis_url,
        "ORCH_HOME": str(tmp_path / "home"),
    }


@contextlib.contextmanager
def running_fleet(env: dict[str, str], folder: Path) -> Iterator[Fleet]:
    """A `Fleet` whose processes are all stopped when the block ends."""
    fleet = Fleet(env, folder)
    try:
        yield fleet
    finally:
        fleet.stop()


@contextlib.contextmanager
def celery_runtime(pg_url: str, redis_url: str, scripts: Path) -> Iterator[Runtime]:
    """The test's own runtime on the fleet's store, publishing wake-ups to the fleet's broker."""
    runtime, _ = runtime_for(pg_url, scripts, redis_url=redis_url)
    runtime.dispatcher = CeleryDispatcher(make_celery(runtime.settings))
    try:
        yield runtime
    finally:
        runtime.close()
