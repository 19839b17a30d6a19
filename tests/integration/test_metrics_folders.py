"""The worker's Prometheus multiprocess folders: a start removes those of gone workers only.

Real processes and /proc: a folder is removed only when its owner surely no longer runs (an
exited child; a live process that reused the pid is told apart by its start time).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from orchestrator.leases.process import ProcessIdentity, current_process
from orchestrator.metrics_folders import OWNER_FILE, claim_folder, remove_dead_folders


def exited_process() -> ProcessIdentity:
    """The identity of a child process that has since exited (its pid is free)."""
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    ticks = Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    me = current_process()
    assert me.started is not None
    identity = ProcessIdentity(me.host, child.pid, f"{me.started.rpartition('/')[0]}/{ticks}")
    child.communicate(b"")
    return identity


def folder_of(root: Path, owner: ProcessIdentity | None, pid: int | None = None) -> Path:
    """A worker folder as a worker leaves it: a counter file, and its owner when given."""
    folder = root / f"worker-{pid if pid is not None else owner.pid if owner else 0}"
    folder.mkdir(parents=True)
    (folder / "counter_1.db").write_bytes(b"\0" * 16)
    if owner is not None:
        record = {"host": owner.host, "pid": owner.pid, "started": owner.started}
        (folder / OWNER_FILE).write_text(json.dumps(record))
    return folder


def test_a_start_removes_the_folders_of_gone_workers_and_keeps_the_live_ones(
    tmp_path: Path,
) -> None:
    root = tmp_path / "metrics"
    me = current_process()
    assert me.started is not None
    scope = me.started.rpartition("/")[0]
    live = [
        subprocess.Popen(
            [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
        )
        for _ in range(3)
    ]
    try:
        ticks = [
            Path(f"/proc/{p.pid}/stat").read_text().rsplit(")", 1)[1].split()[19] for p in live
        ]
        gone = folder_of(root, exited_process())
        legacy_gone = folder_of(root, None, pid=exited_process().pid)  # made before owner files
        # A worker that died, whose pid a live process started later now has: gone, by its
        # recorded start time.
        reused = folder_of(root, ProcessIdentity(me.host, live[0].pid, f"{scope}/1"))
        alive = folder_of(root, ProcessIdentity(me.host, live[1].pid, f"{scope}/{ticks[1]}"))
        legacy_alive = folder_of(root, None, pid=live[2].pid)
        # Never judged from here: another host, another pid namespace, no start time.
        elsewhere = folder_of(root, ProcessIdentity("another-host", exited_process().pid, "x/1"))
        other_namespace = folder_of(
            root, ProcessIdentity(me.host, exited_process().pid, "boot:4026531836/1")
        )
        no_start = folder_of(root, ProcessIdentity(me.host, exited_process().pid, None))
        not_ours = root / "worker-abc"
        not_ours.mkdir()

        mine = claim_folder(root)

        assert mine == root / f"worker-{os.getpid()}"
        owner = json.loads((mine / OWNER_FILE).read_text())
        assert (owner["host"], owner["pid"], owner["started"]) == (me.host, me.pid, me.started)
        for folder in (gone, legacy_gone, reused):
            assert not folder.exists(), folder
        for folder in (alive, legacy_alive, elsewhere, other_namespace, no_start, not_ours):
            assert folder.exists(), folder
        # This process's own folder is never removed; nothing else is left to remove.
        assert remove_dead_folders(root) == []
        assert mine.exists()
    finally:
        for process in live:
            process.communicate(b"")


def test_a_missing_metrics_root_is_created_and_nothing_is_removed(tmp_path: Path) -> None:
    assert remove_dead_folders(tmp_path / "nothing-here") == []
    assert claim_folder(tmp_path / "nothing-here").is_dir()
