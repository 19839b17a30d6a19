"""Real Postgres and Redis servers for the tests, started from the local binaries.

Each server lives in a temporary folder on a free loopback port and is stopped at the end of
the session. Postgres refuses to run as root, so under root it runs as the `postgres` user.

A port `free_port()` found free may be taken by another process before the server binds it (a
busy machine runs other test sessions): a first start whose server says the address is in use
is tried again on a new port (`PORT_ATTEMPTS` in all). A restart keeps its port, which its
clients hold. Neither Postgres nor Redis can choose a free port itself and say which.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import httpx
import psycopg

__all__ = [
    "PORT_ATTEMPTS",
    "PortTaken",
    "PostgresServer",
    "RedisServer",
    "ServiceMissing",
    "bound_socket",
    "free_port",
    "on_a_free_port",
    "refused_port",
    "says_port_taken",
    "serving_metrics",
    "wait_until_answering",
]

PG_INSTALL_HINT = "install it with `apt-get install postgresql` (Debian) to run these tests"
REDIS_INSTALL_HINT = "install it with `apt-get install redis-server` (Debian) to run these tests"

T = TypeVar("T")


#: Starts of a server on a new free port when another process took the last one first.
PORT_ATTEMPTS = 5
#: What Postgres and Redis log when their port is taken (the text of EADDRINUSE).
IN_USE = "Address already in use"


class ServiceMissing(Exception):
    """A server binary the tests need is not installed."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


#: The sockets `refused_port` holds for the session (closed at exit).
_HELD: list[socket.socket] = []


def refused_port() -> int:
    """A loopback port where a connection is refused (a store or a Redis that is down), held
    for the rest of the session: bound and never listening, so that no other process can start
    a server there, as it could on a port `free_port()` found free, and answer instead."""
    if not _HELD:
        atexit.register(lambda: [sock.close() for sock in _HELD])
    sock = bound_socket()
    _HELD.append(sock)
    return int(sock.getsockname()[1])


def bound_socket() -> socket.socket:
    """A loopback TCP socket bound to a port the kernel chose, for a server in this process
    (uvicorn's `Server.run(sockets=[...])` listens on it): no other process can take the port
    first, as one can between `free_port()` and the server's own bind. Closed by the caller."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    return sock


def _pg_bin(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)
    if candidates:
        return candidates[0]
    raise ServiceMissing(f"Postgres binary `{name}` not found; {PG_INSTALL_HINT}")


def _as_root() -> bool:
    return os.geteuid() == 0


def _logged_since(log: Path, offset: int) -> str:
    """What a server wrote to its `log` after `offset` bytes."""
    try:
        with log.open("rb") as file:
            file.seek(offset)
            return file.read().decode(errors="replace")
    except FileNotFoundError:
        return ""


def _size(log: Path) -> int:
    try:
        return log.stat().st_size
    except FileNotFoundError:
        return 0


@dataclass
class PostgresServer:
    """A throwaway Postgres cluster: `initdb`, `pg_ctl start`, trust auth on loopback.

    Commits are not flushed to disk (fsync off) unless `durable`, as a production server is.
    """

    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="orch-pg-")))
    port: int = field(default_factory=free_port)
    durable: bool = False
    version: str = ""
    _counter: int = 0

    @property
    def data(self) -> Path:
        return self.root / "data"

    def _run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        command = list(argv)
        if _as_root():
            command = ["runuser", "-u", "postgres", "--", *command]
        return subprocess.run(command, check=True, capture_output=True, text=True, timeout=120)

    def start(self) -> None:
        initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
        if _as_root():
            shutil.chown(self.root, "postgres", "postgres")
        self._run(initdb, "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8")
        log = self.root / "log"
        for attempt in range(1, PORT_ATTEMPTS + 1):
            before = _size(log)
            try:
                self._run(
                    pg_ctl, "-D", str(self.data), "-o", self._options(), "-l", str(log),
                    "-w", "start",
                )  # fmt: skip
                break
            except subprocess.CalledProcessError:
                if attempt == PORT_ATTEMPTS or IN_USE not in _logged_since(log, before):
                    raise
                self.port = free_port()  # another process took it first
        with self.connect() as conn:
            row = conn.execute("SHOW server_version").fetchone()
            self.version = str(row[0]) if row else "?"

    def _options(self) -> str:
        durability = (
            ""
            if self.durable
            else ("-c fsync=off -c synchronous_commit=off -c full_page_writes=off ")
        )
        return (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 {durability}"
            "-c max_connections=300 -c shared_buffers=64MB"
        )

    def stop_for(self, seconds: float) -> None:
        """Stop the server (fast shutdown: its sessions are terminated), stay down for
        `seconds`, and start it again on the same port with the same data."""
        self.pause()
        time.sleep(seconds)
        self.resume()

    def pause(self) -> None:
        """Stop the server (fast shutdown: its sessions are terminated) until `resume`."""
        self._run(_pg_bin("pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")

    def resume(self) -> None:
        """Start the server `pause` stopped, on the same port with the same data."""
        self._run(
            _pg_bin("pg_ctl"), "-D", str(self.data), "-o", self._options(),
            "-l", str(self.root / "log"), "-w", "start",
        )  # fmt: skip

    def restart(self) -> None:
        """Stop the server (its sessions are terminated, as in a fast shutdown) and start it
        again on the same port with the same data."""
        self._run(
            _pg_bin("pg_ctl"), "-D", str(self.data), "-l", str(self.root / "log"),
            "-m", "fast", "-w", "restart",
        )  # fmt: skip

    def stop(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError, ServiceMissing):
            self._run(_pg_bin("pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop")
        shutil.rmtree(self.root, ignore_errors=True)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def connect(self, database: str = "postgres") -> psycopg.Connection[tuple[object, ...]]:
        return psycopg.connect(
            host="127.0.0.1", port=self.port, user="postgres", dbname=database, autocommit=True
        )

    def create_database(self, template: str | None = None) -> str:
        """A new empty database (or a copy of `template`); returns its name."""
        name = self._new_name()
        # FILE_COPY: a copy of the template's files, about half the time of Postgres 15's
        # default (WAL_LOG, every block through the WAL) for a small schema without fsync.
        clause = f" TEMPLATE {template} STRATEGY FILE_COPY" if template else ""
        with self.connect() as conn:
            conn.execute(f"CREATE DATABASE {name}{clause}")  # type: ignore[arg-type]
        return name

    def drop_database(self, name: str) -> None:
        with self.connect() as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")  # type: ignore[arg-type]

    def rename_database(self, name: str) -> str:
        """Give database `name` a new name (no session may be connected to it); returns it."""
        new = self._new_name()
        with self.connect() as conn:
            conn.execute(f"ALTER DATABASE {name} RENAME TO {new}")  # type: ignore[arg-type]
        return new

    def _new_name(self) -> str:
        """A database name no other of this cluster's test processes uses."""
        self._counter += 1
        return f"t{os.getpid()}_{self._counter}"


@dataclass
class RedisServer:
    """A throwaway redis-server without persistence: a restart loses every key."""

    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="orch-redis-")))
    port: int = field(default_factory=free_port)
    version: str = ""
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, *, keep_port: bool = False) -> None:
        """Start the server; the first time, on a new port if another process took this one
        first, unless `keep_port` (its URL was already given out). Started again (after `stop`),
        it keeps its port, which its clients hold."""
        if keep_port or self.version:
            self._again()
            return
        for attempt in range(1, PORT_ATTEMPTS + 1):
            before = _size(self.log)
            if self._launch():
                return
            logged = _logged_since(self.log, before)
            if attempt == PORT_ATTEMPTS or IN_USE not in logged:
                raise RuntimeError(f"redis-server did not start on port {self.port}: {logged}")
            self.port = free_port()

    @property
    def log(self) -> Path:
        return self.root / "log"

    def _launch(self) -> bool:
        """Run the server on `self.port`: True once it answers, False if it exited first."""
        binary = shutil.which("redis-server")
        if binary is None:
            raise ServiceMissing(f"`redis-server` not found; {REDIS_INSTALL_HINT}")
        self.process = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.root),
                "--daemonize",
                "no",
                "--logfile",
                str(self.log),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        return self._wait_ready(self.process)

    def _wait_ready(self, process: subprocess.Popen[bytes]) -> bool:
        """True once `process` answers on the port; False if it exited. Another server that
        answers there (it took the port first) is not taken for it: its pid differs."""
        import redis

        deadline = time.monotonic() + 15
        while process.poll() is None:
            client = redis.Redis.from_url(self.url, socket_timeout=1, socket_connect_timeout=1)
            try:
                info = client.info("server")
                if info.get("process_id") == process.pid:
                    self.version = str(info.get("redis_version", "?"))
                    return True
            except (redis.ConnectionError, redis.TimeoutError):
                pass  # not answering yet; or a program that took the port and says nothing
            finally:
                client.close()
            if time.monotonic() > deadline:
                raise TimeoutError(f"redis-server did not answer on port {self.port} in 15 s")
            time.sleep(0.05)
        process.wait()
        self.process = None
        return False

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=10)
            self.process = None

    def pause(self) -> None:
        """Stop the server with its data saved to disk, until `resume` starts it again on the
        same port with that data (a restart that keeps it)."""
        import redis

        client = redis.Redis.from_url(self.url)
        client.shutdown(save=True)  # the server exits once its data is on disk
        client.close()
        if self.process is not None:
            self.process.wait(timeout=10)
            self.process = None

    def resume(self) -> None:
        """Start the server `pause` stopped, with the data it saved, on its port."""
        self._again()

    def restart(self) -> None:
        """Kill the server and start it again on the same port, empty (its data is lost)."""
        self.stop()
        (self.root / "dump.rdb").unlink(missing_ok=True)  # what a `pause` saved
        self._again()

    def _again(self) -> None:
        """Start the server again on its port, which its clients hold."""
        before = _size(self.log)
        if not self._launch():
            raise RuntimeError(
                f"redis-server did not start again on port {self.port}: "
                f"{_logged_since(self.log, before)}"
            )

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


class PortTaken(AssertionError):
    """A server process exited at its start because another process had taken its port."""


def wait_until_answering(
    url: str, process: subprocess.Popen[bytes], log: Path, seconds: float = 30
) -> None:
    """Until the API at `url`, served by `process`, answers `GET /healthz` with 200; an
    AssertionError with the process's `log` when it exits first or `seconds` pass (`PortTaken`
    when it exited saying its port is in use)."""
    deadline = time.monotonic() + seconds
    while True:
        with contextlib.suppress(httpx.TransportError):
            # Alive too: a server that took the port first answers while this one exits.
            answer = httpx.get(f"{url}/healthz", timeout=1)
            if answer.status_code == 200 and process.poll() is None:
                return
        if process.poll() is not None or time.monotonic() > deadline:
            text = log.read_text(errors="replace")
            port = httpx.URL(url).port
            if process.poll() is not None and port is not None and says_port_taken(text, port):
                raise PortTaken(f"api did not start: {text}")
            raise AssertionError(f"api did not start: {text}")
        time.sleep(0.05)


def says_port_taken(output: str, port: int) -> bool:
    """Whether the last lines of a server's `output` say that `port` is in use: `orchestrator
    api`'s and `orchestrator worker`'s own line, or uvicorn's (a port taken after their check)."""
    return any("in use" in line.lower() and str(port) in line for line in output.splitlines()[-5:])


def serving_metrics(
    argv: list[str], env: dict[str, str], log: Path, cwd: Path, seconds: float = 40
) -> tuple[subprocess.Popen[bytes], int]:
    """`argv` (`orchestrator worker` or `sweeper`) serving /metrics on a free port (set as
    ORCH_METRICS_PORT in `env`; a new one if another process took it first: it exits with one
    line), its output appended to `log`, once that port answers: the process (in a session of
    its own, so `os.killpg` reaches its pool processes) and the port."""

    def start(port: int) -> tuple[subprocess.Popen[bytes], int]:
        env["ORCH_METRICS_PORT"] = str(port)
        with log.open("ab") as out:
            process = subprocess.Popen(
                argv, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + seconds
        while process.poll() is None and time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2):
                    pass
            except urllib.error.HTTPError:
                pass  # it answers (a 503 is an answer)
            except OSError:
                time.sleep(0.05)
                continue
            if process.poll() is None:  # not another server that took the port first
                return process, port
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
            raise AssertionError(f"/metrics did not answer: {log.read_text(errors='replace')}")
        output = log.read_text(errors="replace")
        if says_port_taken(output, port):
            raise PortTaken(output)
        raise AssertionError(f"it exited before /metrics answered: {output[-3000:]}")

    return on_a_free_port(start)


def on_a_free_port(start: Callable[[int], T]) -> T:
    """`start(port)` on a free port; again on a new one, up to `PORT_ATTEMPTS` starts in all,
    while it raises `PortTaken` (another process took the port between `free_port()` and
    the server's bind)."""
    for attempt in range(1, PORT_ATTEMPTS + 1):
        try:
            return start(free_port())
        except PortTaken:
            if attempt == PORT_ATTEMPTS:
                raise
    raise AssertionError("unreachable")


def service_unavailable(message: str) -> None:
    """A missing server or browser: skips locally, fails the run when `CI` is set."""
    import pytest

    if os.environ.get("CI"):
        pytest.fail(f"{message} (CI is set, so a missing service fails the run)", pytrace=False)
    pytest.skip(message)
