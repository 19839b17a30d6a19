"""The statements an execution sends, recorded at the driver and sent again by raw psycopg.

bench/executions.py's floor ("round trips alone") sends as many round trips as an execution,
but each is a one-row INSERT or a read of one row: it leaves out what Postgres spends on the
execution's own statements (the fenced CTEs, the JSON documents, the indexes they update).
This replays the execution's real statements, text and parameters as psycopg was given them,
in the same transactions, on a copy of the database taken before the executions ran: the
cost any code that keeps this design's statements cannot go below.

    record(rt, task_ids)  -> one trace per task, each run in process with `rt`
    Replayer(dsn).run(trace)  -> sends a trace again (in the raw Celery worker)
"""

from __future__ import annotations

import pickle
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = [
    "WRITTEN_TABLES",
    "Replayer",
    "check_replayed",
    "load",
    "record",
    "record_on_copy",
    "save",
]

#: The tables an execution writes rows to, whose rows a replay must leave as the execution did.
WRITTEN_TABLES = (
    "tasks",
    "executions",
    "transcript_entries",
    "plan_revisions",
    "reports",
    "evidence",
    "task_events",
    "outbox",
)

#: One step of a trace: ("execute", autocommit, raw cursor, binary, sql, params),
#: ("commit",) or ("rollback",) of the connection that is not in autocommit.
Step = tuple[Any, ...]


def record(rt: Any, task_ids: Iterable[str], worker: str = "bench:replay") -> list[list[Step]]:
    """Run generation 1 of each task in process with `rt`, recording what psycopg is asked to
    send (from every thread: the process must be doing nothing else meanwhile)."""
    import psycopg

    steps: list[Step] = []
    lock = threading.Lock()
    execute, commit, rollback = (
        psycopg.Cursor.execute,
        psycopg.Connection.commit,
        (psycopg.Connection.rollback),
    )

    def recording_execute(cursor: Any, query: Any, params: Any = None, **options: Any) -> Any:
        raw = isinstance(cursor, psycopg.RawCursor)
        binary = options.get("binary") or cursor.format == psycopg.pq.Format.BINARY
        with lock:
            autocommit = cursor.connection.autocommit
            steps.append(("execute", autocommit, raw, bool(binary), query, params))
        return execute(cursor, query, params, **options)

    def recording_commit(connection: Any) -> None:
        with lock:
            steps.append(("commit",))
        commit(connection)

    def recording_rollback(connection: Any) -> None:
        with lock:
            steps.append(("rollback",))
        rollback(connection)

    traces: list[list[Step]] = []
    psycopg.Cursor.execute = recording_execute  # type: ignore[method-assign,assignment]
    psycopg.Connection.commit = recording_commit  # type: ignore[method-assign]
    psycopg.Connection.rollback = recording_rollback  # type: ignore[method-assign]
    try:
        for task_id in task_ids:
            result = rt.executions.run(task_id, 1, worker=worker, first_delivery=True)
            if result.outcome != "completed":
                raise RuntimeError(f"a recorded round ended {result.outcome}: {result.detail}")
            with lock:
                traces.append(list(steps))
                steps.clear()
    finally:
        psycopg.Cursor.execute = execute  # type: ignore[method-assign]
        psycopg.Connection.commit = commit  # type: ignore[method-assign]
        psycopg.Connection.rollback = rollback  # type: ignore[method-assign]
    return traces


def save(traces: list[list[Step]], path: Path) -> None:
    path.write_bytes(pickle.dumps(traces))


_loaded: dict[str, list[list[Step]]] = {}
_loading = threading.Lock()


def load(path: str) -> list[list[Step]]:
    """The traces in `path`, read once per process."""
    with _loading:
        if path not in _loaded:
            _loaded[path] = pickle.loads(Path(path).read_bytes())  # the benchmark's own file
        return _loaded[path]


class Replayer:
    """Two connections, as a worker thread of the orchestrator holds: one in autocommit (the
    store's kept connections) and one that runs transactions (the store's pool)."""

    def __init__(self, dsn: str) -> None:
        import psycopg

        self.autocommit = psycopg.connect(dsn, autocommit=True)
        self.transactions = psycopg.connect(dsn)
        self.transactions.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
        self._cursors: dict[tuple[bool, bool, bool], Any] = {}

    def _cursor(self, autocommit: bool, raw: bool, binary: bool) -> Any:
        import psycopg

        key = (autocommit, raw, binary)
        cursor = self._cursors.get(key)
        if cursor is None:
            connection = self.autocommit if autocommit else self.transactions
            cursor = psycopg.RawCursor(connection) if raw else psycopg.Cursor(connection)
            if binary:
                cursor.format = psycopg.pq.Format.BINARY
            self._cursors[key] = cursor
        return cursor

    def close(self) -> None:
        self.autocommit.close()
        self.transactions.close()

    def run(self, trace: list[Step]) -> None:
        for step in trace:
            if step[0] == "commit":
                self.transactions.commit()
            elif step[0] == "rollback":
                self.transactions.rollback()
            else:
                _, autocommit, raw, binary, query, params = step
                cursor = self._cursor(autocommit, raw, binary)
                cursor.execute(query, params)
                if cursor.description is not None:
                    cursor.fetchall()


def record_on_copy(
    settings: Any, pg_server: Any, template: str, task_type: str, count: int, folder: Path
) -> tuple[str, str, str]:
    """`count` executions of `task_type` run in process with `settings` on a database of
    their own, each one's statements recorded; and a copy of that database taken before they
    ran, for the raw worker to send them again. Returns the traces' file, the
    recorded database's DSN and the copy's."""
    from orchestrator.runtime import build_runtime
    from orchestrator.services.dispatch import RecordingDispatcher
    from orchestrator.services.tasks import Trigger

    source = pg_server.create_database(template=template)
    settings = settings.model_copy(update={"database_url": pg_server.url(source)})
    rt = build_runtime(settings, dispatcher=RecordingDispatcher())
    try:
        task_ids = [
            rt.tasks.trigger(Trigger(task_type=task_type, title=f"replay {n}")).task.task_id
            for n in range(count)
        ]
    finally:
        rt.close()
    copy = pg_server.create_database(template=source)
    rt = build_runtime(settings, dispatcher=RecordingDispatcher())
    try:
        traces = record(rt, task_ids)
    finally:
        rt.close()
    path = folder / "statements.pickle"
    save(traces, path)
    recorded, replayed = (pg_server.url(db).replace("+psycopg", "") for db in (source, copy))
    return str(path), recorded, replayed


def check_replayed(recorded: str, replayed: str) -> None:
    """The replayed statements did what the executions did: the copy ends with the rows
    the recorded database has (every task completed, the same transcripts, events and
    deliveries), or the floor would be of some other work."""
    import psycopg

    query = "SELECT (SELECT count(*) FROM tasks WHERE status = 'completed'), " + ", ".join(
        f"(SELECT count(*) FROM {table})" for table in WRITTEN_TABLES
    )
    counts = []
    for dsn in (recorded, replayed):
        with psycopg.connect(dsn) as connection:
            counts.append(connection.execute(query).fetchone())
    if counts[0] != counts[1] or counts[0][0] != counts[0][1]:
        raise RuntimeError(f"the replay left other rows than the executions: {counts}")
