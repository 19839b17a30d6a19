"""Bearer tokens: ORCH_API_TOKEN for public routes, AGENT_INTERNAL_TOKEN for the internal bridge.

`BearerTokens` is a pure ASGI middleware that decides on the path alone, before FastAPI reads
or parses a body: a request without the right token is a 401 `unauthorized` whatever it sends
(malformed JSON included), and a refused body is never read. The route dependencies below check
the same again, so a router mounted some other way is not left open.

Tokens are compared in constant time (digests of equal length, so not even the length leaks) and
never appear in a log line or an error message.

With operator accounts (ORCH_OPERATORS) a public request's token names an account; its role
decides: a `viewer` only reads (403 `forbidden` on any write), an `operator` writes but does
not decide on actions (`require_role("approver")`). The account is on `request.state.operator`.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable, Collection, Iterable, Sequence
from functools import partial

from fastapi import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from orchestrator.api.console_session import (
    Revoked,
    cookie_name,
    cookie_operator,
    sign_in_accounts,
    write_without_header,
)
from orchestrator.api.sign_in_limit import SignInLimit, TooManyFailures, client_address
from orchestrator.errors import Forbidden, OrchestratorError, Unauthorized
from orchestrator.operators import Account, Operator, find_operator, may
from orchestrator.operators_file import OperatorsFile, OperatorsUnreadable
from orchestrator.settings import Settings

__all__ = [
    "ANONYMOUS",
    "AccountSource",
    "BearerTokens",
    "caller_of",
    "current_accounts",
    "current_operator",
    "require_api_token",
    "require_internal_token",
    "require_role",
    "revoked_sessions",
    "still_admitted",
]

#: Who calls when no token is configured at all (loopback only, see `orchestrator api`).
ANONYMOUS = Operator("anonymous", "approver", shared=True)
_READS = frozenset({"GET", "HEAD", "OPTIONS"})

_WRONG = "missing or wrong bearer token"
_NO_CONSOLE_HEADER = (
    "a console session's write must carry the header X-Orch-Console: 1 (which no "
    "cross-site form can send)"
)
_CLOSED = "the internal bridge is closed: AGENT_INTERNAL_TOKEN is not set"


def _settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def _authorization(headers: Iterable[tuple[bytes, bytes]]) -> bytes:
    """The raw Authorization header (empty when absent); the first one if repeated."""
    for name, value in headers:
        if name.lower() == b"authorization":
            return value
    return b""


def _bearer(headers: Iterable[tuple[bytes, bytes]]) -> bytes:
    """The bearer token of the Authorization header, stripped; empty when there is none.

    An empty token names no one, even when an account's stored hash is the empty string's
    (`printf %s "$TOKEN" | sha256sum` with $TOKEN unset): a bare `Bearer` is no credential."""
    scheme, _, presented = _authorization(headers).partition(b" ")
    return presented.strip() if scheme.lower() == b"bearer" else b""


def bearer_matches(header: bytes, expected: str) -> bool:
    """Whether a raw Authorization header carries `expected` as its bearer token.

    Bytes throughout: a non-ASCII token is compared as the UTF-8 the client sent.
    """
    scheme, _, presented = header.partition(b" ")
    # compare_digest of two SHA-256 digests: constant time for any content and any length.
    matches = hmac.compare_digest(
        hashlib.sha256(presented.strip()).digest(),
        hashlib.sha256(expected.encode("utf-8", "surrogateescape")).digest(),
    )
    return scheme.lower() == b"bearer" and matches


def _check_bearer(request: Request, expected: str) -> None:
    if not bearer_matches(_authorization(request.scope.get("headers", ())), expected):
        raise Unauthorized(_WRONG)


#: The operator accounts: a fixed list, or ORCH_OPERATORS as it reads at each request.
AccountSource = Sequence[Account] | OperatorsFile


def current_accounts(source: AccountSource) -> Sequence[Account]:
    """The accounts as they stand now; `OperatorsUnreadable` (503) while the operators file
    cannot be used."""
    return source.accounts() if isinstance(source, OperatorsFile) else source


def _accounts(request: Request) -> Sequence[Account]:
    source: AccountSource = getattr(request.app.state, "operators", ())
    return current_accounts(source)


def _identify(
    headers: Iterable[tuple[bytes, bytes]],
    accounts: Sequence[Account],
    api_token: str | None,
    *,
    method: str = "GET",
    cookie: str,
    console_secret: str | None = None,
    revoked: Revoked | None = None,
    wrong_token: Callable[[], None] | None = None,
) -> Operator | None:
    """The caller's account; ANONYMOUS when no token is configured; None for a wrong token.

    A console session cookie (see `console_session`) stands for the account that signed in:
    ORCH_API_TOKEN's full-rights account or an ORCH_OPERATORS account, with its role; `cookie`
    is its name for the request (`console_session.cookie_name`).
    `wrong_token` is called when a bearer token names no account, whatever the cookie does (a
    guess beside one's own cookie is still a guess: the role answered would tell it right)."""
    if not accounts and not api_token:
        return ANONYMOUS
    headers = list(headers)
    presented = _bearer(headers)
    if presented:
        operator = find_operator(presented, accounts, api_token)
        if operator is not None:
            return operator
        if wrong_token is not None:
            wrong_token()
    return cookie_operator(
        headers,
        method,
        sign_in_accounts(api_token, accounts),
        cookie=cookie,
        secret=console_secret,
        revoked=revoked,
    )


def _caller(
    headers: Iterable[tuple[bytes, bytes]],
    accounts: Sequence[Account],
    api_token: str | None,
    *,
    method: str,
    cookie: str,
    console_secret: str | None,
    revoked: Revoked | None = None,
    wrong_token: Callable[[], None] | None = None,
) -> Operator | Unauthorized:
    """The caller's account (`_identify`), or the refusal of a request it found none for,
    saying what is missing."""
    headers = list(headers)
    operator = _identify(
        headers,
        accounts,
        api_token,
        method=method,
        cookie=cookie,
        console_secret=console_secret,
        revoked=revoked,
        wrong_token=wrong_token,
    )
    if operator is not None:
        return operator
    signed_in = write_without_header(
        headers,
        method,
        sign_in_accounts(api_token, accounts),
        cookie=cookie,
        secret=console_secret,
        revoked=revoked,
    )
    return Unauthorized(_NO_CONSOLE_HEADER if signed_in else _WRONG)


def _role_refusal(operator: Operator, method: str) -> str | None:
    if method.upper() not in _READS and not may(operator, "operator"):
        return f"account {operator.name} ({operator.role}) can only read"
    return None


def require_api_token(request: Request) -> None:
    """Public routes: a known account (a bearer token, or the console's session cookie) when
    ORCH_API_TOKEN or ORCH_OPERATORS is set; a viewer only reads. The account goes on
    `request.state.operator`."""
    settings = _settings(request)
    operator = _caller(
        request.scope.get("headers", ()),
        _accounts(request),
        settings.api_token,
        method=request.method,
        cookie=cookie_name(request.scope),
        console_secret=settings.console_secret,
        revoked=revoked_sessions(request),
    )
    if isinstance(operator, Unauthorized):
        raise operator
    refusal = _role_refusal(operator, request.method)
    if refusal:
        raise Forbidden(refusal)
    request.state.operator = operator


def still_admitted(request: Request) -> bool:
    """Whether the credentials a request came with still name an account, asked again while
    an open stream runs: one opened before its account was taken out of ORCH_OPERATORS, its
    token changed, or its console cookie ran out or was signed out, ends there rather than
    run on for days.
    A stream is a read, so every role may go on; an operators file that no longer reads
    ends it too (fail closed, as a new request would be refused)."""
    settings = _settings(request)
    try:
        accounts = _accounts(request)
    except OperatorsUnreadable:
        return False
    operator = _identify(
        request.scope.get("headers", ()),
        accounts,
        settings.api_token,
        method="GET",
        cookie=cookie_name(request.scope),
        console_secret=settings.console_secret,
        revoked=revoked_sessions(request),
    )
    return operator is not None


def revoked_sessions(request: Request) -> Revoked | None:
    """The app's check of signed-out console sessions (`orchestrator.api.signouts`)."""
    signouts = getattr(request.app.state, "signouts", None)
    return signouts.revoked if signouts is not None else None


def current_operator(request: Request) -> Operator:
    """The account of the request (after `require_api_token`)."""
    operator: Operator | None = getattr(request.state, "operator", None)
    if operator is None:
        require_api_token(request)
        operator = request.state.operator
    return operator


def caller_of(operator: Operator) -> str | None:
    """Whose sessions the caller may use: a named account its own, a shared one anyone's
    (None: the full-rights API token speaks for others, as its body `by` does)."""
    return None if operator.shared else operator.name


def require_role(role: str) -> Callable[[Request], Operator]:
    """A route dependency: the caller's account, refused with 403 `forbidden` below `role`."""

    def dependency(request: Request) -> Operator:
        operator = current_operator(request)
        if not may(operator, role):
            raise Forbidden(f"account {operator.name} ({operator.role}) cannot do this: {role}s do")
        return operator

    return dependency


def require_internal_token(request: Request) -> None:
    """The internal tool bridge: always needs AGENT_INTERNAL_TOKEN; unset means closed."""
    expected = _settings(request).agent_internal_token
    if not expected:
        raise Unauthorized(_CLOSED)
    _check_bearer(request, expected)


class BearerTokens:
    """Token check on the path prefix, ahead of routing and body parsing.

    Under `internal_prefix` AGENT_INTERNAL_TOKEN is always required (unset closes the bridge);
    everywhere else, `/openapi.json` and `/docs` included, ORCH_API_TOKEN or an operator's
    token when either is set, or the console's session cookie of such an account. `open_paths`
    (the health check) and paths under `open_prefixes` (the console's pages, which do their own
    sign-in) need no token.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        settings: Settings,
        internal_prefix: str,
        open_paths: Collection[str] = (),
        accounts: AccountSource = (),
        open_prefixes: Collection[str] = (),
        revoked: Revoked | None = None,
        failures: SignInLimit | None = None,
    ) -> None:
        self.app = app
        self.accounts = accounts
        self.revoked = revoked
        self.failures = failures
        self.api_token = settings.api_token or None
        self.console_secret = settings.console_secret
        self.internal_token = settings.agent_internal_token or None
        self.internal_prefix = internal_prefix.rstrip("/")
        self.open_paths = frozenset(open_paths)
        self.open_prefixes = tuple(prefix.rstrip("/") for prefix in open_prefixes)

    async def _refusal(self, scope: Scope) -> OrchestratorError | None:
        """Why the request is refused, or None when it may go on."""
        path: str = scope.get("path", "")
        root: str = scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root) :]
        internal = path == self.internal_prefix or path.startswith(self.internal_prefix + "/")
        if not internal and (
            path in self.open_paths
            or any(path == prefix or path.startswith(prefix + "/") for prefix in self.open_prefixes)
        ):
            return None
        headers = scope.get("headers", ())
        wrong: list[bool] = []
        refusal = self._decision(scope, headers, internal, partial(wrong.append, True))
        if self.failures is not None and _bearer(headers):
            # Whatever the token turned out to be: an address that guessed too often is refused
            # whatever it presents now, the right token included (a 200 would say it was right).
            address = client_address(scope.get("client"))
            try:
                await self.failures.attempt_async(address, wrong=bool(wrong))
            except TooManyFailures as exc:
                return exc
        return refusal

    def _decision(
        self,
        scope: Scope,
        headers: Iterable[tuple[bytes, bytes]],
        internal: bool,
        wrong: Callable[[], None],
    ) -> OrchestratorError | None:
        """What the request's credentials allow, before the limit on wrong tokens; `wrong` is
        called when a bearer token names no one."""
        if not internal:
            try:
                accounts = current_accounts(self.accounts)
            except OperatorsUnreadable as exc:
                return exc
            operator = _caller(
                headers,
                accounts,
                self.api_token,
                method=scope.get("method", "GET"),
                cookie=cookie_name(scope),
                console_secret=self.console_secret,
                revoked=self.revoked,
                wrong_token=wrong,
            )
            if isinstance(operator, Unauthorized):
                return operator
            refusal = _role_refusal(operator, scope.get("method", "GET"))
            return Forbidden(refusal) if refusal else None
        if self.internal_token is None:
            return Unauthorized(_CLOSED)
        if bearer_matches(_authorization(headers), self.internal_token):
            return None
        wrong()
        return Unauthorized(_WRONG)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        refusal = await self._refusal(scope)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        headers = {"WWW-Authenticate": "Bearer"} if isinstance(refusal, Unauthorized) else {}
        if isinstance(refusal, TooManyFailures):
            headers = {"Retry-After": str(refusal.retry_after)}
        response = JSONResponse(refusal.to_dict(), status_code=refusal.http_status, headers=headers)
        await response(scope, receive, send)
