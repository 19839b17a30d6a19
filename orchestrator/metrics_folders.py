"""The worker's Prometheus multiprocess folders, `$ORCH_HOME/metrics/worker-<pid>`.

`orchestrator worker` with ORCH_METRICS_PORT points PROMETHEUS_MULTIPROC_DIR at a fresh folder of
its own, where its pool processes keep their counters. Nothing removes it when the worker stops
(a SIGKILL leaves no chance to), so every start first removes the folders of workers that are
gone. A folder records who made it (`owner.json`: host, pid and process start, as a claim does),
and is removed only when `orchestrator.leases.process.is_gone` says that process surely no longer
runs: a live worker's folder, one of another host, boot or pid namespace, and one whose pid was
reused by a live process that started later are told apart as for a claim. A folder without an
owner file (made before it was written) is removed only when no process has its pid.

Importing this module imports no prometheus-client (which picks its value store on import).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

from orchestrator.leases.process import ProcessIdentity, current_process, is_gone, pid_exists

__all__ = ["OWNER_FILE", "PREFIX", "claim_folder", "remove_dead_folders"]

log = logging.getLogger(__name__)

PREFIX = "worker-"
#: Who made the folder; prometheus-client reads only its `*.db` files.
OWNER_FILE = "owner.json"


def claim_folder(root: Path) -> Path:
    """A fresh folder under `root` for this process, with its owner recorded; the folders of
    gone workers are removed first."""
    remove_dead_folders(root)
    me = current_process()
    folder = root / f"{PREFIX}{me.pid}"
    shutil.rmtree(folder, ignore_errors=True)  # this pid's earlier, gone, holder
    folder.mkdir(parents=True)
    owner = {"host": me.host, "pid": me.pid, "started": me.started}
    (folder / OWNER_FILE).write_text(json.dumps(owner), encoding="utf-8")
    return folder


def remove_dead_folders(root: Path) -> list[Path]:
    """Remove the folders under `root` of workers that surely no longer run; returns them."""
    removed: list[Path] = []
    try:
        folders = sorted(root.glob(f"{PREFIX}*"))
    except OSError:
        return removed
    for folder in folders:
        if folder.is_dir() and _is_dead(folder):
            shutil.rmtree(folder, ignore_errors=True)
            if not folder.exists():
                removed.append(folder)
    if removed:
        log.info("removed %d metrics folder(s) of gone workers under %s", len(removed), root)
    return removed


def _is_dead(folder: Path) -> bool:
    try:
        pid = int(folder.name.removeprefix(PREFIX))
    except ValueError:
        return False  # not one of ours
    if pid == os.getpid():
        return False
    try:
        owner = json.loads((folder / OWNER_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return not pid_exists(pid)
    except (OSError, ValueError):
        return False  # unreadable: cannot tell, keep it
    if not isinstance(owner, dict) or owner.get("pid") != pid:
        return False
    host, started = owner.get("host"), owner.get("started")
    if not isinstance(host, str) or not isinstance(started, str | None):
        return False
    return is_gone(ProcessIdentity(host, pid, started))
