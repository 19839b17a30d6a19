"""`orchestrator tasks trigger|list|show|requeue|cancel`."""

from __future__ import annotations

import argparse
import json
import logging
import math
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from orchestrator.cli.common import CommandFailed, add_json_flag, bounded_int, load, print_json
from orchestrator.domain.vocabulary import TASK_STATUSES
from orchestrator.runtime import Runtime, build_runtime
from orchestrator.services.tasks import Trigger, task_view

__all__ = ["MAX_LIMIT", "register"]

MAX_LIMIT = 200  # the API's bound on `GET /api/v1/tasks?limit=`


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

    listing = actions.add_parser("list", help="tasks, newest first")
    listing.add_argument("--status", choices=TASK_STATUSES)
    listing.add_argument(
        "--limit",
        type=bounded_int(1, MAX_LIMIT),
        default=50,
        help=f"at most this many (1..{MAX_LIMIT}, default 50)",
    )
    add_json_flag(listing)
    listing.set_defaults(handler=_list)

    show = actions.add_parser("show", help="explain one task: generations, lease, plan, report")
    show.add_argument("task_id")
    add_json_flag(show)
    show.set_defaults(handler=_show)

    requeue = actions.add_parser("requeue", help="start a new generation (fences a running one)")
    requeue.add_argument("task_id")
    requeue.add_argument("--reason", required=True)
    add_json_flag(requeue)
    requeue.set_defaults(handler=_requeue)

    cancel = actions.add_parser("cancel", help="fence the live generation and cancel the task")
    cancel.add_argument("task_id")
    cancel.add_argument("--reason", default="cancelled by an operator")
    add_json_flag(cancel)
    cancel.set_defaults(handler=_cancel)


def _runtime() -> Runtime:
    return build_runtime(load())


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


def _reason(args: argparse.Namespace, body: type[BaseModel]) -> str:
    """`--reason` checked by the API's own body model: 1..500 characters."""
    try:
        return str(body.model_validate({"reason": args.reason}).model_dump()["reason"])
    except ValidationError as exc:
        raise CommandFailed(f"invalid --reason: {exc.errors()[0]['msg']}", exit_code=2) from None


def _trigger(args: argparse.Namespace) -> int:
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
        raise CommandFailed(f"invalid {field}: {first['msg']}", exit_code=2) from None
    rt = _runtime()
    # The CLI says it below, in its own words; the service's log line would repeat it.
    logging.getLogger("orchestrator.services.dispatch").setLevel(logging.ERROR)
    try:
        result = rt.tasks.trigger(trigger)
        stale = rt.settings.queued_stale_seconds
    finally:
        rt.close()
    view = task_view(result.task) | {"created": result.created}
    if args.json:
        print_json(view | {"dispatched": result.dispatched})
    elif result.dispatched:
        verb = "queued" if result.created else "already exists:"
        print(
            f"{verb} task {result.task.task_id} ({result.task.status}, "
            f"generation {result.task.generation})"
        )
    else:
        print(f"stored task {result.task.task_id} (queued, generation {result.task.generation})")
    if not result.dispatched:
        raise CommandFailed(
            f"the broker did not take the wake-up of task {result.task.task_id}; it is stored "
            f"and the sweeper will republish the wake-up after {stale:g}s"
        )
    return 0


def _list(args: argparse.Namespace) -> int:
    rt = _runtime()
    try:
        found = rt.tasks.list_tasks(status=args.status, limit=args.limit)
    finally:
        rt.close()
    if args.json:
        print_json([task_view(task) for task in found])
        return 0
    if not found:
        print("no tasks")
        return 0
    print(f"{'TASK':36}  {'STATUS':9}  {'GEN':>3}  {'TYPE':20}  TITLE")
    for task in found:
        print(
            f"{task.task_id:36}  {task.status:9}  {task.generation:>3}  "
            f"{task.task_type[:20]:20}  {task.title}"
        )
    return 0


def _show(args: argparse.Namespace) -> int:
    rt = _runtime()
    try:
        view = rt.tasks.explain(args.task_id)
    finally:
        rt.close()
    if args.json:
        print_json(view)
    else:
        print(render_explain(view))
    return 0


def _requeue(args: argparse.Namespace) -> int:
    from orchestrator.api.tasks import RequeueBody

    reason = _reason(args, RequeueBody)
    rt = _runtime()
    try:
        task = rt.tasks.requeue(args.task_id, reason)
    finally:
        rt.close()
    if args.json:
        print_json(task_view(task))
    else:
        print(f"requeued task {task.task_id} as generation {task.generation}")
    return 0


def _cancel(args: argparse.Namespace) -> int:
    from orchestrator.api.tasks import CancelBody

    reason = _reason(args, CancelBody)
    rt = _runtime()
    try:
        task = rt.tasks.cancel(args.task_id, reason)
    finally:
        rt.close()
    if args.json:
        print_json(task_view(task))
    else:
        print(f"cancelled task {task.task_id} (generation {task.generation} fenced)")
    return 0


def render_explain(view: dict[str, Any]) -> str:
    """The explain view as a readable page."""
    lines = [
        f"task {view['task_id']}  {view['title']}",
        f"  type {view['task_type']}, origin {view['origin']}, trigger {view['trigger_id']}",
        f"  status {view['status']}"
        + (f" ({view['failure_code']})" if view["failure_code"] else "")
        + f", generation {view['generation']}, session {view['session_id']}",
    ]
    if view.get("last_error"):
        lines.append(f"  last error: {view['last_error']}")
    lease = view.get("lease")
    if lease:
        lines.append(f"  lease held by {lease['holder']} until {_time(lease['expires_at'])}")
    lines.append("  generations:")
    for ex in view["executions"]:
        outcome = ex["outcome"] or ("running" if ex["started_at"] else "queued")
        lines.append(
            f"    {ex['generation']:>3}  {outcome:10}  {ex['worker'] or '-':24}  "
            f"{ex['reason'] or ''}"
        )
    plan = view.get("plan")
    if plan:
        counts = ", ".join(f"{k} {v}" for k, v in sorted(plan["status_counts"].items()) if v)
        lines.append(f"  plan revision {plan['revision']}: {plan['title']} ({counts})")
    else:
        lines.append("  plan: none yet for this generation")
    last_write = view.get("last_write")
    if last_write:
        lines.append(f"  last fenced write: {last_write['kind']} at {_time(last_write['at'])}")
    elif view["status"] == "running":
        lines.append("  last fenced write: none yet in this generation")
    report = view.get("report")
    if report:
        lines.append(f"  report ({report['outcome']}): {report['summary']}")
    if view["pending_actions"]:
        lines.append(f"  pending approvals: {len(view['pending_actions'])}")
        for action in view["pending_actions"]:
            lines.append(f"    {action['action_id']}  {action['kind']}  node {action['node_id']}")
    if view["unknown_receipts"]:
        lines.append(f"  write receipts with unknown outcome: {len(view['unknown_receipts'])}")
    return "\n".join(lines)


def _time(value: Any) -> str:
    return value.isoformat(timespec="seconds") if hasattr(value, "isoformat") else str(value)
