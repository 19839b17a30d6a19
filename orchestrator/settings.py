"""Settings from the environment (and an optional `.env`), validated once at start-up."""

from __future__ import annotations

import difflib
import ipaddress
import os
import re
import sys
from collections.abc import Mapping
from contextlib import suppress
from functools import lru_cache
from pathlib import Path
from typing import Final, Literal
from urllib.parse import urlsplit

from dotenv import dotenv_values
from pydantic import (
    AliasChoices,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

__all__ = [
    "Settings",
    "SettingsError",
    "connect_retry_pauses",
    "get_settings",
    "load_settings",
    "setting_names",
    "unknown_variables",
]

DEFAULT_HOME = ".orchestrator"


def _env(name: str) -> AliasChoices:
    """The environment name exactly as the seeds fix it (no ORCH_ prefix)."""
    return AliasChoices(name)


#: The SQLAlchemy driver names the store runs on (plain postgresql means psycopg 3 here).
_DATABASE_DRIVERS: Final = ("postgresql+psycopg", "postgresql", "sqlite")


def _check_redis(value: str) -> None:
    """Parse a Redis URL as the clients will, so a bad one stops start-up, not a later call.

    Messages never repeat the URL (it may carry a password), only the part that is wrong.
    """
    parts = urlsplit(value)
    if parts.scheme == "unix":
        if not parts.path:
            raise ValueError("a unix:// URL needs the socket path: unix:///path/to/redis.sock")
        return
    if parts.scheme not in ("redis", "rediss"):
        raise ValueError("must start with redis://, rediss:// or unix://")
    if not parts.hostname:
        raise ValueError(f"no host; use {parts.scheme}://HOST:PORT/DB")
    try:
        port = parts.port
    except ValueError:
        raw = parts.netloc.rpartition("@")[2].rpartition(":")[2]
        raise ValueError(f"port {raw!r} is not a number in 1-65535") from None
    if port is not None and not 1 <= port <= 65535:
        raise ValueError(f"port {port} is out of range 1-65535")
    db = parts.path.strip("/")
    if db and not db.isdigit():
        raise ValueError(f"the database after the host must be a number, not {db!r}")
    from redis import ConnectionPool  # imported only when Redis is configured

    try:
        ConnectionPool.from_url(value)  # parses the query options too; connects to nothing
    except (ValueError, TypeError) as exc:
        raise ValueError(str(exc).splitlines()[0]) from None


#: Characters no host name holds (WHATWG's forbidden host code points, and `%`: httpx would
#: send a host with a space as `back%20end`, which no resolver finds).
_FORBIDDEN_HOST_CHARS: Final = frozenset('#%/:<>?@[\\]^|"`{}')


def _check_host(host: str) -> None:
    """A host a client can reach: an IP address, or a name of non-empty labels with no space,
    control or forbidden character. Messages name the problem, never the URL."""
    with suppress(ValueError):
        ipaddress.ip_address(host)
        return
    for char in host:
        if char == " ":
            raise ValueError("the host has a space; a host name has none")
        if char.isspace() or ord(char) < 32 or ord(char) == 127:
            raise ValueError("the host has a control character")
        if char in _FORBIDDEN_HOST_CHARS:
            raise ValueError(f"the host has {char!r}, which no host name holds")
    try:
        host.encode("idna")
    except UnicodeError:
        raise ValueError("the host has an empty or too long label (a name like a..b)") from None


def _header_problem(value: str) -> str | None:
    """What keeps `value` out of an HTTP header value (visible ASCII, inner spaces), or None."""
    for position, char in enumerate(value, 1):
        if char in "\r\n":
            what = "a line break"
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            what = "a control character"
        elif ord(char) > 0x7E:
            what = "a non-ASCII character"
        else:
            continue
        return f"{what} at character {position} of {len(value)}"
    if value.startswith(" "):
        return "a space at its start"
    if value.endswith(" "):
        return "a space at its end"
    return None


def connect_retry_pauses(retries: int) -> float:
    """Seconds the gateway's HTTP transport sleeps in all over `retries` connect retries:
    httpcore pauses 0 s before the first, then 0.5 s, doubling (its RETRIES_BACKOFF_FACTOR)."""
    return sum((0.5 * 2.0 ** (n - 1) for n in range(1, retries)), 0.0)


class SettingsError(Exception):
    """A setting has a value the orchestrator cannot run with; the message is one line."""


class Settings(BaseSettings):
    """Every knob of the orchestrator. Unset Redis and database mean the embedded default."""

    model_config = SettingsConfigDict(
        env_prefix="ORCH_",
        env_file=".env",
        extra="ignore",
        populate_by_name=True,
        # A float setting is a duration or a timeout: inf or nan would pass `gt=0` and then
        # never fire, or break every comparison.
        allow_inf_nan=False,
    )

    home: Path = Field(default=Path(DEFAULT_HOME), description="Folder for embedded state.")
    database_url: str | None = Field(default=None, description="SQLAlchemy URL of the store.")
    redis_url: str | None = Field(default=None, description="Redis URL; unset = embedded mode.")
    lease_seconds: float = Field(default=120.0, gt=0)
    lease_renew_seconds: float = Field(default=40.0, gt=0)
    sweep_seconds: float = Field(default=15.0, gt=0)
    queued_stale_seconds: float = Field(default=60.0, gt=0)
    max_recoveries: int = Field(default=3, ge=1)
    # Generations in a row handed back after an outage (services/handback.py): more than
    # crashes, since a restart of Redis or Postgres is not the task's doing, but bounded, since
    # a round that meets the same failure every time must stop some day.
    max_handbacks: int = Field(default=10, ge=1)
    max_rounds: int = Field(default=5, ge=1)
    max_turns: int = Field(default=30, ge=1)
    api_token: str | None = Field(default=None, repr=False)
    # No default: a worker refuses to start without one (`check_model_setting`).
    model: str | None = Field(default=None, description="openai:MODEL or scripted:DIR")
    retention_days: int = Field(default=30, ge=0)
    db_pool_size: int = Field(default=5, ge=1)
    db_max_overflow: int = Field(default=5, ge=0)
    gateway_spec: Path | None = None
    gateway_base_url: str | None = None
    gateway_timeout_seconds: float = Field(default=10.0, gt=0)
    # Retries only when the request provably never left (connection refused); a retry after
    # the request may have been sent is never automatic (seed 000).
    gateway_connect_retries: int = Field(default=0, ge=0, le=5)
    enable_command_tool: bool = False
    # Every tool call ends: one that has not returned after this long is given up (a read
    # `failed`, a write `unknown`) and the round goes on (orchestrator/agent/deadline.py).
    tool_timeout_seconds: float = Field(default=300.0, ge=1, le=3600)
    # Operator accounts (issue 14): a file of `NAME ROLE SHA256-HEX-OF-TOKEN` lines; roles
    # viewer, operator, approver. ORCH_API_TOKEN stays one full-rights account beside them.
    operators: Path | None = None
    # Mixed into the key of every console session cookie: without it, a reader of the
    # operators file (token hashes) could sign cookies; changing it signs every browser out.
    console_secret: str | None = Field(default=None, repr=False, min_length=16)
    # The outbox and its dispatcher (DESIGN section 8): where approved actions and signed task
    # events go, how long one send may take, the backoff between attempts, and after how many
    # failed attempts a webhook is dead-lettered, a throttled one (429) not counted (an action
    # delivery is retried until a 2xx; a permanent 4xx dead-letters either at once:
    # orchestrator/services/delivery_answers.py).
    actions_url: str | None = None
    actions_secret: str | None = Field(default=None, repr=False)
    webhook_url: str | None = None
    webhook_secret: str | None = Field(default=None, repr=False)
    outbox_timeout_seconds: float = Field(default=10.0, gt=0, le=300)
    outbox_backoff_seconds: float = Field(default=1.0, gt=0)
    outbox_backoff_max_seconds: float = Field(default=300.0, gt=0, le=7 * 86400)
    outbox_poll_seconds: float = Field(default=1.0, gt=0)
    webhook_max_attempts: int = Field(default=8, ge=1)
    task_stream_poll_seconds: float = Field(default=1.0, gt=0)
    # How often an idle event stream sends its `keepalive` event: the console takes a stream
    # silent for 2.5 of them as not live (the API hung, a proxy holding it) and reconnects.
    stream_keepalive_seconds: float = Field(default=10.0, ge=0.1, le=300)
    # Operations (issue 16): log lines as JSON or text; a /metrics port for workers and the
    # sweeper (0 = none); the API's request body limit, refused with 413 before it is read.
    log_format: Literal["text", "json"] = "text"
    metrics_port: int = Field(default=0, ge=0, le=65535)
    max_body_bytes: int = Field(default=1024 * 1024, ge=1024)

    agent_internal_token: str | None = Field(
        default=None, validation_alias=_env("AGENT_INTERNAL_TOKEN")
    )
    data_cleanup_enable: bool = Field(default=True, validation_alias=_env("DATA_CLEANUP_ENABLE"))
    llm_max_tools: int = Field(default=0, ge=0, validation_alias=_env("LLM_MAX_TOOLS"))
    # Evidence (issue 13): the data-source declarations (YAML or JSON); unset = the bundled
    # simulated SCADA source (origin synthetic).
    data_sources: Path | None = None

    # The OpenAI-compatible model client (`ORCH_MODEL=openai:<model>`, issue 12).
    llm_base_url: str | None = Field(default=None, validation_alias=_env("LLM_BASE_URL"))
    llm_api_key: SecretStr | None = Field(default=None, validation_alias=_env("LLM_API_KEY"))
    llm_context_window: int = Field(
        default=32768, ge=1024, validation_alias=_env("LLM_CONTEXT_WINDOW")
    )
    llm_max_output_tokens: int = Field(
        default=4096, ge=1, validation_alias=_env("LLM_MAX_OUTPUT_TOKENS")
    )
    # One model call's whole time, from the send to the answer's last byte (not per read as
    # httpx counts it: `agent.model_http`).
    llm_timeout_seconds: float = Field(
        default=120.0, gt=0, validation_alias=_env("LLM_TIMEOUT_SECONDS")
    )
    llm_temperature: float | None = Field(
        default=None, ge=0, le=2, validation_alias=_env("LLM_TEMPERATURE")
    )
    llm_max_retries: int = Field(default=4, ge=0, le=20, validation_alias=_env("LLM_MAX_RETRIES"))
    # The console (issue 16): origins, comma-separated, of external front ends that may call the
    # API and open its streams from a browser (CORS, credentials allowed); empty = same origin only.
    cors_origins: str = Field(default="", description="comma-separated browser origins")

    @field_validator("database_url")
    @classmethod
    def _check_database_url(cls, value: str | None) -> str | None:
        # Messages never repeat the value: a URL may carry a password.
        if value is None or value == "":
            return None
        try:
            url = make_url(value)
            port = url.port
        except (ArgumentError, ValueError):
            raise ValueError(
                "not a database URL; use postgresql+psycopg://USER:PASSWORD@HOST:PORT/NAME "
                "or sqlite:///PATH"
            ) from None
        if url.drivername not in _DATABASE_DRIVERS:
            raise ValueError(
                f"driver {url.drivername!r} is not supported; use "
                f"{', '.join(d + '://' for d in _DATABASE_DRIVERS)}"
            )
        if port is not None and not 1 <= port <= 65535:
            raise ValueError(f"port {port} is out of range 1-65535")
        return value

    @field_validator("cors_origins")
    @classmethod
    def _check_cors_origins(cls, value: str) -> str:
        for origin in value.split(","):
            origin = origin.strip().rstrip("/")
            if origin and not re.fullmatch(r"https?://[^/\s*]+", origin):
                raise ValueError(
                    "each origin must be scheme://host[:port] (no path, no wildcard), "
                    "comma-separated"
                )
        return value

    @field_validator("redis_url")
    @classmethod
    def _check_redis_url(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        _check_redis(value)
        return value

    @field_validator("actions_url", "webhook_url", "llm_base_url")
    @classmethod
    def _check_http_url(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http:// or https:// URL with a host")
        _check_host(parts.hostname)
        import httpx  # here: only a URL set needs it, and every command loads the settings

        try:  # what the dispatcher's client will make of it (control characters, a bad port)
            _ = parts.port
            httpx.URL(value)
        except (httpx.InvalidURL, ValueError):
            raise ValueError("must be a valid http:// or https:// URL") from None
        return value

    @field_validator("llm_base_url")
    @classmethod
    def _check_llm_base_url(cls, value: str | None) -> str | None:
        # The client appends /chat/completions itself: the endpoint pasted whole (as curl
        # examples show it) made every call a 404 at .../chat/completions/chat/completions.
        path = urlsplit(value).path.rstrip("/") if value else ""
        if path.endswith("/chat/completions"):
            raise ValueError(
                "must be the API's base (as in http://HOST:8000/v1), not the endpoint: the "
                "client adds /chat/completions itself"
            )
        return value

    @field_validator("llm_api_key")
    @classmethod
    def _check_llm_api_key(cls, value: SecretStr | None) -> SecretStr | None:
        # Sent as `Authorization: Bearer <key>` on every model call: a key httpx refuses to send
        # (a line ending kept from a file, a non-ASCII character) would fail every round later,
        # as "unreachable" or a traceback. The message says where, never the key.
        problem = _header_problem(value.get_secret_value()) if value is not None else None
        if problem is not None:
            raise ValueError(
                f"has {problem}, which an HTTP header cannot carry, so no model call could be "
                "sent; check how the key was copied (the key is not shown)"
            )
        return value

    @model_validator(mode="after")
    def _check_delivery_secrets(self) -> Settings:
        if self.webhook_url and not self.webhook_secret:
            raise ValueError(
                "invalid setting ORCH_WEBHOOK_SECRET: required when ORCH_WEBHOOK_URL is set "
                "(every webhook is signed)"
            )
        if self.actions_url and not self.actions_secret:
            raise ValueError(
                "invalid setting ORCH_ACTIONS_SECRET: required when ORCH_ACTIONS_URL is set "
                "(every approved action is signed, so the backend can tell it from a forgery)"
            )
        return self

    @model_validator(mode="after")
    def _check_output_tokens(self) -> Settings:
        if "llm_max_output_tokens" not in self.model_fields_set:
            # Unset: 4096, but at most a quarter of the window, so that a small one (a local
            # 4k model) works with LLM_CONTEXT_WINDOW alone rather than refusing to start.
            self.llm_max_output_tokens = min(4096, self.llm_context_window // 4)
        if self.llm_max_output_tokens >= self.llm_context_window:
            raise ValueError(
                "invalid setting LLM_MAX_OUTPUT_TOKENS: must be below LLM_CONTEXT_WINDOW "
                f"({self.llm_max_output_tokens} >= {self.llm_context_window}); unset, it is a "
                "quarter of the window at most"
            )
        return self

    @model_validator(mode="after")
    def _check_tool_timeouts(self) -> Settings:
        # The gateway's own answer (a timeout; `failed` when the request never left) must come
        # before the host gives the call up (a write then `unknown`): every connect attempt may
        # take the whole timeout, with the transport's pauses between them.
        timeout, retries = self.gateway_timeout_seconds, self.gateway_connect_retries
        pauses = connect_retry_pauses(retries)
        worst = timeout * (1 + retries) + pauses
        if worst >= self.tool_timeout_seconds:
            what, took = "", f"{timeout:g}"
            if retries:
                what = (
                    f" times the attempts of ORCH_GATEWAY_CONNECT_RETRIES={retries}, with the "
                    "pauses between them,"
                )
                took = f"{1 + retries} x {timeout:g} s + {pauses:g} s = {worst:g} s"
            raise ValueError(
                f"invalid setting ORCH_GATEWAY_TIMEOUT_SECONDS:{what} must be below "
                f"ORCH_TOOL_TIMEOUT_SECONDS ({took} >= {self.tool_timeout_seconds:g}), "
                "or the host gives every slow call up first"
            )
        return self

    @model_validator(mode="after")
    def _check_lease_timing(self) -> Settings:
        if self.lease_renew_seconds >= self.lease_seconds:
            raise ValueError(
                "invalid setting ORCH_LEASE_RENEW_SECONDS: must be below ORCH_LEASE_SECONDS "
                f"({self.lease_renew_seconds:g} >= {self.lease_seconds:g})"
            )
        return self

    @property
    def cors_origin_list(self) -> list[str]:
        """ORCH_CORS_ORIGINS as a list (a trailing slash is dropped: an Origin never has one)."""
        return [o.strip().rstrip("/") for o in self.cors_origins.split(",") if o.strip()]

    @property
    def outbox_kinds(self) -> tuple[str, ...]:
        """The outbox kinds this deployment delivers: those whose URL is set (the others' rows
        wait for one, on purpose)."""
        return tuple(
            kind
            for kind, url in (("action", self.actions_url), ("webhook", self.webhook_url))
            if url
        )

    @property
    def embedded(self) -> bool:
        """True when no Redis is configured: file broker and SQL leases."""
        return self.redis_url is None

    @property
    def store_url(self) -> str:
        """The database URL in force: the configured one or the embedded SQLite file."""
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.home / 'orchestrator.db').resolve()}"


_ENV_NAMES = {
    "agent_internal_token": "AGENT_INTERNAL_TOKEN",
    "data_cleanup_enable": "DATA_CLEANUP_ENABLE",
    "llm_max_tools": "LLM_MAX_TOOLS",
    "llm_base_url": "LLM_BASE_URL",
    "llm_api_key": "LLM_API_KEY",
    "llm_context_window": "LLM_CONTEXT_WINDOW",
    "llm_max_output_tokens": "LLM_MAX_OUTPUT_TOKENS",
    "llm_timeout_seconds": "LLM_TIMEOUT_SECONDS",
    "llm_temperature": "LLM_TEMPERATURE",
    "llm_max_retries": "LLM_MAX_RETRIES",
}


def _env_name(field: str) -> str:
    if field.isupper():
        return field
    return _ENV_NAMES.get(field, f"ORCH_{field.upper()}")


def setting_names() -> frozenset[str]:
    """Every environment name a setting is read from."""
    return frozenset(_env_name(field) for field in Settings.model_fields)


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """`ORCH_*` names in `environ` that no setting reads (a typo like ORCH_DATABSE_URL)."""
    known = setting_names()
    return sorted(name for name in environ if name.startswith("ORCH_") and name not in known)


_warned: set[str] = set()


def _warn_unknown() -> None:
    names = dict.fromkeys(os.environ, "")
    env_file = Path(str(Settings.model_config.get("env_file") or ".env"))
    if env_file.is_file():  # read as the settings read it: a typo there is as silent
        with suppress(OSError, UnicodeDecodeError):
            names.update(dict.fromkeys(dotenv_values(env_file), ""))
    for name in unknown_variables(names):
        if name in _warned:
            continue
        _warned.add(name)
        close = difflib.get_close_matches(name, sorted(setting_names()), n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        print(
            f"orchestrator: warning: {name} is not a setting and is ignored{hint}",
            file=sys.stderr,
        )


def load_settings(**overrides: object) -> Settings:
    """Read and validate the settings; any problem becomes one `SettingsError` line.

    An `ORCH_*` variable that no setting reads is named in a warning on stderr, once.
    """
    _warn_unknown()
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = [str(part) for part in first.get("loc", ())]
        message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
        if loc:
            raise SettingsError(f"invalid setting {_env_name(loc[0])}: {message}") from None
        raise SettingsError(message) from None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read once."""
    return load_settings()
