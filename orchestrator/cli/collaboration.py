"""`orchestrator tasks ask ID "question"`: ask about a task in its collaboration session."""

from __future__ import annotations

import argparse
import getpass
from typing import Any

from orchestrator.cli.common import CommandFailed, add_json_flag, load, print_json
from orchestrator.services.collaboration import CollaborationService
from orchestrator.store.db import Database

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
        help="ask once per KEY: a retry returns the first answer (another question is refused)",
    )
    add_json_flag(ask)
    ask.set_defaults(handler=_ask)


def _ask(args: argparse.Namespace) -> int:
    if not args.question.strip() or len(args.question) > 4000:
        raise CommandFailed("the question must be 1-4000 characters", exit_code=2)
    settings = load()
    db = Database.from_url(settings.store_url)
    try:
        service = CollaborationService(db, settings)
        session, _ = service.open(args.task_id, owner=getpass.getuser())
        answered = service.ask(
            session.session_id, args.question, idempotency_key=args.idempotency_key
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
