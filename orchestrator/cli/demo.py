"""`orchestrator demo`: a real worker killed mid-round, the sweeper's recovery, the finished task.

Everything runs as real processes on the embedded default (a SQLite store and a file-system
broker under ORCH_HOME), with short lease settings that the demo prints. A shell set up for the
fleet names its Postgres, Redis and business backend: the demo uses none of them, or the fleet's
workers would take its task (and run it on the real model) while the demo kills its own.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, TypeVar

from orchestrator.cli.common import CommandFailed, load, mask_url
from orchestrator.cli.plans import render_tree
from orchestrator.demo import DEMO_CONTEXT, DEMO_TASK_TYPE, SCRIPTS

if TYPE_CHECKING:
    from orchestrator.runtime import Runtime

__all__ = ["register"]

#: The demo's short leases, unless the environment sets its own.
DEMO_SETTINGS = {
    "ORCH_LEASE_SECONDS": "3",
    "ORCH_LEASE_RENEW_SECONDS": "1",
    "ORCH_SWEEP_SECONDS": "1",
}
#: Always the bundled script: a shell set up for the fleet names a real model (ORCH_MODEL,
#: LLM_BASE_URL), and the demo waits on the script's steps, which no real model follows.
DEMO_MODEL = f"scripted:{SCRIPTS}"
#: A fleet's services, blanked for the demo (empty is unset, and beats a `.env` file): its
#: store and broker, where its workers would take the demo's task; its business backend, which
#: would be sent the demo's events; its metrics port, which its worker holds.
FLEET_SETTINGS = {
    "ORCH_DATABASE_URL": "",
    "ORCH_REDIS_URL": "",
    "ORCH_ACTIONS_URL": "",
    "ORCH_WEBHOOK_URL": "",
    "ORCH_METRICS_PORT": "0",
}

T = TypeVar("T")


def register(commands: Any) -> None:
    demo = commands.add_parser("demo", help="watch a worker die mid-round and the task recover")
    demo.add_argument(
        "--timeout",
        type=_seconds,
        default=50.0,
        help="give up after this many seconds (default 50)",
    )
    demo.set_defaults(handler=_demo)


def _seconds(text: str) -> float:
    """An argparse `type`: a positive number of seconds, else a one-line usage error."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < value <= 3600:  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be above 0 and at most 3600, not {text}")
    return value


class _Processes:
    def __init__(self, folder: Path, env: dict[str, str]) -> None:
        self.folder = folder
        self.env = env
        self.running: list[tuple[subprocess.Popen[bytes], IO[bytes]]] = []
        self.logs: dict[int, Path] = {}

    def start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        log = (self.folder / f"{name}.log").open("wb")
        process = subprocess.Popen(
            [sys.executable, "-m", "orchestrator", *args],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.running.append((process, log))
        self.logs[process.pid] = self.folder / f"{name}.log"
        return process

    def ready(self, process: subprocess.Popen[bytes]) -> bool:
        """True once the Celery worker says it is ready to take wake-ups."""
        return " ready." in self.logs[process.pid].read_text(errors="replace")

    @staticmethod
    def kill(process: subprocess.Popen[bytes]) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)

    def stop_all(self) -> None:
        for process, log in self.running:
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGTERM)
                    process.wait(timeout=10)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    self.kill(process)
            log.close()


def _wait(predicate: Callable[[], T | None], deadline: float, what: str, logs: Path) -> T:
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise CommandFailed(f"demo: timed out waiting for {what}; logs are in {logs}")
        time.sleep(0.1)


def _say(text: str) -> None:
    print(text, flush=True)


def _demo(args: argparse.Namespace) -> int:
    from orchestrator.runtime import build_runtime
    from orchestrator.services.tasks import Trigger
    from orchestrator.settings import load_settings
    from orchestrator.store import migrations

    os.environ.update({k: v for k, v in DEMO_SETTINGS.items() if k not in os.environ})
    own_model = os.environ.get("ORCH_MODEL")
    os.environ["ORCH_MODEL"] = DEMO_MODEL
    # As the shell (its environment, or a `.env` file) configures them, before they are blanked.
    configured = load()
    fleet = [
        name
        for name, value in (
            ("ORCH_DATABASE_URL", configured.database_url),
            ("ORCH_REDIS_URL", configured.redis_url),
        )
        if value
    ]
    os.environ.update(FLEET_SETTINGS)
    settings = load()
    folder = (settings.home / "demo").resolve()
    folder.mkdir(parents=True, exist_ok=True)
    migrations.upgrade(settings.store_url)
    _say("condition-orchestrator demo")
    # Its own store (a SQLite path under ORCH_HOME), masked as any URL printed.
    _say(f"  store: {mask_url(settings.store_url)}")
    _say(f"  broker: Kombu filesystem transport in {settings.home}")
    if fleet:
        verb = "are" if len(fleet) > 1 else "is"
        _say(f"  ({' and '.join(fleet)} of this shell {verb} not used by the demo)")
    _say(
        f"  demo lease settings: lease {settings.lease_seconds:g}s, renewed every "
        f"{settings.lease_renew_seconds:g}s, sweep every {settings.sweep_seconds:g}s "
        "(production defaults: 120s, 40s, 15s)"
    )
    ignored = f" (ORCH_MODEL={own_model} is not used by the demo)" if own_model else ""
    _say(f"  agent: the bundled script {SCRIPTS}{ignored}")
    env = dict(os.environ)
    processes = _Processes(folder, env)
    rt = build_runtime(load_settings())
    started = time.monotonic()
    deadline = started + args.timeout
    try:
        worker = processes.start("worker-1", "worker", "--concurrency", "1", "--loglevel", "INFO")
        processes.start("sweeper", "sweeper")
        _say(f"started worker-1 (pid {worker.pid}) and a sweeper")
        task = rt.tasks.trigger(
            Trigger(
                task_type=DEMO_TASK_TYPE,
                title="Brown water at 12 Mill Lane",
                context=DEMO_CONTEXT,
                trigger_id=f"demo-{uuid.uuid4().hex[:12]}",
            )
        ).task
        _say(f"triggered task {task.task_id} ({DEMO_TASK_TYPE})")
        _wait(lambda: _revision(rt, task.task_id, 1) >= 1, deadline, "generation 1 to plan", folder)
        _say("generation 1 is running on worker-1 and published its first plan")
        standby = processes.start("worker-2", "worker", "--concurrency", "1", "--loglevel", "INFO")
        _wait(lambda: processes.ready(standby), deadline, "worker-2 to be ready", folder)
        _say(f"worker-2 (pid {standby.pid}) is ready; killing worker-1 with SIGKILL mid-round")
        processes.kill(worker)
        killed = time.monotonic()
        _say(
            "waiting for the sweeper to find worker-1's process gone and requeue the task "
            "(on the same host it does not wait for the lease to run out)"
        )
        _wait(lambda: _started(rt, task.task_id, 2), deadline, "generation 2 to start", folder)
        _say(f"generation 2 started {time.monotonic() - killed:.1f}s after the kill")
        final = _wait(lambda: _finished(rt, task.task_id), deadline, "the task to finish", folder)
        _say(f"task finished as {final} in {time.monotonic() - started:.1f}s\n")
        _summary(rt, task.task_id)
    finally:
        processes.stop_all()
        rt.close()
    # In a fleet's shell a bare `orchestrator tasks list` reads the fleet's store.
    embedded = "".join(f"{name}= " for name in fleet)
    _say(
        f"\nlook again with: {embedded}orchestrator tasks list; "
        f"{embedded}orchestrator tasks show {task.task_id}"
    )
    return 0


def _revision(rt: Runtime, task_id: str, generation: int) -> int:
    from orchestrator.store import executions as execution_store
    from orchestrator.store import plans as plan_store

    with rt.db.transaction(readonly=True) as conn:
        execution = execution_store.get_execution(conn, task_id, generation)
        if execution is None:
            return 0
        return plan_store.latest_revision_number(conn, execution.session_id)


def _started(rt: Runtime, task_id: str, generation: int) -> bool:
    from orchestrator.store import executions as execution_store

    with rt.db.transaction(readonly=True) as conn:
        execution = execution_store.get_execution(conn, task_id, generation)
    return execution is not None and execution.started_at is not None


def _finished(rt: Runtime, task_id: str) -> str | None:
    status = rt.tasks.get(task_id).status
    return status if status in ("completed", "failed", "waiting", "cancelled") else None


def _summary(rt: Runtime, task_id: str) -> None:
    from orchestrator.store import plans as plan_store

    view = rt.tasks.explain(task_id)
    _say("generations:")
    for ex in view["executions"]:
        _say(f"  {ex['generation']}  {ex['outcome'] or 'running':10} {ex['reason'] or ''}")
        with rt.db.transaction(readonly=True) as conn:
            summaries = plan_store.list_summaries(conn, ex["session_id"])
        for summary in summaries:
            counts = ", ".join(f"{k} {v}" for k, v in summary["status_counts"].items() if v)
            _say(f"     plan revision {summary['revision']}: {summary['reason']} ({counts})")
    plan = view["plan"]
    if plan:
        _say(f"\nlatest plan of generation {view['generation']} (revision {plan['revision']}):")
        for line in render_tree(plan["nodes"], plan["edges"]):
            _say("  " + line)
    if view["report"]:
        _say(f"\nreport: {view['report']['summary']}")
    _say(f"\nfinal status: {view['status']}")
