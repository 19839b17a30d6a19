"""Restart recovery: a generation whose claiming process on this host is gone is requeued at once.

A live process is never taken for dead (a reused pid shows another start time), and nothing of
another host, boot or pid namespace is judged from here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest
import redis

from orchestrator.leases import process
from orchestrator.leases.keys import task_lease
from orchestrator.leases.process import ProcessIdentity, current_process, is_gone
from orchestrator.runtime import Runtime
from orchestrator.services.sweeper import SweepReport
from orchestrator.services.tasks import Trigger
from orchestrator.store import generation_claims as claim_store
from orchestrator.store import generations as generation_store
from orchestrator.store.types import utcnow
from tests.executions_support import runtime_for
from tests.services import service_unavailable

LEASE = 120.0  # the default: only the process check can requeue within a test


@pytest.fixture
def rt(store_url: str, tmp_path: Path) -> Iterator[Runtime]:
    runtime, _ = runtime_for(store_url, tmp_path, lease_seconds=LEASE)
    yield runtime
    runtime.close()


def exited_process() -> ProcessIdentity:
    """The identity a claim recorded for a child process that has since exited."""
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    ticks = Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    me = current_process()
    assert me.started is not None
    identity = ProcessIdentity(me.host, child.pid, f"{me.started.rpartition('/')[0]}/{ticks}")
    assert not is_gone(identity)
    child.communicate(b"")
    return identity


def claim(rt: Runtime, process: ProcessIdentity) -> tuple[str, str]:
    task_id = rt.tasks.trigger(Trigger(task_type="simple", title="held")).task.task_id
    token = rt.leases.acquire(task_lease(task_id), "w", LEASE)
    assert token is not None
    with rt.db.transaction() as conn:
        assert claim_store.claim_generation(
            conn,
            task_id,
            1,
            lease_token=token,
            worker="w",
            celery_task_id=None,
            lease_expires_at=utcnow() + timedelta(seconds=LEASE),
            process=process,
        )
    return task_id, token


def test_a_gone_process_is_requeued_at_once_and_its_lease_released(rt: Runtime) -> None:
    task_id, _ = claim(rt, exited_process())
    report = rt.sweeper.sweep()  # every sweep checks, long before the lease would run out
    assert report.requeued == [(task_id, 1, 2)]
    view = rt.tasks.explain(task_id)
    assert (view["status"], view["generation"]) == ("queued", 2)
    assert view["executions"][0]["outcome"] == "lost"
    assert rt.leases.get(task_lease(task_id)) is None  # generation 2 can take it now
    assert rt.sweeper.sweep().requeued == []


def test_a_round_handed_back_until_a_retry_after_waits_for_it_though_its_process_is_gone(
    rt: Runtime,
) -> None:
    """A round a rate-limited model server stopped is handed back to be requeued once its
    Retry-After has passed; the worker then restarts (a deploy). Its old process is gone, but
    the generation is no longer its: restart recovery must not requeue it at once, straight
    into the same 429, each time counted in `handbacks` towards parking the task."""
    task_id, token = claim(rt, exited_process())
    rt.leases.release(task_lease(task_id), token)  # the round ended: its lease went first
    with rt.db.transaction() as conn:
        assert generation_store.hand_back(
            conn, task_id, 1, token, after=120, reason="handed back: rate limited"
        )
    assert rt.sweeper.sweep().requeued == []
    assert rt.sweeper.recover_gone_processes().requeued == []
    assert rt.tasks.get(task_id).status == "running"
    # Once the Retry-After has passed, the expiry sweep requeues it, as a hand-back.
    report = rt.sweeper.sweep(utcnow() + timedelta(seconds=121))
    assert report.requeued == [(task_id, 1, 2)]
    assert rt.tasks.get(task_id).handbacks == 1


def test_live_processes_and_other_hosts_are_never_taken_for_dead(rt: Runtime) -> None:
    me = current_process()
    assert me.started is not None
    scope = me.started.rpartition("/")[0]
    held = [
        claim(rt, me)[0],  # alive
        claim(rt, replace(exited_process(), host="another-host"))[0],
        claim(rt, replace(exited_process(), started="other-boot:1/1"))[0],
        claim(rt, ProcessIdentity(me.host, me.pid, None))[0],  # no start time known
    ]
    reused = claim(rt, replace(me, started=f"{scope}/1"))[0]  # our pid, an older process
    report = rt.sweeper.recover_gone_processes()
    assert report.requeued == [(reused, 1, 2)]
    assert all(rt.tasks.get(task_id).status == "running" for task_id in held)


def test_two_sweepers_racing_over_gone_processes_requeue_each_once(
    rt: Runtime, store_url: str, tmp_path: Path
) -> None:
    other, _ = runtime_for(store_url, tmp_path, lease_seconds=LEASE)
    try:
        dead = exited_process()
        task_ids = [claim(rt, dead)[0] for _ in range(10)]
        reports: list[SweepReport] = []
        barrier = threading.Barrier(2)

        def recover(runtime: Runtime) -> None:
            barrier.wait(timeout=30)
            reports.append(runtime.sweeper.recover_gone_processes())

        threads = [threading.Thread(target=recover, args=(r,)) for r in (rt, other)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        requeued = sorted(entry for report in reports for entry in report.requeued)
        assert requeued == sorted((task_id, 1, 2) for task_id in task_ids)
    finally:
        other.close()


def _judged_by_another_user(identity: ProcessIdentity, hidepid: str) -> str:
    """`is_gone(identity)` as a process of user nobody sees it, /proc mounted with `hidepid`.

    The judge loads a copy of `leases/process.py` (standard library only) from a folder nobody
    can read: the checkout itself may sit where only root can (a CI runner's home)."""
    folder = Path(tempfile.mkdtemp(prefix="orch-judge-"))
    try:
        folder.chmod(0o755)
        module = folder / "process.py"
        shutil.copyfile(Path(process.__file__), module)
        module.chmod(0o644)
        judge = (
            "import importlib.util, sys; "
            "spec = importlib.util.spec_from_file_location('process', sys.argv[1]); "
            "m = importlib.util.module_from_spec(spec); sys.modules['process'] = m; "
            "spec.loader.exec_module(m); "
            "print(m.is_gone(m.ProcessIdentity(sys.argv[2], int(sys.argv[3]), sys.argv[4])))"
        )
        as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        as_nobody += [sys.executable, "-I", "-c", judge, str(module)]
        as_nobody += [identity.host, str(identity.pid), str(identity.started)]
        script = f'mount -t proc -o hidepid={hidepid} proc /proc || exit 77; exec "$@"'
        unshare = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh"]
        result = subprocess.run(
            [*unshare, *as_nobody],
            capture_output=True,
            text=True,
            cwd=folder,
        )
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if result.returncode == 77:
        service_unavailable(f"cannot mount /proc with hidepid here: {result.stderr.strip()[:200]}")
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@pytest.mark.parametrize("hidepid", ["noaccess", "invisible"])
def test_a_process_another_user_cannot_see_in_proc_is_not_taken_for_dead(hidepid: str) -> None:
    # A sweeper running as another user than the workers, /proc mounted with hidepid: the
    # worker's /proc entry is unreadable (noaccess) or missing (invisible), yet it runs.
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("setpriv") is None:
        service_unavailable("needs root, unshare and setpriv to judge as another user")
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    try:
        ticks = Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
        me = current_process()
        assert me.started is not None
        alive = ProcessIdentity(me.host, child.pid, f"{me.started.rpartition('/')[0]}/{ticks}")
        assert _judged_by_another_user(alive, hidepid) == "False"
    finally:
        child.communicate(b"")
    # Once it exited, the same judge finds it gone.
    assert _judged_by_another_user(alive, hidepid) == "True"


def test_a_process_whose_main_thread_ended_is_alive_until_its_last_thread_ends() -> None:
    # /proc/<pid>/stat shows a thread group leader that ended as a zombie ("Z") while the
    # process's other threads still run: the process is alive, only a reaped-or-not zombie
    # with no other thread is gone.
    code = (
        "import ctypes, sys, threading; "
        "threading.Thread(target=sys.stdin.read).start(); "
        "print('ready', flush=True); "
        "ctypes.CDLL(None).pthread_exit(None)"
    )
    with subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    ) as child:
        assert child.stdout is not None
        assert child.stdin is not None
        try:
            assert child.stdout.readline() == b"ready\n"
            stat = Path(f"/proc/{child.pid}/stat")
            ticks = stat.read_text().rsplit(")", 1)[1].split()[19]
            me = current_process()
            assert me.started is not None
            alive = ProcessIdentity(me.host, child.pid, f"{me.started.rpartition('/')[0]}/{ticks}")
            wait_for_state(stat, "Z")  # the leader ended; the reading thread runs on
            assert not is_gone(alive)
            child.stdin.close()  # the last thread ends: now a zombie nobody reaped yet
            wait_for_threads(stat, 1)
            assert is_gone(alive)
        finally:
            child.kill()
            child.wait()


def wait_for_state(stat: Path, state: str) -> None:
    for _ in range(100):
        if stat.read_text().rsplit(")", 1)[1].split()[0] == state:
            return
        time.sleep(0.05)
    raise AssertionError(f"{stat} never showed state {state}")


def wait_for_threads(stat: Path, count: int) -> None:
    for _ in range(100):
        if stat.read_text().rsplit(")", 1)[1].split()[17] == str(count):
            return
        time.sleep(0.05)
    raise AssertionError(f"{stat} never showed {count} thread(s)")


def test_a_read_only_redis_does_not_stop_a_sweep_from_waking_what_it_requeued(
    store_url: str, redis_url: str, tmp_path: Path
) -> None:
    # A failover left the lease server a replica: every write answers READONLY. The requeues
    # are committed already; the leases cannot be released (they expire), but the wake-ups of
    # the requeued generations must still go out, now, not at the stale-queued republish.
    runtime, dispatcher = runtime_for(store_url, tmp_path, lease_seconds=LEASE, redis_url=redis_url)
    admin = redis.Redis.from_url(redis_url)
    try:
        task_ids = [claim(runtime, exited_process())[0] for _ in range(2)]
        dispatcher.sent.clear()  # the triggers' own wake-ups
        admin.execute_command("REPLICAOF", "127.0.0.1", "1")  # a master that never answers
        with pytest.raises(redis.ReadOnlyError):
            admin.set("probe", "1")
        report = runtime.sweeper.recover_gone_processes()
        assert sorted(report.requeued) == sorted((task_id, 1, 2) for task_id in task_ids)
        assert sorted(dispatcher.sent) == sorted((task_id, 2) for task_id in task_ids)
    finally:
        admin.execute_command("REPLICAOF", "NO", "ONE")
        admin.close()
        runtime.close()
