"""The outbox's pure parts: the webhook signature and the settings that configure delivery."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from orchestrator.services.outbox import sign
from orchestrator.services.outbox_signing import signature_headers
from orchestrator.settings import SettingsError, load_settings


def test_the_signature_is_the_hex_hmac_sha256_of_the_raw_body() -> None:
    body = b'{"event_id":"t:1","type":"waiting"}'
    expected = hmac.new(b"s3cret", body, hashlib.sha256).hexdigest()
    assert sign("s3cret", body) == f"sha256={expected}"
    assert sign("s3cret", body + b" ") != sign("s3cret", body)
    assert sign("other", body) != sign("s3cret", body)


def test_the_timed_signature_is_standard_webhooks_v1_over_id_time_and_body() -> None:
    # standardwebhooks.com: base64 HMAC-SHA256 of "{webhook-id}.{webhook-timestamp}.{body}",
    # keyed with the secret's bytes; the body-only signature stays for today's receivers.
    body = b'{"event_id":"t:1","type":"waiting"}'
    headers = signature_headers("s3cret", "t:1", body, timestamp=1767225600)
    mac = hmac.new(b"s3cret", b"t:1.1767225600." + body, hashlib.sha256).digest()
    assert headers == {
        "webhook-id": "t:1",
        "webhook-timestamp": "1767225600",
        "webhook-signature": "v1," + base64.b64encode(mac).decode(),
        "X-Orchestrator-Signature": sign("s3cret", body),
    }
    # The time, the id and the body are all covered: change one and the signature changes.
    signed = headers["webhook-signature"]
    assert signature_headers("s3cret", "t:1", body, 1767225601)["webhook-signature"] != signed
    assert signature_headers("s3cret", "t:2", body, 1767225600)["webhook-signature"] != signed
    assert signature_headers("s3cret", "t:1", body + b" ", 1767225600)["webhook-signature"] != (
        signed
    )
    assert signature_headers("other", "t:1", body, 1767225600)["webhook-signature"] != signed


def test_a_webhook_url_needs_a_secret_and_the_secret_never_shows() -> None:
    with pytest.raises(SettingsError, match="ORCH_WEBHOOK_SECRET: required"):
        load_settings(webhook_url="http://127.0.0.1:9/hooks")
    settings = load_settings(webhook_url="http://127.0.0.1:9/hooks", webhook_secret="hush-hush")
    assert "hush-hush" not in repr(settings)


def test_an_actions_url_needs_a_secret_of_its_own_and_it_never_shows() -> None:
    # An unsigned approval could be forged by anyone who reaches the backend's action URL.
    with pytest.raises(SettingsError, match="ORCH_ACTIONS_SECRET: required"):
        load_settings(actions_url="http://127.0.0.1:9/actions", webhook_secret="hush-hush")
    settings = load_settings(actions_url="http://127.0.0.1:9/actions", actions_secret="psst-psst")
    assert "psst-psst" not in repr(settings)


@pytest.mark.parametrize("name", ["actions_url", "webhook_url"])
def test_delivery_urls_are_http(name: str) -> None:
    with pytest.raises(SettingsError, match=f"ORCH_{name.upper()}: must be an http"):
        load_settings(**{name: "ftp://example.org/x", "webhook_secret": "s", "actions_secret": "s"})


@pytest.mark.parametrize("name", ["actions_url", "webhook_url"])
@pytest.mark.parametrize("url", ["http://user:hush@backend/a\x01b", "http://backend:99999/x"])
def test_a_delivery_url_the_client_cannot_send_to_stops_the_start(name: str, url: str) -> None:
    # Such a URL used to pass, then every delivery raised outside the dispatcher's error
    # handling: the row was never marked failed and held back the rest of its batch.
    with pytest.raises(SettingsError, match=f"ORCH_{name.upper()}: must be a valid") as caught:
        load_settings(**{name: url, "webhook_secret": "s", "actions_secret": "s"})
    assert "hush" not in str(caught.value)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("outbox_timeout_seconds", 0),
        ("webhook_max_attempts", 0),
        ("outbox_backoff_seconds", -1),
        ("outbox_backoff_max_seconds", 1e12),  # a timedelta that large overflows
    ],
)
def test_outbox_numbers_are_bounded(name: str, value: float) -> None:
    with pytest.raises(SettingsError, match=f"ORCH_{name.upper()}"):
        load_settings(**{name: value})
