"""Log lines: JSON with the execution's context, and never a whole token, key or secret."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from orchestrator.logs import JsonFormatter, RedactFilter, log_context, redact, secrets_of
from orchestrator.settings import load_settings

TOKEN = "tok-2f9c8e1d7a6b5c4d3e2f1a0b"
PASSWORD = "pg-pa55word-xyz"


@pytest.fixture
def captured() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    settings = load_settings(
        api_token=TOKEN,
        agent_internal_token="internal-secret-value-123",
        database_url=f"postgresql+psycopg://orch:{PASSWORD}@db:5432/orch",
    )
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(RedactFilter(secrets_of(settings)))
    logger = logging.getLogger("test.logs")
    logger.handlers = [handler]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    yield logger, stream
    logger.handlers = []


def test_json_lines_carry_the_execution_context(
    captured: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, stream = captured
    with log_context(task_id="t-1", generation=2, worker="w@h:1", session_id="s-9"):
        logger.info("round ended %s", "completed")
    logger.info("outside")
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert first["event"] == "round ended completed"
    assert (first["task_id"], first["generation"], first["session_id"], first["worker"]) == (
        "t-1",
        2,
        "s-9",
        "w@h:1",
    )
    assert first["level"] == "info"
    assert "task_id" not in second


@pytest.mark.parametrize(
    "message",
    [
        f"Authorization: Bearer {TOKEN}",
        f"GET /console?token={TOKEN} 200",
        f"connecting to postgresql://orch:{PASSWORD}@db/orch",
        f"settings: api_token={TOKEN}",
        f'{{"api_key": "sk-abcdefghijklmnopqrstuvwxyz", "note": "{PASSWORD}"}}',
        f"the token is {TOKEN}, the password {PASSWORD}",
    ],
)
def test_no_whole_secret_reaches_a_line(
    captured: tuple[logging.Logger, io.StringIO], message: str
) -> None:
    logger, stream = captured
    logger.warning(message)
    try:
        raise ValueError(message)
    except ValueError:
        logger.exception("failed")
    text = stream.getvalue()
    for secret in (TOKEN, PASSWORD, "sk-abcdefghijklmnopqrstuvwxyz"):
        assert secret not in text
    assert all(json.loads(line) for line in text.splitlines() if line.startswith("{"))


def test_redact_keeps_ordinary_text() -> None:
    text = "task 5f0c generation 2 completed in 3.1s (plan revision 4)"
    assert redact(text, ["secret-value"]) == text


def test_uvicorn_access_lines_keep_their_arguments_masked() -> None:
    from uvicorn.logging import AccessFormatter

    record = logging.LogRecord(
        "uvicorn.access",
        logging.INFO,
        __file__,
        1,
        '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:5000", "GET", f"/console?token={TOKEN}", "1.1", 200),
        None,
    )
    assert RedactFilter([TOKEN]).filter(record)
    line = AccessFormatter('%(client_addr)s - "%(request_line)s" %(status_code)s').format(record)
    assert TOKEN not in line
    assert "GET /console?token=" in line


def test_every_configured_secret_is_masked_the_model_key_too() -> None:
    # The model's key is a SecretStr: it was left out of the list, and so were the webhook
    # signing secret and the console secret (and the approved actions' signing secret).
    secrets = {
        "llm_api_key": "sk-model-key-0123456789",
        "actions_secret": "actions-signing-secret-9",
        "webhook_secret": "webhook-signing-secret-42",
        "console_secret": "console-session-secret-7",
    }
    settings = load_settings(
        database_url="sqlite:///x.db",
        webhook_url="http://127.0.0.1:9/hook",
        actions_url="http://127.0.0.1:9/actions",
        **secrets,
    )
    listed = secrets_of(settings)
    for value in secrets.values():
        assert value in listed
        assert value not in redact(f"a line that quotes {value}", listed)


SLACK = "https://hooks.slack.com/services/T0AB12CD3/B0EF45GH6/xYzSecretPart0123456789"


@pytest.mark.parametrize(
    ("setting", "url", "hidden"),
    [
        ("webhook_url", SLACK, ("T0AB12CD3", "B0EF45GH6", "xYzSecretPart0123456789")),
        # httpx logs the URL as it sends it (percent-encoded): masked in that form too.
        ("webhook_url", "http://backend:8080/hooks/s3cr3t path", ("s3cr3t",)),
        ("actions_url", "http://backend:8080/apply/key-in-the-path-77", ("key-in-the-path-77",)),
    ],
)
def test_an_outbox_url_s_path_is_masked_in_httpx_s_request_line(
    setting: str, url: str, hidden: tuple[str, ...]
) -> None:
    """A Slack-style webhook carries its secret in the path; httpx logs every request's URL at
    INFO (`HTTP Request: POST <url> "HTTP/1.1 200 OK"`)."""
    import httpx

    settings = load_settings(
        database_url="sqlite:///x.db",
        webhook_secret="webhook-signing-secret-42",
        actions_secret="actions-signing-secret-9",
        **{setting: url},
    )
    record = logging.LogRecord(
        "httpx",
        logging.INFO,
        __file__,
        1,
        'HTTP Request: %s %s "%s %d %s"',
        ("POST", httpx.URL(url), "HTTP/1.1", 200, "OK"),
        None,
    )
    assert RedactFilter(secrets_of(settings)).filter(record)
    line = record.getMessage()
    assert line.startswith("HTTP Request: POST http")
    assert httpx.URL(url).host in line  # where it went stays readable
    for part in hidden:
        assert part not in line, line


def test_a_python_warning_is_one_json_line_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """A library's warning (Celery's superuser warning, a deprecation) would otherwise be
    printed by `warnings` as several lines of text in the middle of the JSON."""
    import sys
    import warnings

    from orchestrator.logs import configure_logging

    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    try:
        configure_logging(load_settings(log_format="json", api_token=TOKEN))
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.warn(f"running as root\nis not recommended {TOKEN}", UserWarning, stacklevel=1)
    finally:
        logging.captureWarnings(False)
        root.handlers, root.level = saved
    [line] = stream.getvalue().splitlines()
    event = json.loads(line)
    assert (event["level"], event["logger"]) == ("warning", "py.warnings")
    assert "UserWarning: running as root" in event["event"]
    assert TOKEN not in line


def test_an_outbox_url_s_path_is_masked_only_as_part_of_that_url() -> None:
    """The path of `http://backend:8080/actions` was masked wherever its text appeared: every
    API access line about actions (`GET /api/v1/actions`) lost its route, a message its words."""
    settings = load_settings(
        database_url="sqlite:///x.db",
        webhook_url=SLACK,
        webhook_secret="webhook-signing-secret-42",
        actions_url="http://Backend:8080/actions",
        actions_secret="actions-signing-secret-9",
    )
    secrets = secrets_of(settings)
    kept = (
        '127.0.0.1:5000 - "GET /api/v1/actions?any=true HTTP/1.1" 200; '
        "see /services/T0AB12CD3 docs; http://other:8080/actions; http://backend:8080/actionsX"
    )
    assert redact(kept, secrets) == kept
    # As part of its URL (any case of scheme and host, a user part, a sub-path): masked.
    line = (
        f"POST {SLACK} failed; retried HTTP://backend:8080/actions/7 and "
        "http://ops@backend:8080/actions, then GET /api/v1/actions"
    )
    masked = redact(line, secrets)
    assert "xYzSecretPart0123456789" not in masked
    assert "B0EF45GH6" not in masked
    assert masked == (
        "POST https://hooks.slack.com/ser*** failed; retried HTTP://backend:8080***/7 and "
        "http://ops@backend:8080***, then GET /api/v1/actions"
    )
    # Standing alone, as an error that echoes only the path would show it: masked too.
    alone = 'refused "/services/T0AB12CD3/B0EF45GH6/xYzSecretPart0123456789" (404)'
    assert redact(alone, secrets) == 'refused "/ser***" (404)'
