"""`orchestrator outbox dispatch`: send the due deliveries to the business backend, once or in a
loop until SIGTERM or Ctrl-C; the sweeper runs the same dispatcher (`services.outbox`). Sends
only the kinds whose URL is set here, and says which it does not send.
"""

from __future__ import annotations

import argparse
import logging
import threading
from typing import Any

from orchestrator.cli.common import CommandFailed, load
from orchestrator.cli.stopping import StopSignals

__all__ = ["register_dispatch"]

log = logging.getLogger("orchestrator.outbox")


def register_dispatch(outbox: Any) -> None:
    """Add `dispatch` to the `outbox` sub-commands."""
    dispatch = outbox.add_parser("dispatch", help="send due deliveries, in a loop")
    dispatch.add_argument("--once", action="store_true", help="one round, then exit")
    dispatch.set_defaults(handler=_dispatch)


#: What each kind is, and the setting without which this process does not send it.
_UNSENT = {
    "action": "approved actions (ORCH_ACTIONS_URL is unset here)",
    "webhook": "task events (ORCH_WEBHOOK_URL is unset here)",
}


def _dispatch(args: argparse.Namespace) -> int:
    from orchestrator.logs import configure_logging
    from orchestrator.services.outbox import OutboxDispatcher
    from orchestrator.store.db import Database

    settings = load()
    if args.once and not settings.outbox_kinds:
        # "delivered 0" read as nothing being due, from a laptop without the fleet's URLs.
        raise CommandFailed(
            "nothing to dispatch: neither ORCH_ACTIONS_URL nor ORCH_WEBHOOK_URL is set here "
            "(deliveries wait in the outbox for a dispatcher that has them)",
            exit_code=2,
        )
    # Said with every report: rows of a kind whose URL is unset here wait, they are not done.
    unsent = [text for kind, text in _UNSENT.items() if kind not in settings.outbox_kinds]
    left = f"; not sent here: {', '.join(unsent)}" if settings.outbox_kinds and unsent else ""
    # As the sweeper's: ORCH_LOG_FORMAT, and masked (httpx logs each request's URL at INFO).
    configure_logging(settings)
    db = Database.from_url(settings.store_url, pool_size=2, max_overflow=1)
    dispatcher = OutboxDispatcher(settings, db)
    try:
        if args.once:
            report = dispatcher.run_once()
            print(
                f"delivered {len(report.delivered)}, failed {len(report.failed)}, "
                f"dead-lettered {len(report.dead)}, throttled {len(report.throttled)}{left}"
            )
            return 0
        signals = StopSignals()
        started = f"dispatching {', '.join(dispatcher.kinds) or 'nothing (no URL set)'}{left}"
        if settings.log_format == "json":
            log.info("%s", started)  # every line a JSON object, as the sweeper's
        else:
            print(started, flush=True)
        # The rounds run in a thread: the main thread only waits for the signal, so no handler
        # ever meets a lock the main thread holds (see orchestrator.cli.stopping).
        failed: list[BaseException] = []

        def _send() -> None:
            try:
                dispatcher.run(signals.event)
            except BaseException as exc:  # raised again below, in the main thread
                failed.append(exc)

        sender = threading.Thread(target=_send, name="outbox", daemon=True)
        sender.start()
        try:
            while sender.is_alive() and not signals.wait(1.0):
                pass
        finally:
            signals.event.set()
            sender.join(timeout=settings.outbox_timeout_seconds + 1)
            signals.close()
        if failed:
            raise failed[0]
        return 0
    finally:
        dispatcher.close()
        db.dispose()
