"""A dispatcher claims a batch of due rows and posts them one after another: only the row it
posts is "being sent now"; the others wait their turn in its batch, and say so.

Before, every row of the batch read `being sent now (attempt 1, held until T)` for as long as
the batch's claim held (in `outbox list`, `outbox show`, `actions show`, `tasks show` and the
409 that refused a retry), while the dispatcher had not posted them: a backend slow on the
first row showed twenty rows "being sent" of which one was. The row records when its attempt
was posted (`sending_since`, migration 0027).

Both stores, a real HTTP backend on loopback that holds the first send, the CLI and the API.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from orchestrator.api.app import create_app
from orchestrator.errors import ConflictError
from orchestrator.runtime import Runtime
from orchestrator.services.outbox import OutboxDispatcher, OutboxService
from orchestrator.store.outbox import OutboxRow
from tests.outbox_support import (
    Recorder,
    approved_action,
    cli_on,
    outbox_runtime,
    running_recorder,
)


@pytest.fixture
def backend() -> Iterator[Recorder]:
    with running_recorder() as recorder:
        yield recorder


@pytest.fixture
def rt(store_url: str, tmp_path: Path, backend: Recorder) -> Iterator[Runtime]:
    with outbox_runtime(
        store_url, tmp_path, backend, webhook_secret="hook-secret", actions_secret="act-secret"
    ) as runtime:
        yield runtime


def _row(rt: Runtime, outbox_id: int) -> OutboxRow:
    [row] = [r for r in OutboxService(rt.db).list(kind="action") if r.outbox_id == outbox_id]
    return row


def test_only_the_row_posted_is_being_sent_the_rest_of_the_batch_waits_its_turn(
    rt: Runtime,
    tmp_path: Path,
    backend: Recorder,
    store_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from orchestrator.cli import main

    for _ in range(2):
        approved_action(rt, tmp_path)
    only_actions = {"webhook_url": None, "outbox_timeout_seconds": 30.0}
    dispatcher = OutboxDispatcher(rt.settings.model_copy(update=only_actions), rt.db, batch=2)
    backend.delay_seconds, backend.slow_path = 30.0, "/actions"  # held until `release`
    sending = threading.Thread(target=dispatcher.run_once)
    sending.start()
    try:
        assert backend.arrived.wait(10)
        [posted] = backend.on("/actions")
        first = int(posted.headers["x-orchestrator-delivery"])
        [second] = [
            r.outbox_id for r in OutboxService(rt.db).list(kind="action") if r.outbox_id != first
        ]
        assert _row(rt, first).sending_since is not None
        waiting = _row(rt, second)
        assert waiting.attempts == 1  # claimed, its attempt counted
        assert waiting.sending_since is None  # not posted

        cli_on(monkeypatch, store_url, tmp_path)
        assert main(["outbox", "list", "--kind", "action"]) == 0
        lines = capsys.readouterr().out.splitlines()
        [posted_line] = [x for x in lines if x.lstrip().startswith(f"{first} ")]
        [waiting_line] = [x for x in lines if x.lstrip().startswith(f"{second} ")]
        assert "  being sent now" in posted_line
        assert "being sent" not in waiting_line
        assert "  claimed by a dispatcher: waits its turn in its batch" in waiting_line

        assert main(["outbox", "show", str(first)]) == 0
        shown = capsys.readouterr().out
        assert "  being sent now (attempt 1, held until " in shown
        assert ", posted at " in shown
        assert main(["outbox", "show", str(second)]) == 0
        shown = capsys.readouterr().out
        assert "being sent" not in shown
        assert (
            "  claimed by a dispatcher, not sent yet: it waits its turn in the batch the "
            "dispatcher sends (attempt 1, held until "
        ) in shown
        assert main(["actions", "show", str(waiting.action_id)]) == 0
        [delivery] = [x for x in capsys.readouterr().out.splitlines() if "delivery:" in x]
        assert (
            ", claimed by a dispatcher, waiting its turn in its batch (attempt 1, held until "
            in (delivery)
        )

        with pytest.raises(ConflictError) as refused:  # still refused: the batch will send it
            OutboxService(rt.db).retry(second, by="kim")
        assert refused.value.code == "being_sent"
        assert str(refused.value).startswith(
            f"outbox row {second} is claimed by a dispatcher and waits its turn in the batch it "
            "sends (attempt 1, held until "
        )
        with TestClient(create_app(rt.settings, db=rt.db)) as client:
            listed = client.get("/api/v1/outbox?kind=action").json()["items"]
        by_id = {item["outbox_id"]: item for item in listed}
        assert by_id[first]["sending_since"] is not None
        assert by_id[second]["sending_since"] is None
        assert by_id[second]["claimed_until"] is not None
    finally:
        backend.release.set()
        sending.join(30)
        dispatcher.close()
    assert {_row(rt, n).status for n in (first, second)} == {"delivered"}
    assert {_row(rt, n).sending_since for n in (first, second)} == {None}
    assert main(["outbox", "show", str(second), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["sending_since"] is None
