"""The embedded broker under concurrent producers and consumers: every message whole, once.

Kombu 5.7.0's own filesystem transport fails this (a consumer reads a file still being
written: `JSONDecodeError`, and the message is gone); `workers.filesystem_broker` must not.
Real processes on a real folder; no server is needed.
"""

from __future__ import annotations

import time
from pathlib import Path
from queue import Empty
from typing import Any

import pytest
from kombu import Connection

from orchestrator.settings import load_settings
from tests.processes import preloaded_context
from workers import filesystem_broker
from workers.celery_app import broker_folder, make_celery

PRODUCERS, CONSUMERS, PER_PRODUCER = 3, 3, 80
PAD = "x" * 100_000  # large enough that a write is not one syscall's worth of page cache


def _options(folder: Path) -> dict[str, Any]:
    return {
        "data_folder_in": str(folder / "queue"),
        "data_folder_out": str(folder / "queue"),
        "staging_folder": str(folder / "staging"),
        "processed_folder": str(folder / "processed"),
        "control_folder": str(folder / "control"),
        "store_processed": False,
    }


def _connection(folder: Path) -> Connection:
    return Connection(
        "filesystem://", transport=filesystem_broker.TRANSPORT, transport_options=_options(folder)
    )


def _produce(folder: Path, tag: int) -> None:
    with _connection(folder) as connection:
        queue = connection.SimpleQueue("wake")
        for number in range(PER_PRODUCER):
            queue.put({"id": f"{tag}-{number}", "pad": PAD})
        queue.close()


def _consume(folder: Path, done: Any, results: Any) -> None:
    received: list[str] = []
    errors: list[str] = []
    deadline = time.monotonic() + 60
    with _connection(folder) as connection:
        queue = connection.SimpleQueue("wake")
        while time.monotonic() < deadline:
            try:
                message = queue.get(timeout=0.05)
            except Empty:
                if done.is_set():
                    break
                continue
            except Exception as exc:  # what Kombu's own transport raises here
                errors.append(type(exc).__name__)
                continue
            payload = message.payload
            if payload["pad"] != PAD:
                errors.append("truncated")
            received.append(payload["id"])
            message.ack()
    results.put((received, errors))


def test_concurrent_producers_and_consumers_see_every_message_whole_and_once(
    tmp_path: Path,
) -> None:
    for sub in ("queue", "staging", "processed", "control"):
        (tmp_path / sub).mkdir()
    context = preloaded_context(__name__)
    done, results = context.Event(), context.Queue()
    consumers = [
        context.Process(target=_consume, args=(tmp_path, done, results)) for _ in range(CONSUMERS)
    ]
    producers = [context.Process(target=_produce, args=(tmp_path, n)) for n in range(PRODUCERS)]
    for process in consumers + producers:
        process.start()
    for process in producers:
        process.join(60)
        assert process.exitcode == 0
    done.set()
    outcomes = [results.get(timeout=90) for _ in consumers]
    for process in consumers:
        process.join(30)
    received = [identifier for got, _ in outcomes for identifier in got]
    errors = [error for _, errs in outcomes for error in errs]
    assert errors == []
    expected = {f"{tag}-{n}" for tag in range(PRODUCERS) for n in range(PER_PRODUCER)}
    assert sorted(received) == sorted(expected)  # each exactly once
    leftovers = [
        p.name for sub in ("queue", "staging", "processed") for p in (tmp_path / sub).iterdir()
    ]
    assert leftovers == []


def test_a_message_is_never_visible_in_the_queue_before_it_is_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue_folder = tmp_path / "queue"
    queue_folder.mkdir()
    seen_while_writing: list[str] = []
    write = filesystem_broker._write_then_rename

    def watched(folder: Path, target: Path, data: bytes) -> None:
        seen_while_writing.extend(p.name for p in queue_folder.iterdir())
        write(folder, target, data)

    monkeypatch.setattr(filesystem_broker, "_write_then_rename", watched)
    with _connection(tmp_path) as connection:
        channel = connection.default_channel
        channel._put("wake", {"id": "only"})
        assert seen_while_writing == []
        (message,) = list(queue_folder.iterdir())
        assert message.name.endswith(".wake.msg")
        assert list((tmp_path / "staging").iterdir()) == []
        assert channel._get("wake") == {"id": "only"}
        with pytest.raises(Empty):
            channel._get("wake")


def test_the_embedded_celery_app_uses_the_mended_transport(tmp_path: Path) -> None:
    settings = load_settings(home=tmp_path)
    conf = make_celery(settings).conf
    assert conf.broker_transport == filesystem_broker.TRANSPORT
    staging = Path(conf.broker_transport_options["staging_folder"])
    assert staging == broker_folder(settings) / "staging"
    assert staging.is_dir()


def test_the_broker_is_named_by_its_folder(tmp_path: Path) -> None:
    """What Celery's worker banner (`.> transport:`) and its `Connected to` line print,
    `app.connection().as_uri()`, read `workers.filesystem_broker:Transport://:**@localhost//`
    for the embedded broker: a module path, a password and a host it never had."""
    settings = load_settings(home=tmp_path / "home")
    celery = make_celery(settings)
    with celery.connection() as connection:
        assert connection.as_uri() == f"filesystem://{broker_folder(settings)}"
        assert connection.as_uri(include_password=True) == connection.as_uri()
