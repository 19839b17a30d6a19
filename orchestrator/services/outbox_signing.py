"""How a delivery to the business backend is signed, so the backend can tell it from a forgery
and from a replay.

Two signatures, each an HMAC-SHA256 keyed with the kind's secret (its UTF-8 bytes):
- `webhook-signature` (with `webhook-id` and `webhook-timestamp`), the Standard Webhooks scheme
  (standardwebhooks.com, as Stripe's `t=` signature): `v1,` and the base64 MAC of
  `"{id}.{timestamp}.{raw body}"`. It covers the send time, so a receiver that refuses a
  timestamp more than five minutes from its clock, and deduplicates on the id within that
  window, cannot be fooled by a captured request sent again later. The id is the action id of
  an approved action and the event id of a task event: the same on every retry of a row.
- `X-Orchestrator-Signature`, `sha256=` and the hex MAC of the raw body alone, which receivers
  written before the timestamp check; it proves the origin, not the time.

The secret is used here and nowhere else: it is never in a header, an error or a log line.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from typing import Final

__all__ = [
    "ID_HEADER",
    "SIGNATURE_HEADER",
    "TIMED_SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "sign",
    "signature_headers",
]

#: The body-only signature (kept for receivers that check it; it does not cover the time).
SIGNATURE_HEADER: Final = "X-Orchestrator-Signature"
#: Standard Webhooks' names, so its libraries verify a delivery as they are.
ID_HEADER: Final = "webhook-id"
TIMESTAMP_HEADER: Final = "webhook-timestamp"
TIMED_SIGNATURE_HEADER: Final = "webhook-signature"


def sign(secret: str, body: bytes) -> str:
    """The body-only signature's value: `sha256=` and the hex HMAC-SHA256 of the raw body."""
    return "sha256=" + hmac.new(secret.encode("utf-8"), body, hashlib.sha256).hexdigest()


def sign_timed(secret: str, message_id: str, timestamp: int, body: bytes) -> str:
    """The timed signature's value: `v1,` and the base64 HMAC-SHA256 of `id.timestamp.body`."""
    signed = f"{message_id}.{timestamp}.".encode() + body
    mac = hmac.new(secret.encode("utf-8"), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode("ascii")


def signature_headers(secret: str, message_id: str, body: bytes, timestamp: int) -> dict[str, str]:
    """The headers that sign `body`, sent at `timestamp` (Unix seconds)."""
    return {
        ID_HEADER: message_id,
        TIMESTAMP_HEADER: str(timestamp),
        TIMED_SIGNATURE_HEADER: sign_timed(secret, message_id, timestamp, body),
        SIGNATURE_HEADER: sign(secret, body),
    }
