"""`orchestrator tasks show ID`: one task explained on a page (its generations and why each was
queued, its lease, plan, report, pending approvals, write receipts, recovery snapshot, deliveries
and token usage), or with `--json` as the API sends it."""

from __future__ import annotations

import argparse
from typing import Any

from orchestrator.cli.common import (
    add_json_flag,
    command_runtime,
    print_json,
    printable,
    time_text,
)
from orchestrator.cli.delivery_states import being_sent, dead_label, hurriable, posting, ways_out

__all__ = ["register", "render_explain"]


def register(actions: Any) -> None:
    """Add `show` to the `tasks` sub-commands."""
    show = actions.add_parser("show", help="explain one task: generations, lease, plan, report")
    show.add_argument("task_id")
    add_json_flag(show)
    show.set_defaults(handler=_show)


def _show(args: argparse.Namespace) -> int:
    from orchestrator.services.task_records import TaskRecords

    rt = command_runtime()
    try:
        view = _as_sent(rt.tasks.explain(args.task_id))
        # Until the current generation publishes, the task's plan (where a person's step
        # goes, and which that generation's first plan keeps) is an earlier generation's.
        earlier = None if view.get("plan") else TaskRecords(rt.db).plan(args.task_id)["plan"]
    finally:
        rt.close()
    if args.json:
        print_json(view)
    else:
        print(render_explain(view, earlier=earlier))
    return 0


def _as_sent(view: dict[str, Any]) -> dict[str, Any]:
    """The parts of the explain view that records of older versions may hold in another shape,
    as the API sends them: such a part is its JSON text."""
    from orchestrator.api.explain_views import (
        RecoveryView,
        ReportView,
        as_text_unless,
        payload_as_sent,
    )
    from orchestrator.api.models import ResolutionView
    from orchestrator.api.plan_views import plan_as_sent

    if view.get("plan") is not None:
        view["plan"] = plan_as_sent(view["plan"])
    for action in view.get("pending_actions") or []:
        action["payload"] = payload_as_sent(action["payload"])
    if view.get("report") is not None:
        view["report"] = ReportView.model_validate(view["report"]).model_dump(
            mode="json", exclude_unset=True
        )
    if view.get("recovery") is not None:
        view["recovery"] = RecoveryView.model_validate(view["recovery"]).model_dump(
            mode="json", exclude_unset=True
        )
    view["resolutions"] = [as_text_unless(ResolutionView, r) for r in view["resolutions"]]
    return view


def render_explain(view: dict[str, Any], *, earlier: dict[str, Any] | None = None) -> str:
    """The explain view as a readable page; `earlier`, the task's latest plan when the current
    generation has none (an earlier generation's)."""
    lines = [
        f"task {view['task_id']}  {printable(view['title'])}",
        f"  type {view['task_type']}, origin {view['origin']}, "
        f"trigger {printable(view['trigger_id'])}",
        f"  status {view['status']}"
        + (f" ({view['failure_code']})" if view["failure_code"] else "")
        + f", generation {view['generation']}, session {view['session_id']}",
    ]
    if view.get("waiting_on"):
        lines.append(f"  waiting on: {printable(view['waiting_on'])}")
    if view.get("wake_up_unsent"):
        lines.append(
            "  wake-up not sent: the broker refused it; the sweeper sends it at its first sweep "
            "once the broker takes messages again"
        )
    wait = view.get("handed_back")
    if wait:
        # `running`, yet no round runs: say so, why, and when the next generation is queued.
        after, why = wait["requeue_after"], wait.get("reason") or ""
        lines.append(
            "  handed back at "
            + time_text(wait["at"])
            + (f", requeued at the first sweep after {time_text(after)}" if after else "")
            + (f": {printable(why.removeprefix('handed back: '))}" if why else "")
        )
    if view.get("last_error"):
        lines.append(f"  last error: {printable(view['last_error'])}")
    if view.get("recoveries") or view.get("handbacks"):
        lines.append(
            f"  lost in a row: {view.get('recoveries', 0)} by a worker that died or stalled, "
            f"{view.get('handbacks', 0)} handed back after an outage"
        )
    lease = view.get("lease")
    if lease and lease.get("source") == "store":
        lines.append(
            "  lease not confirmed by the lease back end (Redis restarted, flushed or away); "
            f"the store's copy: held by {lease['holder']} until {time_text(lease['expires_at'])}, "
            "taken back at its worker's next renewal"
        )
    elif lease:
        lines.append(f"  lease held by {lease['holder']} until {time_text(lease['expires_at'])}")
    lines.append("  generations:")
    for ex in view["executions"]:
        outcome = ex["outcome"] or ("running" if ex["started_at"] else "queued")
        if wait and ex["generation"] == view["generation"] and not ex["outcome"]:
            outcome = "handed-back"  # open, but its round stopped: it waits for the sweeper
        lines.append(
            f"    {ex['generation']:>3}  {outcome:11}  {ex['worker'] or '-':24}  "
            f"{printable(ex['reason'] or '')}"
        )
    plan = view.get("plan")
    if plan:
        counts = ", ".join(f"{k} {v}" for k, v in sorted(plan["status_counts"].items()) if v)
        lines.append(f"  plan revision {plan['revision']}: {printable(plan['title'])} ({counts})")
    elif earlier:
        counts = ", ".join(f"{k} {v}" for k, v in sorted(earlier["status_counts"].items()) if v)
        lines.append(
            f"  plan: none yet for this generation; the task's plan is revision "
            f"{earlier['revision']} of generation {earlier['generation']}: "
            f"{printable(earlier['title'])} ({counts}), where a person's step goes"
        )
    else:
        lines.append("  plan: none yet for this generation")
    last_write = view.get("last_write")
    if last_write:
        lines.append(f"  last fenced write: {last_write['kind']} at {time_text(last_write['at'])}")
    elif view["status"] == "running":
        lines.append("  last fenced write: none yet in this generation")
    report = view.get("report")
    if report:
        lines.append(f"  report ({report['outcome']}): {printable(report['summary'])}")
    if view["pending_actions"]:
        lines.append(f"  pending approvals: {len(view['pending_actions'])}")
        for action in view["pending_actions"]:
            lines.append(
                f"    {action['action_id']}  {action['kind']}  node {action['node_id']}"
                f"  digest {action.get('digest', '?')}"
            )
    if view["unknown_receipts"]:
        lines.append(
            f"  write receipts unknown or pending: {len(view['unknown_receipts'])} (verify on the"
            " target, then `orchestrator invocations resolve ID --as succeeded|failed --reason`)"
        )
        for receipt in view["unknown_receipts"]:
            lines.append(
                f"    {receipt['invocation_id']}  {receipt['tool_name']}  {receipt['status']}"
                f"  since {time_text(receipt['updated_at'])}  {receipt.get('summary') or ''}"
            )
    lines += _resolutions(view.get("resolutions") or [])
    recovery = view.get("recovery")
    if recovery:
        lines.append(
            f"  recovery snapshot of generation {recovery['generation']}: "
            f"{len(recovery['done'])} call(s) returned, {len(recovery['unknown'])} unknown"
        )
        for item in recovery["unknown"]:
            call = item if isinstance(item, str) else f"{item['call_id']} {item['tool']}"
            lines.append(f"    unknown: {printable(call)} (verify read-only first)")
    usage = view.get("token_usage")
    if usage and usage["total"]["calls"]:
        per = ", ".join(
            f"gen {u['generation']} {u['prompt_tokens']}+{u['completion_tokens']}"
            for u in usage["generations"]
        )
        total = usage["total"]
        lines.append(
            f"  tokens (prompt+completion): {total['prompt_tokens']}+"
            f"{total['completion_tokens']} in {total['calls']} model calls ({per})"
        )
    if view.get("running_receipts"):
        lines.append(f"  write receipts still running: {len(view['running_receipts'])}")
    lines += _deliveries(view.get("deliveries"), str(view["task_id"]))
    return "\n".join(lines)


def _resolutions(resolutions: list[Any]) -> list[str]:
    """Who settled which unknown or pending write, from what to what, when and why."""
    if not resolutions:
        return []
    lines = [f"  write resolutions by operators: {len(resolutions)}"]
    for r in resolutions:
        if isinstance(r, str):  # recorded by an older version in another shape
            lines.append(f"    {printable(r)}")
            continue
        lines.append(
            f"    {r['invocation_id']}  {r['tool_name']}  {r['previous_status']} -> "
            f"{r['resolved_status']}  by {printable(r['by'])}  at {time_text(r['at'])}  "
            f"(generation {r['generation']}): {printable(r['note'])}"
        )
    return lines


def _deliveries(deliveries: dict[str, Any] | None, task_id: str) -> list[str]:
    """The outbox rows of the task: counts, and each one not delivered (dead ones first; the
    first `UNDELIVERED_SHOWN`, and how to list the rest)."""
    from orchestrator.store.outbox import SETTLED
    from orchestrator.store.types import utcnow

    if not deliveries or not deliveries["counts"]:
        return []
    counts = "; ".join(
        f"{kind} " + ", ".join(f"{status} {n}" for status, n in sorted(by_status.items()))
        for kind, by_status in sorted(deliveries["counts"].items())
    )
    lines = [f"  deliveries: {counts}"]
    # This command often runs without the fleet's settings: it cannot tell that a URL is
    # unset, only that no row of the kind in the store was sent (a stuck dispatcher
    # would have sent some, or dead-lettered them).
    for kind in deliveries.get("never_sent") or []:
        lines.append(
            f"    no {_KIND_NAMES.get(kind, kind)} in this store was delivered, dead-lettered or "
            "tried (delivered ones are kept ORCH_RETENTION_DAYS): they wait until "
            f"{_KIND_URLS.get(kind, 'its URL')} is set where the sweeper or `outbox dispatch` "
            "runs"
        )
    for row in sorted(deliveries["undelivered"], key=lambda r: r["status"] != "dead"):
        what = row["action_id"] or f"event {row['event_id']}"
        error = f", last error: {printable(row['last_error'])}" if row["last_error"] else ""
        if dead_label(row):
            error += f"; {dead_label(row)}"
        tried = (
            f"attempts {row['attempts']} (throttled {row['throttled']})"
            if row["attempts"]
            else f"never attempted, written {time_text(row['created_at'])}"
        )
        if row.get("waits_behind"):  # due, but in order: not a stuck dispatcher
            tried += (
                f"; waits behind dead letter outbox {row['waits_behind']} (outbox retry or "
                "discard it)"
            )
        elif row.get("waits_behind_retried"):
            tried += f"; waits behind outbox {row['waits_behind_retried']}, being retried"
        elif posting(row, utcnow()):
            tried += f"; being sent now (held until {time_text(row['claimed_until'])})"
        elif being_sent(row, utcnow()):
            tried += (
                "; claimed by a dispatcher, waiting its turn in its batch (held until "
                f"{time_text(row['claimed_until'])})"
            )
        if row.get("retried_at"):  # who hurried it or made it due again, as `outbox show` says
            note = f": {printable(row['retry_note'])}" if row.get("retry_note") else ""
            by = printable(row["retried_by"]) if row.get("retried_by") else "an unrecorded name"
            error += f"; retried by {by} at {time_text(row['retried_at'])}{note}"
        # The ways out of a failing one, as `actions show` says them: it read as if waiting
        # were all an operator could do (an action is retried until a 2xx).
        if row["status"] == "dead":
            error += (
                f"; `orchestrator outbox retry {row['outbox_id']}` once the backend is mended, "
                f"or `outbox discard {row['outbox_id']} --reason R`"
            )
        elif hurriable(row):
            at = time_text(row["next_attempt_at"])
            error += f"; next attempt at {at}: {ways_out(row['outbox_id'])}"
        lines.append(
            f"    {row['status'].upper() if row['status'] == 'dead' else row['status']}  "
            f"outbox {row['outbox_id']}  {row['kind']} {what}  {tried}{error}"
        )
    open_count = sum(
        n
        for by_status in deliveries["counts"].values()
        for status, n in by_status.items()
        if status not in SETTLED
    )
    if open_count > len(deliveries["undelivered"]):
        lines.append(
            f"    ... {len(deliveries['undelivered'])} of the {open_count} not delivered shown "
            f"(dead ones first): `orchestrator outbox list --task {task_id}` lists them all"
        )
    return lines


#: What a row of each outbox kind is, and the setting that sends it.
_KIND_NAMES = {"webhook": "task event webhook", "action": "approved action"}
_KIND_URLS = {"webhook": "ORCH_WEBHOOK_URL", "action": "ORCH_ACTIONS_URL"}
