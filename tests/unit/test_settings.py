"""Settings through the loader: a bad value is one `SettingsError` line naming the setting.

The environment is the source here, as in production; the working directory is an empty
folder so no `.env` of the developer's leaks in.
"""

from __future__ import annotations

import itertools
import os

import pytest

from orchestrator.settings import SettingsError, connect_retry_pauses, load_settings

SECRET = "s3cret-pw"


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: os.PathLike[str]) -> None:
    for name in list(os.environ):
        if name.startswith("ORCH_") or name in ("AGENT_INTERNAL_TOKEN", "DATA_CLEANUP_ENABLE"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


def refused(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> str:
    monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError) as caught:
        load_settings()
    message = str(caught.value)
    assert message.startswith(f"invalid setting {name}: "), message
    assert "\n" not in message
    assert SECRET not in message  # a URL's password is never repeated
    return message


@pytest.mark.parametrize(
    ("value", "part"),
    [
        ("redis://localhost:abc", "port 'abc'"),
        (f"redis://:{SECRET}@localhost:abc/0", "port 'abc'"),
        ("redis://localhost:70000", "1-65535"),
        ("redis://localhost:0", "1-65535"),
        ("redis://", "no host"),
        (f"redis://:{SECRET}@/0", "no host"),
        ("redis://localhost:6379/x", "database"),
        ("redis://localhost:6379/0?db=x", "'db'"),
        ("unix://", "socket path"),
        ("http://localhost:6379", "redis://"),
    ],
)
def test_a_redis_url_is_parsed_when_validated(
    monkeypatch: pytest.MonkeyPatch, value: str, part: str
) -> None:
    assert part in refused(monkeypatch, "ORCH_REDIS_URL", value)


@pytest.mark.parametrize(
    "value",
    [
        "redis://localhost:6379/0",
        "redis://localhost",
        f"rediss://:{SECRET}@cache.internal:6380/2",
        "redis://[::1]:6379/0",
        "unix:///run/redis/redis.sock",
    ],
)
def test_good_redis_urls_pass(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("ORCH_REDIS_URL", value)
    settings = load_settings()
    assert settings.redis_url == value
    assert not settings.embedded


@pytest.mark.parametrize(
    ("value", "part"),
    [
        (f"postgresql+psycopg2://orch:{SECRET}@db/orch", "'postgresql+psycopg2' is not supported"),
        ("postgresql+asyncpg://db/orch", "'postgresql+asyncpg' is not supported"),
        ("sqlite+pysqlite:///x.db", "'sqlite+pysqlite' is not supported"),
        ("mysql://db/orch", "'mysql' is not supported"),
        (f"postgresql+psycopg://orch:{SECRET}@db:abc/orch", "not a database URL"),
        ("postgresql+psycopg://db:70000/orch", "1-65535"),
        (f"::not a url {SECRET}::", "not a database URL"),
    ],
)
def test_only_the_supported_database_drivers_pass(
    monkeypatch: pytest.MonkeyPatch, value: str, part: str
) -> None:
    assert part in refused(monkeypatch, "ORCH_DATABASE_URL", value)


@pytest.mark.parametrize(
    "value",
    ["postgresql+psycopg://orch@db:5432/orch", "postgresql://orch@db/orch", "sqlite:///x.db"],
)
def test_supported_database_urls_pass(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("ORCH_DATABASE_URL", value)
    assert load_settings().store_url == value


@pytest.mark.parametrize(
    "name",
    [
        "ORCH_LEASE_SECONDS",
        "ORCH_LEASE_RENEW_SECONDS",
        "ORCH_SWEEP_SECONDS",
        "ORCH_QUEUED_STALE_SECONDS",
        "ORCH_GATEWAY_TIMEOUT_SECONDS",
        "ORCH_TOOL_TIMEOUT_SECONDS",
    ],
)
@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "Infinity", "1e400"])
def test_float_settings_refuse_infinity_and_nan(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    assert "finite" in refused(monkeypatch, name, value)


def test_finite_floats_still_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCH_LEASE_SECONDS", "90.5")
    monkeypatch.setenv("ORCH_LEASE_RENEW_SECONDS", "30")
    settings = load_settings()
    assert (settings.lease_seconds, settings.lease_renew_seconds) == (90.5, 30.0)


@pytest.mark.parametrize(
    "value", ["http://llm:8000/v1/chat/completions", "https://gw.example/openai/chat/completions/"]
)
def test_an_llm_base_url_that_is_the_endpoint_is_refused(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    """Before, every model call was a 404 at .../chat/completions/chat/completions."""
    message = refused(monkeypatch, "LLM_BASE_URL", value)
    assert "not the endpoint: the client adds /chat/completions itself" in message
    monkeypatch.setenv("LLM_BASE_URL", "http://llm:8000/v1")
    assert load_settings().llm_base_url == "http://llm:8000/v1"


@pytest.mark.parametrize("name", ["ORCH_WEBHOOK_URL", "ORCH_ACTIONS_URL", "LLM_BASE_URL"])
@pytest.mark.parametrize(
    ("value", "part"),
    [
        ("http://back end/x", "a space"),
        (f"https://u:{SECRET}@back end:8443/services/T000/B000/XXXX", "a space"),
        ("http://a<b/x", "'<'"),
        ("http://a|b/x", "'|'"),
        ("http://a%20b/x", "'%'"),
        ("http://a..b/x", "label"),
    ],
)
def test_an_http_url_whose_host_no_client_can_reach_is_refused(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, part: str
) -> None:
    """httpx takes `http://back end/x` (it sends `back%20end`): refused at start instead of a
    delivery that fails on every attempt."""
    message = refused(monkeypatch, name, value)
    assert part in message, message
    assert "XXXX" not in message


@pytest.mark.parametrize(
    "value",
    [
        "http://backend:8080/hooks",
        "https://hooks.slack.com/services/T000/B000/XXXX",
        "http://127.0.0.1:9/x",
        "http://[::1]:8000/x",
        "https://bücher.example/x",
        "http://exa_mple.internal/x",
    ],
)
def test_http_urls_with_good_hosts_pass(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("ORCH_ACTIONS_URL", value)
    monkeypatch.setenv("ORCH_ACTIONS_SECRET", "s")
    assert load_settings().actions_url == value


@pytest.mark.parametrize(
    ("value", "part"),
    [
        ("0", "greater than or equal to 1"),
        ("0.5", "1"),
        ("3601", "3600"),
        ("-5", "1"),
        ("soon", "number"),
    ],
)
def test_the_tool_timeout_is_bounded(
    monkeypatch: pytest.MonkeyPatch, value: str, part: str
) -> None:
    """Before, nothing bounded a tool call; an out-of-range limit is refused at start."""
    assert part in refused(monkeypatch, "ORCH_TOOL_TIMEOUT_SECONDS", value)


def test_the_tool_timeout_defaults_to_five_minutes_and_takes_a_value(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert load_settings().tool_timeout_seconds == 300.0
    monkeypatch.setenv("ORCH_TOOL_TIMEOUT_SECONDS", "45")
    assert load_settings().tool_timeout_seconds == 45.0


def test_the_gateway_timeout_must_be_below_the_tool_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ORCH_TOOL_TIMEOUT_SECONDS", "30")
    message = refused(monkeypatch, "ORCH_GATEWAY_TIMEOUT_SECONDS", "30")
    assert "ORCH_TOOL_TIMEOUT_SECONDS" in message


@pytest.mark.parametrize(
    ("retries", "timeout", "worst"),
    [
        ("1", "30", "2 x 30 s + 0 s = 60 s"),  # two attempts, no pause before the first retry
        ("2", "20", "3 x 20 s + 0.5 s = 60.5 s"),
        ("2", "19.9", "3 x 19.9 s + 0.5 s = 60.2 s"),  # below 60 only without the pause
        ("5", "10", "6 x 10 s + 7.5 s = 67.5 s"),
    ],
)
def test_the_gateway_s_connect_retries_count_against_the_tool_timeout(
    monkeypatch: pytest.MonkeyPatch, retries: str, timeout: str, worst: str
) -> None:
    """Each connect attempt may take the whole ORCH_GATEWAY_TIMEOUT_SECONDS, with httpcore's
    pause before each retry: when the gateway's own answer (`failed`: never sent) would come
    after ORCH_TOOL_TIMEOUT_SECONDS, the host gives the call up first (a write `unknown`)."""
    monkeypatch.setenv("ORCH_TOOL_TIMEOUT_SECONDS", "60")
    monkeypatch.setenv("ORCH_GATEWAY_CONNECT_RETRIES", retries)
    message = refused(monkeypatch, "ORCH_GATEWAY_TIMEOUT_SECONDS", timeout)
    assert f"ORCH_GATEWAY_CONNECT_RETRIES={retries}" in message
    assert f"({worst} >= 60)" in message
    assert "ORCH_TOOL_TIMEOUT_SECONDS" in message


def test_gateway_retries_that_end_before_the_tool_timeout_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ORCH_TOOL_TIMEOUT_SECONDS", "60")
    monkeypatch.setenv("ORCH_GATEWAY_CONNECT_RETRIES", "2")
    monkeypatch.setenv("ORCH_GATEWAY_TIMEOUT_SECONDS", "19.8")  # 59.4 s + 0.5 s
    assert load_settings().gateway_connect_retries == 2
    monkeypatch.setenv("ORCH_GATEWAY_CONNECT_RETRIES", "5")
    monkeypatch.setenv("ORCH_GATEWAY_TIMEOUT_SECONDS", "10")
    monkeypatch.setenv("ORCH_TOOL_TIMEOUT_SECONDS", "300")  # the defaults hold 5 retries
    assert load_settings().gateway_connect_retries == 5


@pytest.mark.parametrize("retries", range(6))
def test_the_pause_between_connect_retries_is_httpcore_s(retries: int) -> None:
    from httpcore._sync.connection import RETRIES_BACKOFF_FACTOR, exponential_backoff

    pauses = list(itertools.islice(exponential_backoff(RETRIES_BACKOFF_FACTOR), retries))
    assert connect_retry_pauses(retries) == sum(pauses)


def test_an_execution_lease_is_two_minutes_renewed_well_before_it_runs_out() -> None:
    """Seed 004: 执行会话使用两分钟任务租约并定期续租 (the environment is cleaned above)."""
    settings = load_settings()
    assert settings.lease_seconds == 120.0
    # Periodic: more than one renewal fits in a lease, so one late beat does not lose it.
    assert settings.lease_renew_seconds * 2 < settings.lease_seconds


@pytest.mark.parametrize(
    ("value", "part"),
    [
        # A key read from a file or a Windows-edited .env keeps its line ending: httpx refused to
        # send it and every round ended "the model server is unreachable" after its retries.
        (f"sk-{SECRET}\n", "a line break at character 13 of 13"),
        (f"sk-{SECRET}\r", "a line break at character 13 of 13"),
        (f" sk-{SECRET}", "a space at its start"),
        (f"sk-{SECRET} ", "a space at its end"),
        (f"sk-{SECRET}\t1", "a control character at character 13 of 14"),
        # Before, an "agent error: 'ascii' codec can't encode ..." with a traceback in the log.
        (f"sk-{SECRET}é", "a non-ASCII character at character 13 of 13"),
    ],
)
def test_an_api_key_no_http_header_can_carry_is_refused(
    monkeypatch: pytest.MonkeyPatch, value: str, part: str
) -> None:
    message = refused(monkeypatch, "LLM_API_KEY", value)
    assert part in message, message
    assert "header" in message, message


@pytest.mark.parametrize(
    "value", [f"sk-{SECRET}", "sk-proj-AbC_12-34.x/y+z=", "key with inner spaces"]
)
def test_api_keys_an_http_header_can_carry_pass(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("LLM_API_KEY", value)
    key = load_settings().llm_api_key
    assert key is not None
    assert key.get_secret_value() == value


def test_a_small_window_alone_starts_with_a_quarter_of_it_for_the_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before, LLM_CONTEXT_WINDOW=4096 alone refused to start: the default 4096 output tokens
    were not below it."""
    monkeypatch.setenv("LLM_CONTEXT_WINDOW", "4096")
    assert load_settings().llm_max_output_tokens == 1024
    monkeypatch.setenv("LLM_CONTEXT_WINDOW", "8192")
    assert load_settings().llm_max_output_tokens == 2048
    monkeypatch.delenv("LLM_CONTEXT_WINDOW")
    assert load_settings().llm_max_output_tokens == 4096  # the default window: as before
    monkeypatch.setenv("LLM_MAX_OUTPUT_TOKENS", "3000")
    monkeypatch.setenv("LLM_CONTEXT_WINDOW", "4096")
    assert load_settings().llm_max_output_tokens == 3000  # set: as set


def test_output_tokens_set_at_or_over_the_window_are_refused_in_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LLM_CONTEXT_WINDOW", "4096")
    message = refused(monkeypatch, "LLM_MAX_OUTPUT_TOKENS", "4096")
    assert "must be below LLM_CONTEXT_WINDOW (4096 >= 4096)" in message
