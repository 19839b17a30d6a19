"""The console's session cookie names one account and is signed with a key derived from that
account's stored token hash: forged names, wrong MACs, expired and rotated cookies are refused."""

from __future__ import annotations

import base64
import hashlib

import pytest

from orchestrator.api import console_session as session
from orchestrator.api.auth import _identify
from orchestrator.operators import Account, Operator, api_account

API_TOKEN = "shared-api-token"


def account(name: str, role: str, token: str) -> Account:
    return Account(Operator(name, role), hashlib.sha256(token.encode()).digest())


VERA = account("vera", "viewer", "vera-token")
ALMA = account("alma.b@x", "approver", "alma-token")  # a dot in the name: the fields still split
ACCOUNTS = session.sign_in_accounts(API_TOKEN, (VERA, ALMA))


def name_field(value: str) -> str:
    return value.split(".")[1]


def encoded(name: str) -> str:
    return base64.urlsafe_b64encode(name.encode()).decode().rstrip("=")


def test_the_cookie_stands_for_the_account_that_signed_in() -> None:
    assert session.holder(session.issue(VERA), ACCOUNTS) == VERA.operator
    assert session.holder(session.issue(ALMA), ACCOUNTS) == ALMA.operator
    shared = api_account(API_TOKEN)
    assert shared is not None
    assert session.holder(session.issue(shared), ACCOUNTS) == shared.operator
    assert shared.operator.shared
    assert shared.operator.name == "api"


def test_the_cookie_never_holds_a_token_or_its_hash() -> None:
    value = session.issue(ALMA)
    assert "alma-token" not in value
    assert ALMA.digest.hex() not in value
    assert hashlib.sha256(b"alma-token").hexdigest() not in value


def test_a_forged_name_is_refused() -> None:
    # A viewer rewrites the name in its own cookie to an approver's: the MAC no longer fits.
    value = session.issue(VERA)
    forged = value.replace(name_field(value), encoded("alma.b@x"), 1)
    assert session.holder(forged, ACCOUNTS) is None
    to_api = value.replace(name_field(value), encoded("api"), 1)
    assert session.holder(to_api, ACCOUNTS) is None


def test_a_wrong_mac_or_a_bent_field_is_refused() -> None:
    value = session.issue(VERA)
    message, _, mac = value.rpartition(".")
    assert session.holder(f"{message}.{'0' * len(mac)}", ACCOUNTS) is None
    assert session.holder(f"{message}.", ACCOUNTS) is None
    expires = message.split(".")[2]
    later = value.replace(f".{expires}.", f".{int(expires) + 3600}.", 1)
    assert session.holder(later, ACCOUNTS) is None  # a longer session is not signed
    for garbage in ["", "garbage", "v2....", "v1.1.2.3", f"{value}.x", "v2.%%%.1.n.m", "é" * 50]:
        assert session.holder(garbage, ACCOUNTS) is None
    assert session.holder("v2.dmVyYQ." + "9" * 5000 + ".n.m", ACCOUNTS) is None


def test_a_mac_made_with_another_accounts_key_is_refused() -> None:
    # Sign Vera's name with Alma's key: the name picks the key, so it does not verify.
    other = Account(Operator("vera", "viewer"), ALMA.digest)
    assert session.holder(session.issue(other), ACCOUNTS) is None


def test_an_expired_cookie_is_refused() -> None:
    value = session.issue(VERA, now=1_000)
    assert session.holder(value, ACCOUNTS, now=1_000 + session.SESSION_SECONDS - 1) is not None
    assert session.holder(value, ACCOUNTS, now=1_000 + session.SESSION_SECONDS + 1) is None
    assert session.holder(session.issue(VERA, now=0), ACCOUNTS) is None


def test_a_changed_token_or_a_removed_account_signs_the_browser_out() -> None:
    value = session.issue(VERA)
    rotated = account("vera", "viewer", "vera-new-token")
    assert session.holder(value, session.sign_in_accounts(API_TOKEN, (rotated, ALMA))) is None
    assert session.holder(value, session.sign_in_accounts(API_TOKEN, (ALMA,))) is None
    shared = api_account(API_TOKEN)
    assert shared is not None
    api_cookie = session.issue(shared)
    assert session.holder(api_cookie, session.sign_in_accounts("rotated", (VERA,))) is None


def test_the_role_comes_from_the_accounts_file_not_the_cookie() -> None:
    value = session.issue(VERA)
    promoted = Account(Operator("vera", "approver"), VERA.digest)
    assert session.holder(value, (promoted,)) == promoted.operator


def cookie_headers(value: str, *, write_header: bool = False) -> list[tuple[bytes, bytes]]:
    headers = [(b"cookie", f"other=1; {session.COOKIE}={value}".encode())]
    if write_header:
        headers.append((b"x-orch-console", b"1"))
    return headers


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE"])
def test_a_cookie_write_needs_the_console_header(method: str) -> None:
    value = session.issue(ALMA)
    assert (
        session.cookie_operator(cookie_headers(value), method, ACCOUNTS, cookie=session.COOKIE)
        is None
    )
    found = session.cookie_operator(
        cookie_headers(value, write_header=True), method, ACCOUNTS, cookie=session.COOKIE
    )
    assert found == ALMA.operator
    assert (
        session.cookie_operator(cookie_headers(value), "GET", ACCOUNTS, cookie=session.COOKIE)
        == ALMA.operator
    )


def test_identify_gives_the_cookies_account_and_a_bearer_token_wins() -> None:
    value = session.issue(VERA)
    operators = (VERA, ALMA)
    assert (
        _identify(cookie_headers(value), operators, API_TOKEN, cookie=session.COOKIE)
        == VERA.operator
    )
    with_bearer = [*cookie_headers(value), (b"authorization", b"Bearer alma-token")]
    assert _identify(with_bearer, operators, API_TOKEN, cookie=session.COOKIE) == ALMA.operator
    # Operators without ORCH_API_TOKEN: the cookie works the same.
    assert _identify(cookie_headers(value), operators, None, cookie=session.COOKIE) == VERA.operator
    assert (
        _identify(cookie_headers("v2.x.1.n.m"), operators, API_TOKEN, cookie=session.COOKIE) is None
    )


SECRET = "a-console-secret-of-32-characters"


def test_with_a_console_secret_the_operators_file_alone_cannot_sign_a_cookie() -> None:
    # A reader of the operators file has every token hash: without ORCH_CONSOLE_SECRET that is
    # the whole key, so it can sign an approver's cookie. With the secret set, it cannot.
    forged_from_hashes = session.issue(ALMA)
    assert session.holder(forged_from_hashes, ACCOUNTS) == ALMA.operator
    assert session.holder(forged_from_hashes, ACCOUNTS, secret=SECRET) is None
    signed_in = session.issue(ALMA, secret=SECRET)
    assert session.holder(signed_in, ACCOUNTS, secret=SECRET) == ALMA.operator


def test_changing_the_console_secret_signs_every_browser_out() -> None:
    value = session.issue(VERA, secret=SECRET)
    assert session.holder(value, ACCOUNTS, secret=SECRET + "-rotated") is None
    assert session.holder(value, ACCOUNTS) is None  # nor is it good once the secret is unset
    headers = [(b"cookie", f"{session.COOKIE}={value}".encode())]
    assert (
        _identify(headers, (VERA, ALMA), API_TOKEN, cookie=session.COOKIE, console_secret=SECRET)
        == VERA.operator
    )
    assert (
        _identify(headers, (VERA, ALMA), API_TOKEN, cookie=session.COOKIE, console_secret="x" * 16)
        is None
    )


@pytest.mark.parametrize(
    ("scheme", "headers", "name"),
    [
        ("http", [], "orch_console"),
        ("https", [], "__Host-orch_console"),
        ("wss", [], "__Host-orch_console"),  # a websocket opened from an HTTPS page
        ("http", [(b"x-forwarded-proto", b"https")], "__Host-orch_console"),
        ("http", [(b"X-Forwarded-Proto", b"HTTPS, http")], "__Host-orch_console"),
        ("http", [(b"x-forwarded-proto", b"http, https")], "orch_console"),  # the first hop's
        ("http", [(b"forwarded", b'for=10.0.0.2; proto="https"')], "__Host-orch_console"),
        ("http", [(b"forwarded", b"proto=http, proto=https")], "orch_console"),
    ],
)
def test_the_cookies_name_follows_how_the_request_arrived(
    scheme: str, headers: list[tuple[bytes, bytes]], name: str
) -> None:
    scope = {"type": "http", "scheme": scheme, "headers": headers}
    assert session.cookie_name(scope) == name
    value = session.issue(VERA)
    other = session.HTTPS_COOKIE if name == session.COOKIE else session.COOKIE
    sent = [*headers, (b"cookie", f"{other}=x; {name}={value}".encode())]
    assert session.cookie_from_headers(sent, session.cookie_name(scope)) == value
    assert session.cookie_from_headers([(b"cookie", f"{other}={value}".encode())], name) is None
