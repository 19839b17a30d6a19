"""`orchestrator worker`, `orchestrator sweeper` and `orchestrator recover`."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from orchestrator.cli.cleanup import describe as describe_cleanup
from orchestrator.cli.common import (
    CommandFailed,
    add_json_flag,
    bounded_int,
    load,
    one_line,
    print_json,
)
from orchestrator.cli.db import check_store_ready, refuse_newer_store
from orchestrator.cli.stopping import StopSignals

if TYPE_CHECKING:
    from orchestrator.services.sweeper import Sweeper, SweepReport
    from orchestrator.settings import Settings
    from orchestrator.store.db import Database

__all__ = ["HEARTBEAT", "WORKER_LOG_LEVELS", "register"]

log = logging.getLogger("orchestrator.sweeper")

#: Concurrent executions of one worker process on the threads pool, unless `--concurrency`.
DEFAULT_THREADS = 100
#: Celery's level names.
WORKER_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL", "FATAL")


def register(commands: Any) -> None:
    worker = commands.add_parser("worker", help="run a Celery worker of the fleet")
    worker.add_argument(
        "--pool",
        choices=("threads", "prefork", "solo"),
        default="threads",
        help="threads (default): many executions per process, as they mostly wait on the model",
    )
    worker.add_argument(
        "--concurrency",
        type=bounded_int(1, 10_000),
        default=None,
        help=f"concurrent executions (default {DEFAULT_THREADS} with threads; CPUs with prefork)",
    )
    worker.add_argument("--beat", action="store_true", help="also run the periodic sweep")
    worker.add_argument("--loglevel", default="INFO", type=str.upper, choices=WORKER_LOG_LEVELS)
    worker.add_argument("--name", default=None, help="Celery node name (default celery@host)")
    worker.set_defaults(handler=_worker)

    sweeper = commands.add_parser("sweeper", help="requeue expired generations, in a loop")
    sweeper.add_argument("--once", action="store_true", help="one sweep, then exit")
    sweeper.add_argument(
        "--no-outbox",
        action="store_true",
        help="do not run the outbox dispatcher (`orchestrator outbox dispatch` runs it alone)",
    )
    sweeper.set_defaults(handler=_sweeper)

    recover = commands.add_parser("recover", help="one sweep now, printing what it requeued")
    add_json_flag(recover)
    recover.add_argument(
        "--no-grace",
        action="store_true",
        help="requeue expired leases at once, without leaving them a few seconds to their "
        "workers' hand-backs (as after a store outage)",
    )
    recover.set_defaults(handler=_recover)


def _worker(args: argparse.Namespace) -> int:
    # The agent's and its tools' checks: imported by this command alone.
    from orchestrator.agent.model import check_model_setting
    from orchestrator.logs import configure_logging
    from orchestrator.tools.source_declarations import DataSourceError, load_sources
    from orchestrator.tools.toolsets import SpecError, check_gateway

    if args.name:
        from celery.utils.nodenames import host_format

        try:
            host_format(args.name)  # Celery's own expansion, checked before anything else
        except ValueError as exc:
            raise CommandFailed(f"--name: {one_line(exc)}", exit_code=2) from None
    settings = load()  # a bad setting stops here with one line, before Celery starts
    check_model_setting(settings)  # no silent default model (issue 12); a setting, so first
    try:
        check_gateway(settings)  # as the worker's own start-up check does, before the store's
    except SpecError as exc:
        print(exc.message, file=sys.stderr)
        return 2
    try:
        # As the worker's own start-up check does.
        load_sources(settings.data_sources, tool_timeout_seconds=settings.tool_timeout_seconds)
    except DataSourceError as exc:
        print(one_line(exc), file=sys.stderr)
        return 2
    # An unreachable or unmigrated store stops here too, instead of a traceback and "ready".
    check_store_ready(settings.store_url)
    concurrency = args.concurrency or (DEFAULT_THREADS if args.pool == "threads" else _cpus())
    if settings.metrics_port:
        _metrics_for_prefork(settings)
        from orchestrator.metrics import WORKER_SLOTS
        from orchestrator.store.db import Database

        # Before the port answers (`_serve` below): a scrape never reads a worker with no slots.
        WORKER_SLOTS.set(1 if args.pool == "solo" else concurrency)  # solo runs one at a time
        _serve(settings, Database.from_url(settings.store_url, pool_size=1))
    from workers.celery_app import app

    argv = ["worker", "--loglevel", args.loglevel, "--without-gossip", "--without-mingle"]
    if settings.log_format == "json":
        argv.insert(0, "--quiet")  # no banner: every line is a JSON object
        # Celery warns (as root: its superuser warning) before it sets up its logging, which
        # would print that warning as several lines of text: JSON from the start.
        configure_logging(settings, args.loglevel.upper())
    argv += ["--pool", args.pool, "--concurrency", str(concurrency)]
    if args.beat:
        argv.append("--beat")
    if args.name:
        argv += ["--hostname", args.name]
    from celery.bin.celery import celery as celery_command

    # `app.worker_main` drops the exit code of Celery's command; a worker that stopped on an
    # error must exit non-zero, so that every supervisor (`restart: on-failure` too) restarts it.
    celery_command.params[0].default = app
    code = celery_command.main(args=argv, standalone_mode=False)
    return code if isinstance(code, int) else 0


def _metrics_for_prefork(settings: Settings) -> None:
    """Pool processes count into files of a fresh PROMETHEUS_MULTIPROC_DIR; this (parent)
    process serves their sum and the store's counts on ORCH_METRICS_PORT. The folders that
    workers now gone left there are removed first (`orchestrator.metrics_folders`). Before
    `orchestrator.metrics` is imported: prometheus-client picks its value store then."""
    from orchestrator.metrics_folders import claim_folder

    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        try:
            folder = claim_folder((settings.home / "metrics").resolve())
        except OSError as exc:
            raise CommandFailed(
                f"ORCH_HOME: cannot create the metrics folder under {settings.home}: "
                f"{exc.strerror or exc}",
                exit_code=2,
            ) from None
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(folder)


def _cpus() -> int:
    """Celery's default concurrency (billiard's count of CPUs), given to it explicitly so that
    its pool and `orchestrator_worker_slots` agree."""
    from billiard import cpu_count  # type: ignore[import-untyped]  # Celery's, untyped

    return int(cpu_count())


def _serve(settings: Settings, db: Database) -> None:
    """The /metrics server on ORCH_METRICS_PORT; a port that cannot be had is one line, exit 2."""
    from orchestrator.metrics import serve_metrics

    try:
        serve_metrics(settings.metrics_port, db, settings.outbox_kinds)
    except OSError as exc:
        raise CommandFailed(
            f"ORCH_METRICS_PORT: cannot serve /metrics on port {settings.metrics_port}: "
            f"{exc.strerror or exc}",
            exit_code=2,
        ) from None


def _sweeper(args: argparse.Namespace) -> int:
    from sqlalchemy.exc import SQLAlchemyError

    from orchestrator.cli.store_errors import describe_store_error
    from orchestrator.logs import configure_logging
    from orchestrator.runtime import build_runtime
    from orchestrator.services.outbox import OutboxDispatcher

    settings = load()
    # A store migrated by a newer orchestrator stops here with one line: no sweep of this code
    # can mend it. One behind is swept on (each failure says to run `db upgrade`), as one that
    # does not answer is: both may be mended while the loop runs.
    with contextlib.suppress(SQLAlchemyError):
        refuse_newer_store(settings.store_url)
    configure_logging(settings)
    rt = build_runtime(settings)
    # Imported here: prometheus-client picks its value store on import, after the worker
    # command has set PROMETHEUS_MULTIPROC_DIR.
    from orchestrator.metrics import SWEEPS, sweeper_redis_unreachable

    if settings.redis_url:
        sweeper_redis_unreachable()  # exported from the start, a store away at the first sweep

    if settings.metrics_port and not args.once:
        try:
            _serve(settings, rt.db)
        except CommandFailed:
            rt.close()
            raise
    signals = StopSignals()
    stop = signals.event
    # With ORCH_LOG_FORMAT=json every line is a JSON object: the start and what each sweep did
    # are log lines; otherwise they are printed (once: the sweep itself does not log them).
    json_lines = settings.log_format == "json"
    say = log.info if json_lines else partial(print, flush=True)
    if args.once:
        say(f"sweeping once (lease {settings.lease_seconds:g}s)")
    else:
        say(f"sweeping every {settings.sweep_seconds:g}s (lease {settings.lease_seconds:g}s)")
    # The outbox dispatcher runs beside the sweep loop, in a thread of its own: a slow
    # business backend never delays a requeue.
    outbox = None if args.once or args.no_outbox else OutboxDispatcher(settings, rt.db)
    sender = threading.Thread(target=outbox.run, args=(stop,), daemon=True) if outbox else None
    if sender is not None:
        sender.start()
    # The retention pass (invariant 20), at start and hourly, in a thread of its own too: a
    # long first pass never delays a requeue. The fleet runs sweepers, not always `--beat`.
    if not args.once:
        cleaner = threading.Thread(target=_clean_every, args=(settings, rt.db, stop, say))
        cleaner.daemon = True
        cleaner.start()
    try:
        while True:
            try:
                report = rt.sweeper.sweep()
                if report.deferred:
                    raise SweepDeferred(report)
                SWEEPS.labels("ok").inc()
            except Exception as exc:
                SWEEPS.labels("failed").inc()
                if isinstance(exc, SweepDeferred):
                    # What it could do is done (and said); not a sweep that ran: no heartbeat.
                    for line in exc.report.lines():
                        say(line)
                if args.once:
                    raise  # main() turns it into one line and a non-zero exit
                if isinstance(exc, SweepDeferred) and exc.report.redis_error:
                    # Redis away: the sweeper says it once an outage, not at every sweep.
                    if signals.wait(settings.sweep_seconds):
                        return 0
                    continue
                # The store or the broker briefly unreachable must not end the loop: what this
                # sweep missed is still expired at the next one.
                # A store error says what is wrong and what to do (not migrated: `db upgrade`).
                why = f"{type(exc).__name__}: " + (
                    describe_store_error(exc) if isinstance(exc, SQLAlchemyError) else one_line(exc)
                )
                log.warning("sweep failed (%s); retrying in %gs", why, settings.sweep_seconds)
            else:
                for line in report.lines():
                    say(line)  # printed, or one JSON log line each: never both
                _heartbeat(settings)
            if args.once or signals.wait(settings.sweep_seconds):
                return 0
    finally:
        stop.set()
        if sender is not None and outbox is not None:
            sender.join(timeout=settings.outbox_timeout_seconds + 1)
            outbox.close()
        signals.close()
        rt.close()


#: How soon a cleanup pass that failed is tried again.
CLEANUP_RETRY_SECONDS = 60


def _clean_every(
    settings: Settings, db: Database, stop: threading.Event, say: Callable[[str], None]
) -> None:
    """`orchestrator cleanup` now and every CLEANUP_INTERVAL_SECONDS until `stop`; a pass
    that fails (the store away or not migrated) is one line, and is tried again sooner."""
    from sqlalchemy.exc import SQLAlchemyError

    from orchestrator.cli.store_errors import describe_store_error
    from orchestrator.services.cleanup import run_cleanup
    from workers.constants import CLEANUP_INTERVAL_SECONDS

    while True:
        wait = CLEANUP_INTERVAL_SECONDS
        try:
            say(f"cleanup: {describe_cleanup(run_cleanup(db, settings))}")
        except Exception as exc:
            wait = CLEANUP_RETRY_SECONDS
            why = describe_store_error(exc) if isinstance(exc, SQLAlchemyError) else one_line(exc)
            log.warning("cleanup failed (%s: %s); next pass in %ds", type(exc).__name__, why, wait)
        if stop.wait(wait):
            return


#: Touched after every sweep that ran; the compose health check reads its age.
HEARTBEAT = "sweeper.heartbeat"


class SweepDeferred(CommandFailed):
    """A sweep could not do all its work: the lease back end was unavailable to check expired
    generations, or the broker did not take wake-ups it sent (both Redis, most often down)."""

    def __init__(self, report: SweepReport) -> None:
        said = []
        if report.deferred:
            said.append(
                f"the lease back end is unavailable: {report.deferred} expired generation(s) "
                "were not checked and are left for the next sweep"
            )
        if report.unsent:
            said.append(
                f"the broker did not take {len(report.unsent)} wake-up(s) this sweep sent "
                f"({_named(report.unsent)}): they are recorded, and the next sweep sends them "
                "first once the broker takes messages again"
            )
        super().__init__("; ".join(said))
        self.report = report


def _named(wakeups: list[tuple[str, int]]) -> str:
    """The first few wake-ups as `task T generation G`, and how many more."""
    named = ", ".join(f"task {t} generation {g}" for t, g in wakeups[:3])
    return named + (f" and {len(wakeups) - 3} more" if len(wakeups) > 3 else "")


def _heartbeat(settings: Settings) -> None:
    with contextlib.suppress(OSError):  # a health signal only: never stop the loop for it
        path = settings.home / HEARTBEAT
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()


def _recover(args: argparse.Namespace) -> int:
    from orchestrator.runtime import build_runtime

    rt = build_runtime(load())
    # The CLI says what the sweep could not do below, in its own words; the service's log line
    # would repeat it.
    logging.getLogger("orchestrator.services.sweeper").setLevel(logging.ERROR)
    try:
        report = _sweep_once(rt.sweeper, grace=not args.no_grace)
        waiting = _handed_back_waiting(rt.db) if not args.json else 0
    finally:
        rt.close()
    _print_recovery(args, report)
    if waiting:
        # Not "nothing to recover" alone: these run nothing and this sweep leaves them.
        print(
            f"{waiting} generation(s) handed back by their workers wait to be requeued (a "
            "model server's Retry-After or back-off: tasks list says until when; tasks "
            "requeue runs one now)"
        )
    if report.deferred or report.unsent:
        raise SweepDeferred(report)  # what it did is printed; what it could not do, one line
    return 0


def _sweep_once(sweeper: Sweeper, *, grace: bool) -> SweepReport:
    """One sweep, with the sweeper's rule after a store outage unless not `grace`.

    Run within seconds of the store's return from an outage longer than a lease, a sweep finds
    the leases of the rounds the outage stopped expired, and their workers' hand-backs (tried
    every second) not landed yet: it would take them for workers that died (`recoveries`,
    which park a task at ORCH_MAX_RECOVERIES). This process cannot know whether the store was
    away, so expired leases get the sweeper's grace first; a second sweep then takes them.
    """
    if not grace:
        return sweeper.sweep()
    seconds = sweeper.start_grace()
    report = sweeper.sweep()
    if not report.left:
        return report
    if report.redis_error is not None:
        # Redis away: those leases cannot be checked, with or without a wait.
        report.deferred += report.left
        return report
    print(
        f"orchestrator recover: {report.left} expired lease(s) left {seconds:g}s to their "
        "workers' hand-backs (a round a store outage stopped is handed back once the store "
        "answers; --no-grace takes them now)",
        file=sys.stderr,
        flush=True,
    )
    time.sleep(sweeper.grace_left())
    return sweeper.sweep().after(report)


def _handed_back_waiting(db: Database) -> int:
    from sqlalchemy.exc import SQLAlchemyError

    from orchestrator.store.executions import count_handed_back

    try:
        with db.transaction(readonly=True) as conn:
            return count_handed_back(conn)
    except SQLAlchemyError:  # the sweep's own line says what the store did
        return 0


def _print_recovery(args: argparse.Namespace, report: SweepReport) -> None:
    if args.json:
        print_json(
            {
                "requeued": [
                    {"task_id": t, "lost_generation": g, "generation": n}
                    for t, g, n in report.requeued
                ],
                "parked": [{"task_id": t, "generation": g} for t, g in report.parked],
                "republished": [{"task_id": t, "generation": g} for t, g in report.republished],
                "deferred": report.deferred,
                "unsent": [{"task_id": t, "generation": g} for t, g in report.unsent],
            }
        )
    elif report.lines() or not (report.deferred or report.unsent):
        print("\n".join(report.lines()) or "nothing to recover")
