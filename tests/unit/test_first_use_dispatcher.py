"""The CLI's dispatcher is made at the first wake-up a command sends, and every wake-up reaches
it: a command that sends none builds nothing (no Celery), and none is dropped on the way."""

from __future__ import annotations

import pytest

from orchestrator.services.dispatch import FirstUseDispatcher, RecordingDispatcher, dispatch_failure


def test_nothing_is_made_until_a_wake_up_and_then_once() -> None:
    made: list[RecordingDispatcher] = []

    def make() -> RecordingDispatcher:
        made.append(RecordingDispatcher())
        return made[-1]

    dispatcher = FirstUseDispatcher(make)
    assert made == []
    dispatcher.dispatch("t1", 2)
    dispatcher.dispatch("t2", 5, again=True)
    assert len(made) == 1
    assert (made[0].sent, made[0].sent_again) == ([("t1", 2), ("t2", 5)], [("t2", 5)])


def test_a_broker_that_cannot_be_reached_is_said_as_before() -> None:
    """A send that fails is the wake-up not taken, said in one line (the caller records it for
    the sweeper, `wake`), as with a dispatcher made up front."""

    class Down:
        def dispatch(self, task_id: str, generation: int, *, again: bool = False) -> None:
            raise ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    failure = dispatch_failure(FirstUseDispatcher(Down), "t1", 2)
    assert failure == "ConnectionError: Error 111 connecting to 127.0.0.1:6379. Connection refused."


@pytest.mark.parametrize("again", [False, True])
def test_a_republished_wake_up_stays_marked_again(again: bool) -> None:
    inner = RecordingDispatcher()
    dispatcher = FirstUseDispatcher(lambda: inner)
    assert dispatch_failure(dispatcher, "t", 3, again=again) is None
    assert inner.sent_again == ([("t", 3)] if again else [])
