"""`orchestrator tasks trigger|list|show|requeue|cancel|evidence|node|ask` (`list` lives in
`task_list`)."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.cli import collaboration, human_steps, task_evidence, task_list
from orchestrator.cli.common import (
    CommandFailed,
    add_json_flag,
    bounded_int,
    checked_body,
    command_runtime,
    login_name,
    print_json,
    printable,
)
from orchestrator.cli.outbox import being_sent, dead_label, hurriable, posting, ways_out
from orchestrator.cli.wake_ups import held_notices, quiet_dispatch_log, say_unsent
from orchestrator.domain.recovery import readable_call

if TYPE_CHECKING:
    from pydantic import BaseModel

__all__ = ["register"]


def register(commands: Any) -> None:
    group = commands.add_parser("tasks", help="trigger and operate condition tasks")
    actions = group.add_subparsers(dest="tasks_command", metavar="ACTION", required=True)

    trigger = actions.add_parser("trigger", help="create and queue a task")
    trigger.add_argument("--type", dest="task_type", required=True, help="task type (script name)")
    trigger.add_argument("--title", required=True)
    trigger.add_argument("--context-file", type=Path, help="JSON object with the task context")
    trigger.add_argument("--sample-input-file", type=Path, help="fixed peripheral sample input")
    trigger.add_argument("--trigger-id", help="idempotency key; the same id returns the same task")
    add_json_flag(trigger)
    trigger.set_defaults(handler=_trigger)

    task_list.register_list(actions)

    show = actions.add_parser("show", help="explain one task: generations, lease, plan, report")
    show.add_argument("task_id")
    add_json_flag(show)
    show.set_defaults(handler=_show)

    transcript = actions.add_parser(
        "transcript", help="the model turns and tool results of a task, as recorded"
    )
    transcript.add_argument("task_id")
    transcript.add_argument(
        "--generation", type=bounded_int(1, 2**31 - 1), help="only this generation"
    )
    add_json_flag(transcript)
    transcript.set_defaults(handler=_transcript)

    requeue = actions.add_parser("requeue", help="start a new generation (fences a running one)")
    requeue.add_argument("task_id")
    requeue.add_argument("--reason", required=True)
    requeue.add_argument("--by", help="who asks (default: your user name)")
    add_json_flag(requeue)
    requeue.set_defaults(handler=_requeue)

    cancel = actions.add_parser("cancel", help="fence the live generation and cancel the task")
    cancel.add_argument("task_id")
    cancel.add_argument("--reason", help="why (recorded with the cancel)")
    cancel.add_argument("--by", help="who asks (default: your user name)")
    add_json_flag(cancel)
    cancel.set_defaults(handler=_cancel)

    task_evidence.register(actions)
    human_steps.register_node(actions)
    collaboration.register_ask(actions)


class _NotFinite(ValueError):
    pass


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400 parses as infinity
        raise _NotFinite(text)
    return value


def _constant(name: str) -> float:
    raise _NotFinite(name)  # NaN, Infinity, -Infinity: not JSON, and no store keeps them


def _bad_text(value: Any, where: str = "") -> str | None:
    """Where a NUL character or an unpaired surrogate hides in `value`, or None."""
    if isinstance(value, str):
        if "\x00" in value:
            return f"a NUL character (\\u0000) at {where or 'the top'}"
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return f"an unpaired surrogate (not UTF-8) at {where or 'the top'}"
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            shown = _printable(key)
            at = f"{where}.{shown}" if where else shown
            found = _bad_text(key, f"the key {at}") or _bad_text(item, at)
            if found:
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found = _bad_text(item, f"{where}[{index}]")
            if found:
                return found
    return None


def _printable(key: str) -> str:
    """A key as one printable line, whatever it holds (newlines, NUL, a lone surrogate)."""
    escaped = json.dumps(key, ensure_ascii=False)[1:-1]
    return escaped.encode("utf-8", "backslashreplace").decode("utf-8")[:60]


def _json_file(path: Path | None, what: str) -> dict[str, Any] | None:
    """The JSON object in `path`; anything else is one line and exit code 2, before any write."""
    if path is None:
        return None
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CommandFailed(f"cannot read {what} {path}: {exc.strerror}", exit_code=2) from None
    except UnicodeDecodeError:
        raise CommandFailed(f"{what} {path} is not UTF-8 text", exit_code=2) from None
    try:
        value = json.loads(text, parse_constant=_constant, parse_float=_finite)
    except _NotFinite as exc:
        raise CommandFailed(
            f"{what} {path} holds the number {exc}: only finite numbers are allowed", exit_code=2
        ) from None
    except json.JSONDecodeError as exc:
        raise CommandFailed(f"{what} {path} is not JSON: {exc}", exit_code=2) from None
    except ValueError as exc:  # e.g. an integer longer than Python converts
        raise CommandFailed(f"{what} {path} is not usable JSON: {exc}", exit_code=2) from None
    except RecursionError:
        raise CommandFailed(f"{what} {path} is nested too deeply", exit_code=2) from None
    if not isinstance(value, dict):
        raise CommandFailed(
            f"{what} {path} must hold a JSON object, not {_json_kind(value)}", exit_code=2
        )
    try:
        found = _bad_text(value)
    except RecursionError:
        raise CommandFailed(f"{what} {path} is nested too deeply", exit_code=2) from None
    if found:
        raise CommandFailed(f"{what} {path} holds {found}: not allowed", exit_code=2)
    return value


def _json_kind(value: Any) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    return "a number"


def _reason_and_by(args: argparse.Namespace, body: type[BaseModel]) -> tuple[str, str]:
    """`--reason` and `--by` checked by the API's own body model (the reason 1..500
    characters); only an absent --by means the user, an empty one (an unset $NAME) is
    refused."""
    by = login_name() if args.by is None else args.by
    given = {} if args.reason is None else {"reason": args.reason}  # a cancel's has a default
    checked = checked_body(body, given | {"by": by})
    return str(checked.reason), str(checked.by)


def _trigger(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from orchestrator.services.dispatch import WakeUp
    from orchestrator.services.task_views import task_view
    from orchestrator.services.tasks import Trigger

    try:
        trigger = Trigger(
            task_type=args.task_type,
            title=args.title,
            context=_json_file(args.context_file, "context file") or {},
            trigger_id=args.trigger_id,
            sample_input=_json_file(args.sample_input_file, "sample input file"),
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"])
        message = str(first["msg"]).removeprefix("Value error, ")
        raise CommandFailed(f"invalid {field}: {message}", exit_code=2) from None
    rt = command_runtime()
    quiet_dispatch_log()  # the CLI says it below, in its own words
    try:
        with held_notices() as notices:
            result = rt.tasks.trigger(trigger)
    finally:
        rt.close()
    task = result.task
    view = task_view(task) | {"created": result.created}
    if args.json:
        print_json(view | {"dispatched": result.dispatched})
    elif not result.created:
        print(f"already exists: task {task.task_id} ({task.status}, generation {task.generation})")
    elif result.dispatched:
        print(f"queued task {task.task_id} ({task.status}, generation {task.generation})")
    else:
        print(f"stored task {task.task_id} (queued, generation {task.generation})")
    # Exit 0 either way, as a requeue: the task is stored and will run (`wake_ups.py`).
    wake_up = WakeUp(
        task.generation,
        sent=result.dispatched,
        error=result.dispatch_error,
        recorded=result.unsent_recorded,
    )
    say_unsent(
        wake_up,
        task.task_id,
        "trigger",
        rt.settings,
        notices,
        done="the task is stored and will run:",
    )
    return 0


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


def _transcript(args: argparse.Namespace) -> int:
    rt = command_runtime()
    try:
        view = rt.tasks.transcript(args.task_id, args.generation)
    finally:
        rt.close()
    from orchestrator.api.models import body_as_sent

    for entry in view["items"]:  # as the API sends it: a body not an object is its JSON text
        entry["body"] = body_as_sent(entry["body"])
    if args.json:
        print_json(view)
    else:
        print(render_transcript(view))
    return 0


def render_transcript(view: dict[str, Any]) -> str:
    """The transcript as a readable page: one line per model turn, call and result. An entry an
    older version wrote in another shape (a body that is not an object, a call without its id or
    name, a key missing) is printed as written, marked `(unreadable)`."""
    lines = [f"transcript of task {view['task_id']}"]
    shown: int | None = None
    for entry in view["items"]:
        if entry["generation"] != shown:
            shown = entry["generation"]
            lines.append(f"generation {shown}:")
        prefix = f"  [{entry['turn']:>2}]" + (
            f" (sub-agent of {entry['parent_call_id']})" if entry.get("parent_call_id") else ""
        )
        lines.extend(_entry_lines(entry, prefix))
    if shown is None:
        lines.append("  (no model turn recorded)")
    total = view["token_usage"]["total"]
    lines.append(
        f"tokens: {total['prompt_tokens']} prompt + {total['completion_tokens']} completion "
        f"in {total['calls']} calls"
    )
    return "\n".join(lines)


def _entry_lines(entry: dict[str, Any], prefix: str) -> list[str]:
    body = entry["body"]
    unreadable = "" if isinstance(body, dict) else f" (unreadable) {printable(_short(body))}"
    body = body if isinstance(body, dict) else {}
    if entry["kind"] == "tool_result":
        detail = body.get("message") or _short(body.get("result"))
        return [
            f"{prefix}   <- {entry.get('call_id')} {entry.get('tool_name')}: "
            f"{entry.get('status')}{unreadable}"
            + (f" ({body['invocation_id']})" if body.get("invocation_id") else "")
            + (f" {detail}" if detail else "")
        ]
    usage = entry.get("usage")
    tokens = f"  [{usage['prompt_tokens']}+{usage['completion_tokens']} tokens]" if usage else ""
    if entry["kind"] == "summary":
        return [f"{prefix} summary:{unreadable or ' ' + _short(body.get('summary'))}{tokens}"]
    if unreadable:
        return [f"{prefix} model:{unreadable}{tokens}"]
    lines = []
    if body.get("reasoning_content"):
        # A reasoning model's thinking, recorded with the turn: why it called what it did.
        lines.append(f"{prefix} thinking: {_short(body['reasoning_content'])}")
    if body.get("content"):
        lines.append(f"{prefix} model: {_short(body['content'])}{tokens}")
        tokens = ""
    malformed = body.get("malformed")
    malformed = malformed if isinstance(malformed, dict) else {}
    calls = body.get("tool_calls") or []
    for call in calls if isinstance(calls, list) else [calls]:
        if not readable_call(call):
            text = call if isinstance(call, str) else _short(call)
            lines.append(f"{prefix}   -> (unreadable) {printable(text)}")
            continue
        sent = _short(call.get("arguments"))
        if "raw_arguments" in call:
            # Unreadable arguments: what the model sent, not the `{}` the history carries.
            sent = f"raw {_short(call['raw_arguments'])}"
        markers = call.get("arguments_markers")
        if isinstance(markers, dict) and markers:
            # Leaked gpt-oss markers the host cut to read the arguments (`argument_markers`).
            around = f"{markers.get('before', '')}…{markers.get('after', '')}"
            sent = f"{sent} (sent as {printable(_short(around))})"
        name = call["name"]
        if call.get("sent_name"):
            # A leaked gpt-oss name the host resolved (`agent.tool_names`): what ran, as sent.
            name = f"{name} (sent as {printable(_short(call['sent_name']))!r})"
        lines.append(f"{prefix}   -> {call['id']} {name} {sent}")
        if call["id"] in malformed:
            lines.append(f"{prefix}      (not run: {_short(malformed[call['id']])})")
    if not body.get("content") and not body.get("tool_calls"):
        lines.append(f"{prefix} model: (no answer){tokens}")
    elif tokens and lines:
        lines[-1] += tokens
    if body.get("cut_off"):
        lines.append(f"{prefix}   (cut off: {_short(body['cut_off'])})")
    return lines


def _short(value: Any, limit: int = 160) -> str:
    if value is None:
        return ""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _requeue(args: argparse.Namespace) -> int:
    from orchestrator.services.task_requests import RequeueBody
    from orchestrator.services.task_views import task_view

    reason, by = _reason_and_by(args, RequeueBody)
    rt = command_runtime()
    quiet_dispatch_log()
    try:
        with held_notices() as notices:
            requeued = rt.tasks.requeue_and_wake(args.task_id, reason, by=by)
    finally:
        rt.close()
    task = requeued.task
    if args.json:
        print_json(task_view(task) | {"dispatched": requeued.wake_up.sent})
    else:
        print(f"requeued task {task.task_id} as generation {task.generation}")
    say_unsent(requeued.wake_up, task.task_id, "requeue", rt.settings, notices)
    return 0


def _cancel(args: argparse.Namespace) -> int:
    from orchestrator.services.task_requests import CancelBody
    from orchestrator.services.task_views import task_view

    reason, by = _reason_and_by(args, CancelBody)
    rt = command_runtime()
    try:
        with held_notices() as notices:
            task = rt.tasks.cancel(args.task_id, reason, by=by)
    finally:
        rt.close()
    if args.json:
        print_json(task_view(task))
    else:
        print(f"cancelled task {task.task_id} (generation {task.generation} fenced)")
    say_unsent(None, task.task_id, "cancel", rt.settings, notices)  # it queues no generation
    return 0


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
            + _time(wait["at"])
            + (f", requeued at the first sweep after {_time(after)}" if after else "")
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
            f"the store's copy: held by {lease['holder']} until {_time(lease['expires_at'])}, "
            "taken back at its worker's next renewal"
        )
    elif lease:
        lines.append(f"  lease held by {lease['holder']} until {_time(lease['expires_at'])}")
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
        lines.append(f"  last fenced write: {last_write['kind']} at {_time(last_write['at'])}")
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
                f"  since {_time(receipt['updated_at'])}  {receipt.get('summary') or ''}"
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
            f"{r['resolved_status']}  by {printable(r['by'])}  at {_time(r['at'])}  "
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
            else f"never attempted, written {_time(row['created_at'])}"
        )
        if row.get("waits_behind"):  # due, but in order: not a stuck dispatcher
            tried += (
                f"; waits behind dead letter outbox {row['waits_behind']} (outbox retry or "
                "discard it)"
            )
        elif row.get("waits_behind_retried"):
            tried += f"; waits behind outbox {row['waits_behind_retried']}, being retried"
        elif posting(row, utcnow()):
            tried += f"; being sent now (held until {_time(row['claimed_until'])})"
        elif being_sent(row, utcnow()):
            tried += (
                "; claimed by a dispatcher, waiting its turn in its batch (held until "
                f"{_time(row['claimed_until'])})"
            )
        if row.get("retried_at"):  # who hurried it or made it due again, as `outbox show` says
            note = f": {printable(row['retry_note'])}" if row.get("retry_note") else ""
            by = printable(row["retried_by"]) if row.get("retried_by") else "an unrecorded name"
            error += f"; retried by {by} at {_time(row['retried_at'])}{note}"
        # The ways out of a failing one, as `actions show` says them: it read as if waiting
        # were all an operator could do (an action is retried until a 2xx).
        if row["status"] == "dead":
            error += (
                f"; `orchestrator outbox retry {row['outbox_id']}` once the backend is mended, "
                f"or `outbox discard {row['outbox_id']} --reason R`"
            )
        elif hurriable(row):
            error += (
                f"; next attempt at {_time(row['next_attempt_at'])}: {ways_out(row['outbox_id'])}"
            )
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


def _time(value: Any) -> str:
    return value.isoformat(timespec="seconds") if hasattr(value, "isoformat") else str(value)
