"""The Celery app: Redis broker when configured, Kombu's filesystem transport when embedded.

Delivery is a wake-up, not an order: acks late, a lost worker's message is rejected back, one
message prefetched at a time, and a visibility timeout longer than any run. The execution
service decides whether a delivered message may start an agent.

`celery -A workers.celery_app worker` works as well as `orchestrator worker`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from celery import Celery, concurrency
from celery.signals import after_setup_logger, setup_logging
from celery.utils import uuid

from orchestrator.logs import RedactFilter, configure_logging, secrets_of
from orchestrator.settings import Settings, SettingsError, get_settings
from workers import filesystem_broker
from workers.constants import (
    CLEANUP,
    CLEANUP_INTERVAL_SECONDS,
    QUEUE,
    RUN_GENERATION,
    SENT_AGAIN,
    SWEEP,
)

__all__ = [
    "CLEANUP_INTERVAL_SECONDS",
    "CeleryDispatcher",
    "app",
    "install_worker_logging",
    "make_celery",
]

#: Longer than any round may run; a redelivery before that would be a second wake-up only.
VISIBILITY_TIMEOUT_SECONDS = 6 * 3600


#: Bounds of one connection attempt and of one answer from a Redis broker.
BROKER_CONNECT_TIMEOUT_SECONDS = 3.0
BROKER_SOCKET_TIMEOUT_SECONDS = 5.0
#: A publish is retried this few times, quickly: a trigger's caller is waiting.
PUBLISH_RETRY_POLICY = {
    "max_retries": 1,
    "interval_start": 0,
    "interval_step": 0.5,
    "interval_max": 0.5,
}


#: `--pool threads` and `--pool solo` are Celery's, whose cold shutdown hands the rounds back
#: instead of failing them (workers/pool.py), for `orchestrator worker` and `celery ... worker`.
concurrency.ALIASES["threads"] = "workers.pool:ThreadPool"
concurrency.ALIASES["solo"] = "workers.pool:SoloPool"


def broker_folder(settings: Settings) -> Path:
    return (settings.home / "broker").resolve()


def make_celery(settings: Settings) -> Celery:
    celery = Celery("orchestrator", include=["workers.tasks"])
    options: dict[str, Any] = {"visibility_timeout": VISIBILITY_TIMEOUT_SECONDS}
    transport: str | None = None
    if settings.redis_url:
        # Imported for a Redis broker alone: it imports redis-py, which an embedded process
        # (an operator's command sending a wake-up to the file broker) has no use for.
        from workers.broker import TRANSPORT

        broker = settings.redis_url
        transport = TRANSPORT  # Kombu's, mended to survive a Redis restart (see broker.py)
        # A Redis that is down or does not answer fails a publish in bounded time (a trigger
        # then says so; the sweeper republishes), never a hang.
        options.update(
            socket_connect_timeout=BROKER_CONNECT_TIMEOUT_SECONDS,
            socket_timeout=BROKER_SOCKET_TIMEOUT_SECONDS,
        )
    else:
        folder = broker_folder(settings)
        for sub in ("queue", "staging", "processed", "control"):
            try:
                (folder / sub).mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise SettingsError(
                    f"ORCH_HOME: cannot create the broker folder {folder / sub}: "
                    f"{exc.strerror or exc}"
                ) from None
        broker = "filesystem://"
        transport = filesystem_broker.TRANSPORT  # Kombu's, mended: whole files only
        options.update(
            data_folder_in=str(folder / "queue"),
            data_folder_out=str(folder / "queue"),
            staging_folder=str(folder / "staging"),
            processed_folder=str(folder / "processed"),
            control_folder=str(folder / "control"),  # the exchange table; else ./control
            store_processed=False,
            polling_interval=0.1,
        )
    celery.conf.update(
        broker_url=broker,
        broker_transport=transport,
        broker_transport_options=options,
        broker_connection_retry_on_startup=True,
        # A lost broker connection leaves running rounds alone (their leases fence them) and
        # reconnects; Celery 6 would cancel them by default.
        worker_cancel_long_running_tasks_on_connection_loss=False,
        task_publish_retry_policy=PUBLISH_RETRY_POLICY,
        task_default_queue=QUEUE,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_ignore_result=True,
        task_serializer="json",
        accept_content=["json"],
        worker_prefetch_multiplier=1,
        worker_hijack_root_logger=False,
        worker_enable_remote_control=settings.redis_url is not None,
        worker_send_task_events=False,
        beat_schedule={
            "sweep": {
                "task": SWEEP,
                "schedule": settings.sweep_seconds,
                "options": {"expires": settings.sweep_seconds},
            },
            "cleanup": {
                "task": CLEANUP,
                "schedule": CLEANUP_INTERVAL_SECONDS,
                "options": {"expires": CLEANUP_INTERVAL_SECONDS},
            },
        },
    )
    celery.conf.task_routes = {
        RUN_GENERATION: {"queue": QUEUE},
        SWEEP: {"queue": QUEUE},
        CLEANUP: {"queue": QUEUE},
    }
    return celery


class CeleryDispatcher:
    """Sends the wake-up of one generation to the worker fleet."""

    def __init__(self, celery: Celery) -> None:
        self.celery = celery

    def dispatch(self, task_id: str, generation: int, *, again: bool = False) -> None:
        # A header, not an argument: a worker of an earlier version ignores it.
        headers = {SENT_AGAIN: True} if again else None
        self.celery.send_task(
            RUN_GENERATION, args=[task_id, generation], queue=QUEUE, headers=headers
        )

    def dispatch_many(self, wakeups: list[tuple[str, int]]) -> None:
        """A sweep's batch of wake-ups in one publish: Kombu's publish batch, one Redis pipeline.

        Each message is the one `send_task` would send (Celery's own `create_task_message` and
        `send_task_message`, with their publish signals), without what `send_task` adds around
        them per message for a caller's task: routing, the parent task's trail of results, the
        result backend's hook. That is 40 % of a batch's cost (bench/executions.py, sweeps).
        """
        amqp = self.celery.amqp
        with self.celery.producer_or_acquire() as producer, producer.batch():
            for number, (task_id, generation) in enumerate(wakeups):
                args = [task_id, generation]
                message = amqp.create_task_message(
                    uuid(),
                    RUN_GENERATION,
                    args,
                    {},
                    # Celery's safe repr of the arguments, per message: a plain repr suffices.
                    argsrepr=repr(args),
                    kwargsrepr="{}",
                )
                # The queue is declared once for the batch, not again with every message.
                declare: list[Any] | None = None if number == 0 else []
                amqp.send_task_message(
                    producer, RUN_GENERATION, message, queue=QUEUE, declare=declare
                )


def install_worker_logging(settings: Settings) -> None:
    """ORCH_LOG_FORMAT for the worker: JSON replaces Celery's set-up; text keeps Celery's
    lines and masks secrets in them. Only a worker's start-up sends these signals."""
    if settings.log_format == "json":

        def _json(loglevel: Any = None, **_: Any) -> None:
            configure_logging(settings, loglevel or "INFO")

        setup_logging.connect(_json, weak=False)

    else:

        def _mask(logger: Any = None, **_: Any) -> None:
            for handler in getattr(logger, "handlers", []):
                handler.addFilter(RedactFilter(secrets_of(settings)))

        after_setup_logger.connect(_mask, weak=False)


app = make_celery(get_settings())
install_worker_logging(get_settings())
