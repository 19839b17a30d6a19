"""Settings from the environment (and an optional `.env`), validated once at start-up."""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit

from pydantic import AliasChoices, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

__all__ = ["Settings", "SettingsError", "get_settings", "load_settings"]

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
    max_rounds: int = Field(default=5, ge=1)
    max_turns: int = Field(default=30, ge=1)
    api_token: str | None = None
    model: str = Field(default="scripted:scripts", description="scripted:DIR (see the README)")
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

    agent_internal_token: str | None = Field(
        default=None, validation_alias=_env("AGENT_INTERNAL_TOKEN")
    )
    data_cleanup_enable: bool = Field(default=True, validation_alias=_env("DATA_CLEANUP_ENABLE"))
    llm_max_tools: int = Field(default=0, ge=0, validation_alias=_env("LLM_MAX_TOOLS"))
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
}


def _env_name(field: str) -> str:
    if field.isupper():
        return field
    return _ENV_NAMES.get(field, f"ORCH_{field.upper()}")


def load_settings(**overrides: object) -> Settings:
    """Read and validate the settings; any problem becomes one `SettingsError` line."""
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
