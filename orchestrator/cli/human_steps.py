"""`orchestrator tasks node ID NODE --complete|--fail|--skip`: a person closes a human node.

The CLI talks to the store directly (an operator on the machine), so `--by` names who acted.
"""

from __future__ import annotations

import argparse
from typing import Any

from orchestrator.cli.common import (
    CommandFailed,
    add_json_flag,
    checked_body,
    command_runtime,
    login_name,
    print_json,
)
from orchestrator.cli.wake_ups import held_notices, quiet_dispatch_log, say_unsent

__all__ = ["register_node"]


def register_node(tasks: Any) -> None:
    node = tasks.add_parser(
        "node", help="complete, fail or skip a human node of the task's current plan"
    )
    node.add_argument("task_id")
    node.add_argument("node_id")
    verb = node.add_mutually_exclusive_group(required=True)
    verb.add_argument("--complete", dest="status", action="store_const", const="completed")
    verb.add_argument("--fail", dest="status", action="store_const", const="failed")
    verb.add_argument("--skip", dest="status", action="store_const", const="skipped")
    node.add_argument("--evidence", help="what was found (required with --complete)")
    node.add_argument("--reason", help="why (required with --fail and --skip)")
    node.add_argument("--by", help="who did it (default: your user name)")
    add_json_flag(node)
    node.set_defaults(handler=_node)


def _node(args: argparse.Namespace) -> int:
    from orchestrator.services.operator_requests import CloseBody, CompleteBody

    # Only an absent --by means the user: an empty one (an unset $NAME) is refused below.
    by = login_name() if args.by is None else args.by
    # The API's own body models check the texts: the same limits on both paths.
    if args.status == "completed":
        if not args.evidence:
            raise CommandFailed("--complete needs --evidence TEXT", exit_code=2)
        text = _checked(CompleteBody, {"by": by, "evidence": args.evidence})
    else:
        if not args.reason:
            raise CommandFailed(f"--{args.status[:4]} needs --reason TEXT", exit_code=2)
        text = _checked(CloseBody, {"by": by, "reason": args.reason})
    rt = command_runtime()  # the step may queue a generation
    quiet_dispatch_log()
    try:
        with held_notices() as notices:
            step = rt.human_steps.close(
                args.task_id,
                args.node_id,
                args.status,
                by=by,
                evidence=text if args.status == "completed" else None,
                reason=None if args.status == "completed" else text,
            )
    finally:
        rt.close()
    if args.json:
        from orchestrator.api.change_views import HumanStepOut

        print_json(HumanStepOut.of(step).model_dump(mode="json"))
    else:
        # A step taken before the current generation published goes into the last one's plan.
        of = (
            f" of generation {step.plan.generation}"
            if step.plan.generation not in (None, step.generation)
            else ""
        )
        print(
            f"node {step.node_id} {step.status} by {step.by} (plan revision "
            f"{step.plan.revision}{of}); task {step.task_id} is {step.task_status}, "
            f"generation {step.generation}"
        )
    say_unsent(step.wake_up, step.task_id, "step", rt.settings, notices)
    return 0


def _checked(model: Any, values: dict[str, str]) -> str:
    body = checked_body(model, values)
    return str(getattr(body, "evidence", None) or body.reason)
