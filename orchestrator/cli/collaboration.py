"""`orchestrator tasks ask ID "question"`: ask about a task in its collaboration session.

The collaboration service runs the agent: it is imported when `ask` runs, not with the parser.
"""

from __future__ import annotations

import argparse
from typing import Any

from orchestrator.cli.common import CommandFailed, add_json_flag, load, login_name, print_json
from orchestrator.errors import ValidationFailed

__all__ = ["register_ask"]


def register_ask(tasks: Any) -> None:
    ask = tasks.add_parser(
        "ask", help="ask about a task; the agent answers from its plan, report and evidence"
    )
    ask.add_argument("task_id")
    ask.add_argument("question")
    ask.add_argument(
        "--idempotency-key",
        metavar="KEY",
        type=_idempotency_key,
        help="ask once per KEY: a retry returns the first answer (another question is refused)",
    )
    add_json_flag(ask)
    ask.set_defaults(handler=_ask)


def _idempotency_key(text: str) -> str:
    """An argparse `type`: the API's rule for an `Idempotency-Key`, checked before the store or
    the model is reached, so a malformed key is a usage error (exit 2) like any bad argument."""
    from orchestrator.services.collaboration import _checked_key as checked_key

    try:
        checked = checked_key(text)
    except ValidationFailed as exc:
        raise argparse.ArgumentTypeError(exc.message) from None
    assert checked is not None
    return checked


def _ask(args: argparse.Namespace) -> int:
    from orchestrator.services.collaboration import CollaborationService
    from orchestrator.store.db import Database

    if not args.question.strip() or len(args.question) > 4000:
        raise CommandFailed("the question must be 1-4000 characters", exit_code=2)
    settings = load()
    db = Database.from_url(settings.store_url)
    try:
        service = CollaborationService(db, settings)
        session, _ = service.open(args.task_id, owner=login_name(option=None))
        answered = service.ask(
            session.session_id,
            args.question,
            caller=session.owner,
            idempotency_key=args.idempotency_key,
        )
    finally:
        db.dispose()
    if args.json:
        print_json(
            {
                "session_id": session.session_id,
                "question": answered.question.__dict__,
                "answer": answered.answer.__dict__,
            }
        )
    else:
        print(answered.answer.text)
    return 0
