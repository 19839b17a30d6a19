"""`orchestrator tasks`: the group, and the commands that change a task (`trigger`, `requeue`,
`cancel`). `list`, `show`, `transcript` and `evidence` live in `task_list`, `task_show`,
`task_transcript` and `task_evidence`; `node` in `human_steps`, `ask` in `collaboration`."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.cli import (
    collaboration,
    human_steps,
    task_evidence,
    task_list,
    task_show,
    task_transcript,
)
from orchestrator.cli.common import (
    CommandFailed,
    add_json_flag,
    checked_body,
    command_runtime,
    login_name,
    print_json,
)
from orchestrator.cli.json_files import json_object_file
from orchestrator.cli.wake_ups import held_notices, quiet_dispatch_log, say_unsent

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
    task_show.register(actions)
    task_transcript.register(actions)

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
            context=json_object_file(args.context_file, "context file") or {},
            trigger_id=args.trigger_id,
            sample_input=json_object_file(args.sample_input_file, "sample input file"),
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
