"""`orchestrator api [--host] [--port]`: serve the HTTP API with uvicorn; a SIGTERM stops it
gracefully with exit code 0. An address it cannot listen on is one line and exit code 2, found
before the app starts."""

from __future__ import annotations

import argparse
import copy
import errno
import ipaddress
import signal
import socket
from types import FrameType
from typing import TYPE_CHECKING, Any

from orchestrator.cli.common import CommandFailed, bounded_int, load

if TYPE_CHECKING:
    from orchestrator.settings import Settings

__all__ = ["LOG_LEVELS", "check_listen", "is_loopback", "register"]

#: uvicorn's level names.
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


def register(commands: Any) -> None:
    api = commands.add_parser("api", help="serve the HTTP API (uvicorn)")
    api.add_argument("--host", default="127.0.0.1", help="address to listen on (default loopback)")
    api.add_argument(
        "--port", type=bounded_int(1, 65535), default=8000, help="TCP port (default 8000)"
    )
    api.add_argument(
        "--log-level",
        default="info",
        type=str.lower,
        choices=LOG_LEVELS,
        help="uvicorn log level (default info)",
    )
    api.set_defaults(handler=_serve)


def is_loopback(host: str) -> bool:
    """True for `localhost` and loopback addresses only (not 0.0.0.0, not a LAN address)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_listen(host: str, port: int) -> None:
    """Raise `CommandFailed` (exit 2) unless `host:port` can be listened on now.

    uvicorn binds only after the app's startup ran (the Redis listener of the streams among it),
    then logs the error and shuts the app down, and a shutdown that races that listener's first
    connection could wait for ever, deaf to SIGTERM. So a typo in --host, an address of another
    machine or a port already in use is found here, before anything starts, and said in one
    line. Every address the host resolves to is tried, as uvicorn listens on each of them.
    """
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if not host.strip():
        raise CommandFailed("--host is empty; give an address, e.g. 127.0.0.1", exit_code=2)
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        reason = exc.strerror if isinstance(exc, socket.gaierror) else "not a host name"
        raise CommandFailed(f"cannot listen on --host {host}: {reason}", exit_code=2) from None
    for family, kind, proto, _name, address in addresses:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as exc:
                reason = "the port is in use" if exc.errno == errno.EADDRINUSE else exc.strerror
                raise CommandFailed(f"cannot listen on {where}: {reason}", exit_code=2) from None


def _log_config(settings: Settings, level: str) -> dict[str, Any] | None:
    """uvicorn's logging in ORCH_LOG_FORMAT, secrets masked (a `?token=` in an access line)."""
    from orchestrator.logs import TEXT_FORMAT, RedactFilter, configure_logging, secrets_of

    if settings.log_format == "json":
        configure_logging(settings, "DEBUG" if level == "trace" else level.upper())
        return None  # uvicorn's loggers propagate to the root handler just set
    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    config["filters"] = {"redact": {"()": RedactFilter, "secrets": secrets_of(settings)}}
    # The orchestrator's own lines (a store that is down, a wake-up not sent) as the worker and
    # the sweeper write them, masked; without a root handler they went out bare and unmasked
    # through logging's last resort, and below WARNING not at all.
    config["formatters"]["orchestrator"] = {"format": TEXT_FORMAT}
    config["handlers"]["orchestrator"] = {
        "class": "logging.StreamHandler",
        "formatter": "orchestrator",
        "stream": "ext://sys.stderr",
    }
    config["root"] = {
        "handlers": ["orchestrator"],
        "level": "DEBUG" if level == "trace" else level.upper(),
    }
    for handler in config["handlers"].values():
        handler["filters"] = ["redact"]
    return config


def _stop_requested(_signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(0)


def _serve(args: argparse.Namespace) -> int:
    settings = load()
    check_listen(args.host, args.port)  # an empty or unusable address is said first
    if not settings.api_token and not settings.operators and not is_loopback(args.host):
        raise CommandFailed(
            f"refusing to listen on {args.host} without ORCH_API_TOKEN or ORCH_OPERATORS; "
            "set a token or listen on 127.0.0.1",
            exit_code=2,
        )
    import uvicorn

    from orchestrator.api import create_app
    from orchestrator.api.wire_errors import EnvelopeH11

    app = create_app(settings)
    # uvicorn catches SIGTERM, shuts down gracefully, restores the handler it found and raises
    # the signal again (its "cooperative" signal handling, 0.29+): with the default handler the
    # process then dies by the signal, exit 143, which a supervisor takes for a failure. This
    # handler is the one it finds: a SIGTERM is a request to stop, and a stop that was asked for
    # exits 0. (One before uvicorn took over stops at once, as nothing runs yet.)
    signal.signal(signal.SIGTERM, _stop_requested)
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        log_config=_log_config(settings, args.log_level),
        # Streams never end by themselves; do not let them hold a shutdown for ever.
        timeout_graceful_shutdown=3,
        # A request uvicorn refuses itself (not HTTP, headers too large) gets the envelope.
        http=EnvelopeH11,
    )
    return 0
