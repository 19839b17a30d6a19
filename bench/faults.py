"""A bounded fault campaign: nothing lost, nothing done twice, through SIGKILLs and lost servers.

    .venv/bin/python bench/faults.py [--tasks 150] [--faults 12] [--workers 3] [--write]

Starts a throwaway Postgres (commit timestamps on) and redis-server from the local binaries (the
tests' helpers), a loopback business backend (tests/integration/fake_backend.py) that counts
every write it receives, `--workers` real `orchestrator worker` processes (threads pool) and an
`orchestrator sweeper`, with a short lease. Tasks are triggered at a steady rate; each one's
scripted agent reads (task context, a data source), publishes a plan, thinks, replaces a setting
of its own on the backend through `call_api` (a write behind a receipt; one task in three gets a
slow backend, so writes are in flight when faults land), thinks, completes the plan and reports.

While they run, faults land on a schedule, in turn (`--kinds`): SIGKILL of the worker holding
the most rounds (a replacement starts at once); Redis wiped (FLUSHALL, or killed and started
again empty); Postgres stopped for `--pg-down` seconds; SIGSTOP of the worker holding the most
rounds until its leases ran out, then SIGCONT (superseded rounds that still run). Then, once
every task has settled (bounded):

- tasks by status; none may stay `queued` or `running` (lost), every one triggered must exist;
- writes received by the backend per key (one task's setting): more than the task's intent
  rounds is a write done twice (bench/fault_checks.py says why that is the design's rule);
- receipts by status (`unknown` is honest, counted, not a failure) and generations per task;
- fencing: no plan revision, report, transcript entry, evidence record or receipt of generation
  g committed after generation g' > g of its task had started (Postgres commit timestamps);
  nothing stored twice in our tables; no execution left open on a settled task;
- workers and the sweeper: one that exited on its own (not killed by the campaign) is a finding.

Exits 1 on a lost task, a write done twice, a broken fence, a row stored twice or a process that
exited on its own. `--write` replaces this benchmark's section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from docs_section import DOC, write_section
from execution_fleet import ROOT, Proc, Processes
from fault_approvals import (
    Approver,
    approval_turns,
    expected_status,
    is_approval,
    outbox_facts,
    wait_for_outbox,
)
from fault_checks import Accepted, duplicate_writes, late_rows
from fault_report import summary
from fault_timing import LEASE, RENEW, SLOW_WRITE_S, STALE, STALL_BEYOND_LEASE, SWEEP

# After execution_fleet, which puts the project root on the path.
from tests.executions_support import node, plan_call, query_call, report_call, wait_for

KINDS = ("kill", "redis", "postgres", "stall", "dispatcher")
DATABASE = "faults"
SETTLED = ("completed", "failed", "cancelled", "waiting")
#: The outbox's secret for both kinds (actions and signed webhooks): the campaign's own.
OUTBOX_SECRET = "faults-outbox-secret-0123456789"
#: What bench/fault_approvals.outbox_facts finds that fails the campaign: an approval lost or
#: sent for a decision that was not one, an event lost, or a task's events applied out of order.
OUTBOX_FAILURES = (
    "approved_missing",
    "approved_undelivered",
    "not_approved_sent",
    "events_undelivered",
    "events_unreceived",
    "out_of_order",
)
#: Receipt summaries written by someone other than the receipt's own generation (the requeue
#: that ended it, a cold start, the next generation's verification, an operator).
NOT_ITS_OWN = (
    "generation_ended",
    "recovered",
    "verified",
    "resolved_succeeded",
    "resolved_failed",
)


def task_type(number: int, approvals: int) -> str:
    """`aNNNN` for a task that proposes a work order (bench/fault_approvals.py), else `fNNNN`."""
    return f"{'a' if is_approval(number, approvals) else 'f'}{number:04d}"


def turns(number: int, key: str, delay: float) -> list[dict[str, Any]]:
    """Read, plan, think, write (behind a receipt), think, complete the plan, report."""
    from tests.integration.fake_backend import api_call

    read = {"id": "c1", "name": "read_task_context", "arguments": {}}
    write = api_call("w1", "putSetting", key=key, body={"value": number})
    # The completed nodes cite the write: its receipt (and id) is the same in every generation
    # of the intent round, so a later generation's plan keeps them unchanged (DESIGN 22) when
    # an earlier one got as far as completing them; a query's evidence is new each generation.
    done = [node(n, "completed", cite=["${w1.invocation_id}"]) for n in ("a", "b")]
    return [
        {"tool_calls": [read, query_call()]},
        {"tool_calls": [plan_call("p1", "r1", [node("a", "running"), node("b", "pending")])]},
        {"delay_s": delay, "tool_calls": [write]},
        {"delay_s": delay, "tool_calls": [plan_call("p2", "r2", done)]},
        {"tool_calls": [report_call("rep", "completed")]},
        {"content": "done"},
    ]


@dataclass
class Campaign:
    args: argparse.Namespace
    pg_server: Any
    database: str
    redis_server: Any
    procs: Processes
    rt: Any
    begun: float = field(default_factory=time.monotonic)
    workers: list[Proc] = field(default_factory=list)
    killed: set[int] = field(default_factory=set)
    faults: list[tuple[float, str, str]] = field(default_factory=list)
    task_ids: dict[int, str] = field(default_factory=dict)
    trigger_retries: int = 0
    undispatched: int = 0
    untriggered: list[int] = field(default_factory=list)
    timers: list[threading.Timer] = field(default_factory=list)
    stalled: set[int] = field(default_factory=set)
    sweepers: list[Proc] = field(default_factory=list)
    numbers: dict[str, int] = field(default_factory=dict)  # task id -> task number

    def at(self) -> float:
        return time.monotonic() - self.begun

    def log(self, kind: str, detail: str) -> None:
        self.faults.append((self.at(), kind, detail))
        print(f"[{self.at():7.2f} s] {kind}: {detail}", flush=True)

    def start_worker(self) -> Proc:
        orchestrator = str(Path(sys.executable).with_name("orchestrator"))
        argv = [orchestrator, "worker", "--pool", "threads", "--loglevel", "INFO"]
        name = f"w{len(self.workers) + 1}@%h"
        argv += ["--concurrency", str(self.args.concurrency), "--name", name]
        proc = self.procs.start("worker", argv)
        self.workers.append(proc)
        return proc

    def query(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        with self.pg_server.connect(self.database) as conn:
            return list(conn.execute(sql, params).fetchall())

    # ------------------------------------------------------------------ triggers

    def trigger_all(self, window: float) -> None:
        from orchestrator.services.tasks import Trigger

        for number in range(self.args.tasks):
            pause = self.begun + number * window / self.args.tasks - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            trigger = Trigger(
                task_type=task_type(number, self.args.approvals),
                title=f"fault {number}",
                trigger_id=f"faults-{number}",
            )
            deadline = time.monotonic() + 60
            while True:
                try:  # idempotent on trigger_id: a retry after an error never makes two tasks
                    result = self.rt.tasks.trigger(trigger)
                except Exception:
                    self.trigger_retries += 1
                    if time.monotonic() > deadline:
                        self.untriggered.append(number)
                        break
                    time.sleep(0.5)
                    continue
                self.task_ids[number] = result.task.task_id
                self.numbers[result.task.task_id] = number
                self.undispatched += not result.dispatched
                break

    # ------------------------------------------------------------------ faults

    def _busiest(self) -> tuple[Proc, int]:
        """The live worker holding the most running rounds (the store's view), and how many."""
        alive = [
            w
            for w in self.workers
            if w.process.poll() is None and w.process.pid not in self.stalled
        ] or [w for w in self.workers if w.process.poll() is None]
        try:
            held = dict(
                self.query(
                    "SELECT worker_pid, count(*) FROM executions WHERE outcome IS NULL "
                    "AND started_at IS NOT NULL GROUP BY 1"
                )
            )
        except Exception:
            held = {}
        victim = max(alive, key=lambda w: (held.get(w.process.pid, 0), random.random()))
        return victim, held.get(victim.process.pid, 0)

    def kill_worker(self) -> None:
        victim, held = self._busiest()
        self.killed.add(victim.process.pid)
        victim.kill()
        replacement = self.start_worker()
        self.log(
            "SIGKILL worker",
            f"pid {victim.process.pid} holding {held} rounds; "
            f"replacement pid {replacement.process.pid}",
        )

    def kill_dispatcher(self) -> None:
        """SIGKILL the sweeper, whose thread is the outbox's dispatcher, and start another: a
        row it was posting is sent again once its hold runs out (with the same key)."""
        victim = self.sweepers[-1]
        self.killed.add(victim.process.pid)
        victim.kill()
        replacement = self.procs.sweeper()
        self.sweepers.append(replacement)
        self.log(
            "SIGKILL sweeper and its dispatcher",
            f"pid {victim.process.pid}; replacement pid {replacement.process.pid}",
        )

    def wipe_redis(self, number: int) -> None:
        import redis

        if number % 2 == 0:
            client = redis.Redis.from_url(self.redis_server.url)
            keys = client.dbsize()
            client.flushall()
            client.close()
            self.log("Redis FLUSHALL", f"{keys} keys deleted, the server stays up")
        else:
            self.redis_server.restart()  # killed, started again empty on the same port
            self.log("Redis restarted empty", "killed and started again with no data")

    def stall_worker(self) -> None:
        """SIGSTOP the worker holding the most rounds past its leases, then SIGCONT: its rounds
        are superseded while they still run, and must not have a write accepted after that."""
        victim, held = self._busiest()
        self.stalled.add(victim.process.pid)
        os.killpg(victim.process.pid, signal.SIGSTOP)
        pause = LEASE + STALL_BEYOND_LEASE
        timer = threading.Timer(pause, self._resume, args=(victim,))
        timer.daemon = True
        timer.start()
        self.timers.append(timer)
        self.log("SIGSTOP worker", f"pid {victim.process.pid} holding {held} rounds, {pause:g} s")

    def _resume(self, victim: Proc) -> None:
        with suppress(ProcessLookupError):
            os.killpg(victim.process.pid, signal.SIGCONT)
        self.stalled.discard(victim.process.pid)
        self.log("SIGCONT worker", f"pid {victim.process.pid}")

    def stop_postgres(self) -> None:
        started = self.at()
        self.pg_server.stop_for(self.args.pg_down)
        self.log("Postgres stopped", f"down from {started:.2f} s for {self.at() - started:.1f} s")

    def inject(self, window: float) -> Counter[str]:
        kinds = self.args.kinds
        done: Counter[str] = Counter()
        for number in range(self.args.faults):
            due = self.begun + (number + 1) * window / (self.args.faults + 1)
            time.sleep(max(0.0, due - time.monotonic()))
            kind = kinds[number % len(kinds)]
            if kind == "kill":
                self.kill_worker()
            elif kind == "stall":
                self.stall_worker()
            elif kind == "redis":
                self.wipe_redis(done["redis"])
            elif kind == "dispatcher":
                self.kill_dispatcher()
            else:
                self.stop_postgres()
            done[kind] += 1
        return done

    def settle(self, timeout: float) -> float:
        started = time.monotonic()

        def settled() -> bool:
            try:
                rows = self.query(
                    "SELECT count(*) FILTER (WHERE status NOT IN "
                    "('completed', 'failed', 'cancelled', 'waiting')) FROM tasks"
                )
            except Exception:
                return False
            return rows[0][0] == 0

        try:
            wait_for(settled, timeout, interval=1.0, what="every task to settle")
        except AssertionError:
            print(f"not every task settled within {timeout:g} s", flush=True)
        return time.monotonic() - started


# --------------------------------------------------------------------------- checks


def collect(c: Campaign, backend: Any) -> dict[str, Any]:
    from orchestrator.domain.outcomes import SUMMARIES

    tasks = c.query(
        "SELECT task_id, task_type, status, generation, failure_code, last_error, "
        "intent_round FROM tasks"
    )
    executions = c.query(
        "SELECT task_id, generation, started_at, outcome, handed_back_at IS NOT NULL "
        "FROM executions"
    )
    host_texts = [SUMMARIES[name] for name in NOT_ITS_OWN]
    rows = c.query(
        "SELECT 'plan', task_id, generation, pg_xact_commit_timestamp(xmin) FROM plan_revisions "
        "WHERE generation IS NOT NULL "
        "UNION ALL SELECT 'report', task_id, generation, pg_xact_commit_timestamp(xmin) "
        "FROM reports "
        "UNION ALL SELECT 'transcript', task_id, generation, pg_xact_commit_timestamp(xmin) "
        "FROM transcript_entries WHERE generation IS NOT NULL "
        "UNION ALL SELECT 'evidence', task_id, generation, pg_xact_commit_timestamp(xmin) "
        "FROM evidence "
        "UNION ALL SELECT 'receipt claim', s.task_id, s.generation, r.created_at "
        "FROM invocation_receipts r JOIN sessions s USING (session_id) "
        "WHERE s.task_id IS NOT NULL "
        "UNION ALL SELECT 'receipt outcome', s.task_id, s.generation, "
        "pg_xact_commit_timestamp(r.xmin) FROM invocation_receipts r "
        "JOIN sessions s USING (session_id) WHERE s.task_id IS NOT NULL "
        "AND r.status <> 'running' AND NOT (r.summary = ANY(%s))",
        (host_texts,),
    )
    untimed = sum(1 for row in rows if row[3] is None)
    accepted = [Accepted(*row) for row in rows if row[3] is not None]
    late = late_rows(accepted, [(t, g, s) for t, g, s, _, _ in executions])
    twice = c.query(
        "SELECT (SELECT count(*) FROM (SELECT session_id, seq FROM transcript_entries "
        "GROUP BY 1, 2 HAVING count(*) > 1) s), "
        "(SELECT count(*) FROM (SELECT session_id, request_id FROM plan_revisions "
        "GROUP BY 1, 2 HAVING count(*) > 1) r), "
        "(SELECT count(*) FROM (SELECT task_id, generation FROM reports "
        "GROUP BY 1, 2 HAVING count(*) > 1) p), "
        "(SELECT count(*) FROM (SELECT trigger_id FROM tasks GROUP BY 1 HAVING count(*) > 1) t)"
    )[0]
    receipts = c.query(
        "SELECT s.task_id, r.status, r.summary FROM invocation_receipts r "
        "JOIN sessions s USING (session_id) WHERE r.tool_name = 'call_api'"
    )
    settled = {t[0] for t in tasks if t[2] in SETTLED}
    open_executions = [
        (t, g) for t, g, s, o, _ in executions if o is None and s is not None and t in settled
    ]
    writing = [t for t in tasks if t[1].startswith("f")]  # the approval tasks write nothing
    key_of = {t[0]: f"k{t[1][1:]}" for t in writing}
    with backend.lock:
        received = {
            path.removeprefix("/settings/"): count
            for (method, path), count in backend.requests.items()
            if method == "PUT"
        }
        reads = sum(n for (m, _), n in backend.requests.items() if m == "GET")
    allowed = {key_of[t[0]]: t[6] for t in writing}
    incomplete = [t[0] for t in tasks if t[2] != expected_status(t[1], c.args.approvals)][:10]
    story = c.query(
        "SELECT e.task_id, e.generation, e.outcome, left(e.reason, 120), "
        "(SELECT string_agg(x.tool_name || ':' || x.status || coalesce(':' || "
        "(x.body->>'code'), ''), ' ' ORDER BY x.seq) FROM transcript_entries x "
        "WHERE x.session_id = e.session_id AND x.kind = 'tool_result' "
        "AND x.status <> 'succeeded') FROM executions e WHERE e.task_id = ANY(%s) "
        "ORDER BY e.task_id, e.generation",
        (incomplete,),
    )
    return {
        "story": story,
        "tasks": tasks,
        "executions": executions,
        "accepted": len(accepted),
        "untimed": untimed,
        "late": late,
        "twice": tuple(twice),
        "receipts": receipts,
        "open_executions": open_executions,
        "received": received,
        "verify_reads": reads,
        "duplicates": duplicate_writes(received, allowed),
        "missing_writes": sorted(set(allowed) - set(received)),
    }


def process_findings(c: Campaign, sweepers: list[Proc]) -> dict[str, Any]:
    """Processes that exited on their own before the campaign stopped them, then the exit codes
    of the graceful stop, and the log lines worth reading."""
    own = [
        (p.name, p.process.pid, p.process.returncode)
        for p in [*c.workers, *sweepers]
        if p.process.poll() is not None and p.process.pid not in c.killed
    ]
    running = [p for p in [*c.workers, *sweepers] if p.process.poll() is None]
    c.procs.stop_all()
    stopped = [(p.name, p.process.pid, p.process.returncode) for p in running]
    tracebacks: Counter[str] = Counter()
    for log in sorted(c.procs.folder.glob("*.log")):
        lines = log.read_text(errors="replace").splitlines()
        for index, line in enumerate(lines):
            if line.startswith("Traceback"):
                last = next(
                    (x for x in lines[index + 1 :] if x and not x.startswith((" ", "Traceback"))),
                    "?",
                )
                tracebacks[f"{log.name.split('-')[0]}: {last[:160]}"] += 1
    return {
        "exited": own,
        "stopped": stopped,
        "tracebacks": tracebacks,
        "stopped_rounds": stopped_rounds(c.procs.folder),
        "taken_back": leases_taken_back(c.procs.folder),
    }


#: What a round that stops itself logs ("generation N of T stopped: why"), by kind of why.
_STOPPED = re.compile(r"generation \d+ of \S+ stopped: (.*)")
_WHY = (
    ("renewal refused", "renewal was refused"),
    ("renewal overdue", "older than the lease"),
    ("lease ran out (worker stalled)", "ran out before it was renewed"),
    ("fenced by the store", "no longer live"),
    ("fenced by the store", "does not hold the lease"),
    ("fenced by the store", "no longer holds its lease"),
    ("store unavailable", "psycopg"),
    ("store unavailable", "OperationalError"),
)


def stopped_rounds(folder: Path) -> Counter[str]:
    found: Counter[str] = Counter()
    for log in folder.glob("worker-*.log"):
        for match in _STOPPED.finditer(log.read_text(errors="replace")):
            why = match.group(1)
            found[next((name for name, text in _WHY if text in why), "other")] += 1
    return found


def leases_taken_back(folder: Path) -> int:
    """Leases rounds found gone (after a Redis wipe) and took back (services/lease_keeper.py)."""
    return sum(
        log.read_text(errors="replace").count("found its lease gone")
        for log in folder.glob("worker-*.log")
    )


# --------------------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=150, help="tasks to trigger")
    parser.add_argument("--faults", type=int, default=12, help="faults to inject, in turn")
    parser.add_argument(
        "--kinds",
        type=lambda text: text.split(","),
        default=list(KINDS),
        help=f"fault kinds, in turn (default {','.join(KINDS)})",
    )
    parser.add_argument("--rate", type=float, default=2.0, help="tasks triggered per second")
    parser.add_argument("--workers", type=int, default=3, help="worker processes")
    parser.add_argument("--concurrency", type=int, default=4, help="rounds per worker")
    parser.add_argument("--delay", type=float, default=1.0, help="model think time, s")
    parser.add_argument("--pg-down", type=float, default=3.0, help="Postgres outage, s")
    parser.add_argument("--settle", type=float, default=150.0, help="most seconds to settle")
    parser.add_argument(
        "--approvals",
        type=int,
        default=4,
        help="one task in N proposes a work order a person decides (0: none)",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--logs", type=Path, help="copy the processes' logs to this folder")
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    if args.tasks < 1 or args.faults < 0 or args.workers < 1 or args.rate <= 0:
        parser.error("--tasks and --workers must be at least 1, --faults 0 or more, --rate > 0")
    if args.approvals < 0:
        parser.error("--approvals must be 0 (none) or more")
    if not args.kinds or set(args.kinds) - set(KINDS):
        parser.error(f"--kinds: a comma-separated list of {', '.join(KINDS)}")
    random.seed(args.seed)
    command = (
        f".venv/bin/python bench/faults.py --tasks {args.tasks} --faults {args.faults} "
        f"--rate {args.rate:g} --workers {args.workers} --concurrency {args.concurrency} "
        f"--delay {args.delay:g} --pg-down {args.pg_down:g} --kinds {','.join(args.kinds)} "
        f"--approvals {args.approvals} --seed {args.seed}" + (" --write" if args.write else "")
    )
    from orchestrator.runtime import build_runtime
    from tests.executions_support import settings_for, write_script
    from tests.integration.fake_backend import SPEC, running_backend
    from tests.outbox_support import running_recorder
    from workers.celery_app import CeleryDispatcher, make_celery

    load_start = os.getloadavg()[0]
    started = time.monotonic()
    folder = Path(tempfile.mkdtemp(prefix="orch-bench-faults-"))
    broken: list[Any] = []
    with ExitStack() as stack:
        stack.callback(shutil.rmtree, folder, True)
        pg_server, redis_server = stack.enter_context(own_servers())
        pg_url, redis_url = pg_server.url(DATABASE), redis_server.url
        backend = stack.enter_context(running_backend())
        backend.slow_seconds = SLOW_WRITE_S
        # A worker killed (or a round stopped) while the backend answers: counted, not printed.
        assert backend.server is not None
        backend.server.handle_error = lambda request, address: broken.append(address)
        spec = folder / "backend.json"
        spec.write_text(json.dumps(SPEC))
        scripts = folder / "scripts"
        recorder = stack.enter_context(running_recorder())  # where the outbox delivers
        for number in range(args.tasks):
            if is_approval(number, args.approvals):
                write_script(scripts, task_type(number, args.approvals), approval_turns(number))
                continue
            key = f"k{number:04d}"
            write_script(scripts, f"f{number:04d}", turns(number, key, args.delay))
            if number % 3 == 0:
                backend.mode[f"/settings/{key}"] = "slow"
        env = {
            "ORCH_DATABASE_URL": pg_url,
            "ORCH_REDIS_URL": redis_url,
            "ORCH_MODEL": f"scripted:{scripts}",
            "ORCH_LEASE_SECONDS": str(LEASE),
            "ORCH_LEASE_RENEW_SECONDS": str(RENEW),
            "ORCH_SWEEP_SECONDS": str(SWEEP),
            "ORCH_QUEUED_STALE_SECONDS": str(STALE),
            "ORCH_GATEWAY_SPEC": str(spec),
            "ORCH_GATEWAY_BASE_URL": backend.url,
            "ORCH_HOME": str(folder / "home"),
            "ORCH_ACTIONS_URL": f"{recorder.url}/actions",
            "ORCH_ACTIONS_SECRET": OUTBOX_SECRET,
            "ORCH_WEBHOOK_URL": f"{recorder.url}/hooks",
            "ORCH_WEBHOOK_SECRET": OUTBOX_SECRET,
            "ORCH_OUTBOX_BACKOFF_SECONDS": "0.2",
            "ORCH_OUTBOX_BACKOFF_MAX_SECONDS": "2",
            "ORCH_OUTBOX_POLL_SECONDS": "0.2",
            "ORCH_OUTBOX_TIMEOUT_SECONDS": "3",
            "ORCH_WEBHOOK_MAX_ATTEMPTS": "1000",
            "PYTHONPATH": str(ROOT),  # the workers run this checkout
        }
        procs = Processes(folder, env)
        stack.callback(procs.stop_all)
        settings = settings_for(
            pg_url, scripts, redis_url=redis_url, home=folder / "home", queued_stale_seconds=STALE
        )
        rt = build_runtime(settings, dispatcher=CeleryDispatcher(make_celery(settings)))
        stack.callback(rt.close)
        campaign = Campaign(args, pg_server, DATABASE, redis_server, procs, rt)
        for _ in range(args.workers):
            campaign.start_worker()
        campaign.sweepers.append(procs.sweeper())
        approver = Approver(rt, scripts, args.approvals, campaign.numbers)
        approving = threading.Thread(target=approver.run, daemon=True)
        approving.start()
        for worker in campaign.workers:
            wait_for(worker.ready, 60, what="the workers to be ready", interval=0.1)
        window = args.tasks / args.rate
        campaign.begun = time.monotonic()
        triggers = threading.Thread(target=campaign.trigger_all, args=(window,), daemon=True)
        triggers.start()
        faults = campaign.inject(window)
        triggers.join()
        for timer in campaign.timers:
            timer.join()
        settle = campaign.settle(args.settle)
        drained = wait_for_outbox(campaign.query, args.settle)
        approver.stop.set()
        approving.join()
        found = collect(campaign, backend)
        found["outbox"] = outbox_facts(campaign.query, recorder)
        found["approver"] = approver
        processes = process_findings(campaign, campaign.sweepers)
        lost = [t for t in found["tasks"] if t[2] not in SETTLED]
        ok = not (
            lost
            or campaign.untriggered
            or len(found["tasks"]) != args.tasks
            or found["duplicates"]
            or found["late"]
            or any(found["twice"])
            or found["open_executions"]
            or processes["exited"]
            or any(found["outbox"][name] for name in OUTBOX_FAILURES)
            or approver.errors
        )
        section = summary(
            campaign,
            found,
            processes,
            ok=ok,
            faults=faults,
            window=window,
            settle=settle,
            drained=drained,
            command=command,
            load=(load_start, os.getloadavg()[0]),
            elapsed=time.monotonic() - started,
            broken=len(broken),
        )
        print(section)
        if found["untimed"]:
            print(f"({found['untimed']} rows had no commit timestamp and were not checked)")
        if args.logs is not None:
            args.logs.mkdir(parents=True, exist_ok=True)
            for log in folder.glob("*.log"):
                shutil.copy(log, args.logs / log.name)
            print(f"the processes' logs are in {args.logs}")
        elif not ok:
            for log in sorted(folder.glob("*.log")):
                print(f"--- {log.name}\n{log.read_text(errors='replace')[-2000:]}")
    if args.write:
        write_section("faults", section)
        print(f"wrote the section to {DOC.relative_to(ROOT)}")
    return 0 if ok else 1


@contextmanager
def own_servers() -> Iterator[tuple[Any, Any]]:
    """A Postgres with commit timestamps on (when each row committed, for the fencing check)
    and the store migrated in `DATABASE`, and a redis-server: the tests' helpers, which the
    campaign stops, wipes and restarts."""
    from orchestrator.store.migrations import upgrade
    from tests.services import PostgresServer, RedisServer

    with ExitStack() as stack:
        redis_server = RedisServer()
        stack.callback(redis_server.close)
        redis_server.start()
        pg_server = PostgresServer()
        stack.callback(pg_server.stop)
        pg_server.start()
        with pg_server.connect() as conn:
            conn.execute("ALTER SYSTEM SET track_commit_timestamp = on")
            conn.execute(f"CREATE DATABASE {DATABASE}")
        pg_server.restart()
        upgrade(pg_server.url(DATABASE))
        yield pg_server, redis_server


if __name__ == "__main__":
    raise SystemExit(main())
