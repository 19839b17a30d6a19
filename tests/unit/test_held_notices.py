"""A command says the change notices Redis refused for its own change, never a warning another
thread of its process logged meanwhile (an API's subscription in the same process, as the
integration tests run one): `cli/wake_ups.held_notices` keeps the command's thread's only."""

from __future__ import annotations

import logging
import threading

from orchestrator.cli.wake_ups import held_notices

EVENTS = logging.getLogger("orchestrator.events")


def test_only_the_command_s_own_thread_s_notices_are_held() -> None:
    with held_notices() as notices:
        other = threading.Thread(
            target=EVENTS.warning,
            args=("plan wake-up subscription lost (%s); retrying", ConnectionError("refused")),
        )
        other.start()
        other.join()
        assert notices.errors == []
        EVENTS.warning("%d change notice(s) not published (%s)", 1, ConnectionError("down"))
    assert notices.errors == ["down"]
