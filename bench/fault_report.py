"""What bench/faults.py writes of a campaign: its section of docs/benchmarks.md (the fleet, the
faults in turn, the table of checks, the tasks that did not end where they should, the
tracebacks in the processes' logs)."""

from __future__ import annotations

import os
import platform
from collections import Counter
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from fault_approvals import expected_status
from fault_timing import LEASE, RENEW, SLOW_WRITE_S, STALE, STALL_BEYOND_LEASE, SWEEP

if TYPE_CHECKING:
    from faults import Campaign

__all__ = ["summary"]


def summary(c: Campaign, found: dict[str, Any], procs: dict[str, Any], **facts: Any) -> str:
    tasks, executions = found["tasks"], found["executions"]
    by_status = Counter(t[2] for t in tasks)
    generations = Counter(t[3] for t in tasks)
    outcomes = Counter(e[3] or "open" for e in executions)
    handed_back = sum(1 for e in executions if e[3] == "lost" and e[4])
    receipts = Counter(r[1] for r in found["receipts"])
    lost = [t for t in tasks if t[2] in ("queued", "running")]
    received = found["received"]
    verdict = "PASSED" if facts["ok"] else "**FAILED**"
    faults = facts["faults"]
    lines = [
        "## Fault campaign",
        "",
        f"Measured {datetime.now(UTC):%Y-%m-%d %H:%M} UTC on {platform.machine()}, "
        f"{os.cpu_count()} CPUs shared with other work (load average {facts['load'][0]:.1f} at "
        f"the start, {facts['load'][1]:.1f} at the end), Python {platform.python_version()}, "
        f"Postgres {c.pg_server.version}, Redis {c.redis_server.version}. Loopback Postgres "
        "(fsync off, commit timestamps on) and redis-server started by the benchmark, "
        f"{c.args.workers} `orchestrator worker --pool threads --concurrency "
        f"{c.args.concurrency}` processes and one `orchestrator sweeper`; lease {LEASE:g} s "
        f"renewed every {RENEW:g} s, sweep every {SWEEP:g} s, stale wake-ups republished after "
        f"{STALE:g} s. Each task's scripted agent reads the task context and a data source, "
        "publishes a plan, thinks "
        f"{c.args.delay:g} s, replaces a setting of its own on a loopback business backend "
        "through `call_api` (a write behind a receipt; one task in three gets a backend that "
        f"answers after {SLOW_WRITE_S:g} s), thinks {c.args.delay:g} s, completes the plan and "
        f"reports. {c.args.tasks} tasks triggered over {facts['window']:.0f} s; "
        f"{sum(faults.values())} faults at even intervals over the same time, in turn "
        f"({', '.join(c.args.kinds)}): SIGKILL of the worker process group holding the most "
        "rounds (a replacement started at once); Redis wiped (FLUSHALL and "
        "kill-and-restart-empty alternately); Postgres stopped for "
        f"{c.args.pg_down:g} s (fast shutdown) and started again; SIGSTOP of the worker "
        f"holding the most rounds for {LEASE + STALL_BEYOND_LEASE:g} s (past its leases: its "
        "generations are requeued while its rounds are frozen), then SIGCONT; SIGKILL of the "
        "sweeper, whose thread is the outbox's dispatcher (another started at once). "
        f"{_approval_text(c.args.approvals)}Run took "
        f"{facts['elapsed']:.0f} s. Command:",
        "",
        f"    {facts['command']}",
        "",
        f"Verdict: {verdict}.",
        "",
        "| check | result |",
        "| --- | --- |",
        f"| faults injected | {faults['kill']} worker SIGKILLs, {faults['redis']} Redis wipes, "
        f"{faults['postgres']} Postgres stops, {faults['stall']} worker stalls, "
        f"{faults['dispatcher']} sweeper (dispatcher) SIGKILLs |",
        f"| rounds that stopped themselves (worker logs) | {_counts(procs['stopped_rounds'])} |",
        f"| leases found gone after a Redis wipe and taken back by their rounds once the store "
        f"said each generation live (worker logs) | {procs['taken_back']} |",
        f"| tasks by final status | {_counts(by_status)} (of {c.args.tasks} triggered; "
        f"{len(c.untriggered)} could not be triggered) |",
        f"| tasks lost (`queued`/`running` after {facts['settle']:.0f} s of settling) | "
        f"{len(lost)} |",
        f"| generations per task | {_counts(generations, 'gen ')} |",
        f"| executions by outcome | {_counts(outcomes)} |",
        f"| lost generations their workers handed back after an outage (counted against "
        f"ORCH_MAX_HANDBACKS, not ORCH_MAX_RECOVERIES) | {handed_back} of {outcomes['lost']} |",
        f"| writes received by the backend | {sum(received.values())} for {len(received)} keys; "
        f"tasks whose write never arrived: {len(found['missing_writes'])} |",
        f"| keys received more than their task's intent rounds allow (done twice) | "
        f"{len(found['duplicates'])} |",
        f"| read-only verifications at the backend (GET) | {found['verify_reads']} |",
        f"| answers the backend could not deliver (the client had gone) | {facts['broken']} |",
        f"| write receipts by status | {_counts(receipts)} |",
        f"| rows accepted from a generation after a later one started (of "
        f"{found['accepted']} timed rows) | {len(found['late'])} |",
        "| rows stored twice (transcript seq, plan request_id, report per generation, "
        f"trigger_id) | {sum(found['twice'])} |",
        f"| executions left open on a settled task | {len(found['open_executions'])} |",
        f"| processes that exited on their own | {len(procs['exited'])} |",
        f"| exit codes after SIGTERM at the end | "
        f"{_counts(Counter(str(code) for _, _, code in procs['stopped']))} |",
        f"| trigger retries while a server was away / wake-ups not sent | "
        f"{c.trigger_retries} / {c.undispatched} |",
        *_outbox_rows(c, found, facts["drained"]),
        "",
        "Faults, seconds from the first trigger:",
        "",
        *[f"- {at:.1f} s: {kind} ({detail})" for at, kind, detail in c.faults],
    ]
    if procs["tracebacks"]:
        lines += ["", "Tracebacks in the process logs (last line, count):", ""]
        lines += [f"- `{line}`: {n}" for line, n in procs["tracebacks"].most_common(10)]
    unsettled = [t for t in tasks if t[2] != expected_status(t[1], c.args.approvals)]
    written: dict[str, list[str]] = {}
    for task_id, status, _summary in found["receipts"]:
        written.setdefault(task_id, []).append(status)
    if unsettled:
        lines += ["", "Tasks that did not complete (and their write's receipt):", ""]
        lines += [
            f"- {t[0]} ({t[1]}): {t[2]} at generation {t[3]}, {t[4] or 'no failure code'}: "
            f"{(t[5] or '').splitlines()[0][:160] if t[5] else ''} "
            f"(receipt: {', '.join(written.get(t[0], ['none']))})"
            for t in unsettled[:20]
        ]
        if any(t[4] == "recovery_limit" for t in unsettled):
            lines += [
                "",
                "`recovery_limit`: ORCH_MAX_RECOVERIES (default 3) generations of the task in a "
                "row were lost by a worker that died or stalled, or ORCH_MAX_HANDBACKS (default "
                "10) were handed back by their workers after an outage of the store or Redis "
                "(here: faults landing on its consecutive generations; its `last_error` says "
                "which); the sweeper parks it as failed, and its write's receipt stays as the "
                "last generation left it (`unknown` when that one was cut off mid-write).",
            ]
        if any(t[4] == "round_limit" for t in unsettled):
            lines += [
                "",
                "`round_limit`: the task's write was cut off before it reached the backend, so "
                "its receipt is `unknown`. The host never sends that write again by itself "
                "(seed 000: `verify_first`) and refuses a plan that completes a node citing it "
                "(`write_not_succeeded`); the scripted agent does not verify, so each generation "
                "continues until ORCH_MAX_ROUNDS and the task fails with the receipt left "
                "`unknown` for an operator to resolve. Nothing was done twice.",
            ]
        lines += ["", "Their generations (outcome, why, tool results not succeeded):", ""]
        lines += [
            f"- {task_id[:8]} gen {gen}: {outcome}, {reason}; {results or '-'}"
            for task_id, gen, outcome, reason, results in found["story"]
        ]
    for late in found["late"][:10]:
        row = late.row
        lines.append(
            f"- LATE: {row.kind} of {row.task_id} generation {row.generation} committed "
            f"{row.committed_at:%H:%M:%S.%f}, generation {late.later_generation} started "
            f"{late.later_started_at:%H:%M:%S.%f}"
        )
    for dup in found["duplicates"][:10]:
        lines.append(f"- TWICE: key {dup.key} received {dup.received}, allowed {dup.allowed}")
    for name, pid, code in procs["exited"]:
        lines.append(f"- EXITED: {name} pid {pid} exited on its own with code {code}")
    return "\n".join(lines) + "\n"


def _approval_text(every: int) -> str:
    if not every:
        return ""
    return (
        f"One task in {every} proposes a work order instead of writing (reads, plans, proposes "
        "the order for a waiting node, reports waiting); a person (a thread of the benchmark, "
        "through the service the API calls) decides each pending one as it appears, rejecting "
        "one in three, after writing the task's next script (it closes the node as decided and "
        "reports); the sweeper's dispatcher posts each approval to a loopback business backend "
        "that applies an action once per `Idempotency-Key`, and every task event there as a "
        "signed webhook (bench/fault_approvals.py). "
    )


def _outbox_rows(c: Campaign, found: dict[str, Any], drained: float) -> list[str]:
    """The human loop's rows of the table: decisions, deliveries, events."""
    if not c.args.approvals:
        return []
    out, person = found["outbox"], found["approver"]
    approval_tasks = [t for t in found["tasks"] if t[1].startswith("a")]
    expected = {t[0]: expected_status(t[1], c.args.approvals) for t in approval_tasks}
    proposed = {row[0] for row in c.query("SELECT DISTINCT task_id FROM actions")}
    # Not where its decision leads, or ended before a work order was proposed at all.
    astray = [t for t in approval_tasks if t[2] != expected[t[0]] or t[0] not in proposed]
    decisions = Counter(person.decided.values())
    approved = out["actions"].get("approved", 0)
    return [
        f"| approval tasks by final status | {_counts(Counter(t[2] for t in approval_tasks))} "
        f"(of {len(approval_tasks)}; not where their decision leads, or never proposed: "
        f"{len(astray)}) |",
        f"| the person's decisions | approved: {decisions['approved']}, rejected: "
        f"{decisions['rejected']}; refused by the store: {_counts(person.refused)}; tried again "
        f"after an error: {person.retries}; stopped by: {'; '.join(person.errors) or 'nothing'} |",
        f"| actions by status (the store) | {_counts(out['actions'])} |",
        f"| approved actions the backend applied (once per key) | "
        f"{approved - len(out['approved_missing'])} of {approved}; outbox row not delivered: "
        f"{len(out['approved_undelivered'])} |",
        f"| actions not approved that reached the backend | {len(out['not_approved_sent'])} |",
        f"| task events the backend received | undelivered rows: "
        f"{len(out['events_undelivered'])}, delivered but never received: "
        f"{len(out['events_unreceived'])}; tasks whose events arrived out of order: "
        f"{len(out['out_of_order'])} |",
        f"| outbox rows by kind and status | {_counts(out['outbox'])} |",
        f"| posts the backend received / sent again with the same delivery id (a dispatcher "
        f"killed between its post and its record) | {out['received']} / {out['resent']} |",
        f"| outbox drained after every task settled | {drained:.1f} s |",
        *[
            f"| approval task astray | {t[0]} ({t[1]}): {t[2]} at generation {t[3]}, "
            f"{t[4] or '-'}: {(t[5] or '-').splitlines()[0][:120]} |"
            for t in astray[:5]
        ],
    ]


def _counts(counter: Counter[Any], prefix: str = "") -> str:
    return ", ".join(f"{prefix}{key}: {n}" for key, n in sorted(counter.items())) or "none"
