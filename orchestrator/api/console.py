"""The operator console at `/console`: static files from the package and the browser sign-in.

The pages are plain HTML, CSS and JavaScript shipped in `orchestrator/console/` (nothing to
build, no CDN). With ORCH_API_TOKEN or ORCH_OPERATORS set, `/console` without a session answers
the sign-in form; the form's POST or `/console?token=...` trades the token (the API token or an
operator's) for the session cookie of `console_session`, which names that account, and
redirects to `/console` without it (a link a page of another site led to asks "Sign in as
NAME?" first, at a URL holding a 5-minute ticket instead of the token: `_confirm_page`). The
token is never written into a page, never stays in the address bar, and `redact_access_log`
keeps it (and a ticket) out of uvicorn's access log. `GET /console/session` tells the
page who is signed in and with which role, so it can hide what the role cannot do (the API
still refuses it).
"""

from __future__ import annotations

import html
import logging
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote_plus, urlencode

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from orchestrator.api import console_session
from orchestrator.api.auth import ANONYMOUS, current_accounts, revoked_sessions
from orchestrator.api.etags import IF_NONE_MATCH, not_modified
from orchestrator.api.sign_in_limit import SignInLimit, TooManyFailures, client_address
from orchestrator.operators import Account, Operator, find_account

__all__ = ["PREFIX", "redact_access_log", "router"]

PREFIX = "/console"
STATIC = Path(__file__).resolve().parent.parent / "console"
#: The console's script is ES modules (`app.js` imports the others, from 'self' as the CSP
#: allows): each is named here, so that no other file of the folder is ever served.
_MODULES = (
    "account.js",
    "api.js",
    "app.js",
    "approvals.js",
    "clock.js",
    "deliveries.js",
    "graph.js",
    "liveness.js",
    "records.js",
    "task.js",
    "task_plan.js",
    "tasks.js",
    "text.js",
    "views.js",
    "widgets.js",
)
_ASSETS = {
    **dict.fromkeys(_MODULES, "text/javascript"),
    "signin.js": "text/javascript",
    "style.css": "text/css",
}
_MAX_FORM_BYTES = 8192
#: Scripts and styles from our own origin only: even a slip into innerHTML could not run code.
_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
        "frame-ancestors 'none'"
    ),
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
}

router = APIRouter(prefix=PREFIX, include_in_schema=False)


def _accounts(request: Request) -> tuple[Account, ...]:
    """The accounts one may sign in as; empty when the API is open (no token configured)."""
    operators = current_accounts(getattr(request.app.state, "operators", ()))
    return console_session.sign_in_accounts(request.app.state.settings.api_token, operators)


def _signed_in_as(request: Request) -> Operator | None:
    """Who this browser is signed in as: ANONYMOUS on an open API, None when not signed in."""
    accounts = _accounts(request)
    if not accounts:
        return ANONYMOUS  # no token configured: the API is open, so is the console
    value = console_session.cookie_from_headers(
        request.scope.get("headers", ()), console_session.cookie_name(request.scope)
    )
    if value is None:
        return None
    return console_session.holder(
        value,
        accounts,
        secret=request.app.state.settings.console_secret,
        revoked=revoked_sessions(request),
    )


def _sign_in_page(request: Request, error: str = "", status: int = 200) -> HTMLResponse:
    page = (STATIC / "signin.html").read_text(encoding="utf-8")
    # Absolute links: the form's answer may be shown at /console/session.
    root = html.escape(str(request.scope.get("root_path", "")).rstrip("/"))
    page = page.replace('href="console/', f'href="{root}{PREFIX}/')
    page = page.replace('action="console/', f'action="{root}{PREFIX}/')
    page = page.replace('src="console/', f'src="{root}{PREFIX}/')
    message = f'<p class="error" role="alert">{html.escape(error)}</p>' if error else ""
    return HTMLResponse(page.replace("<!--error-->", message), status, headers=_HEADERS)


#: The query parameter a refused `?token=` link is redirected with, to say why on the form.
REFUSED = "sign_in_refused"
#: The query parameter a `?token=` link opened from another site is redirected with: the
#: confirming page's ticket (`console_session.ticket`, 5 minutes), so that the token does not
#: stay in the address bar and the tab's history while the page asks.
CONFIRM = "sign_in_ticket"


def _refused_page(request: Request, why: str) -> HTMLResponse:
    """The sign-in form after a refused `?token=` link, with the status the link had: `wait`,
    too many wrong tokens from the address (while that lasts), else the token."""
    failures: SignInLimit = request.app.state.sign_in_failures
    try:
        if why == "wait":
            failures.attempt(client_address(request.scope.get("client")), wrong=False)
    except TooManyFailures as exc:
        page = _sign_in_page(request, exc.message[:1].upper() + exc.message[1:] + ".", 429)
        page.headers["Retry-After"] = str(exc.retry_after)
        return page
    return _sign_in_page(request, "That token is not accepted.", 401)


def _home(request: Request, query: list[tuple[str, str]] | None = None) -> str:
    """The console's own URL (under the app's root path), with `query` if any."""
    root = str(request.scope.get("root_path", "")).rstrip("/")
    return root + PREFIX + (f"?{urlencode(query)}" if query else "")


def _start_session(
    request: Request, presented: str, query: list[tuple[str, str]], *, confirm: bool = False
) -> Response:
    """Signs the browser in as the account whose token is `presented`; with `confirm` (a link
    opened from another site) asks first, on a page of ours. May wait on Redis (the limit on
    wrong tokens): not on the event loop."""
    presented_bytes = presented.encode("utf-8", "surrogateescape")
    # An empty token signs no one in (an account whose hash is the empty string's would
    # otherwise open to anyone who leaves the field blank): see auth._identify.
    if not presented.strip():
        return _sign_in_page(request, "That token is not accepted.", 401)
    failures: SignInLimit = request.app.state.sign_in_failures
    account = find_account(presented_bytes, _accounts(request))
    try:
        # Refused past the limit whatever the token is, the right one too: see sign_in_limit.
        failures.attempt(client_address(request.scope.get("client")), wrong=account is None)
    except TooManyFailures as exc:
        page = _sign_in_page(request, exc.message[:1].upper() + exc.message[1:] + ".", 429)
        page.headers["Retry-After"] = str(exc.retry_after)
        return page
    if account is None:
        return _sign_in_page(request, "That token is not accepted.", 401)
    if confirm:
        secret = request.app.state.settings.console_secret
        ticket = console_session.ticket(account, secret=secret)
        return RedirectResponse(_home(request, [*query, (CONFIRM, ticket)]), 303, headers=_HEADERS)
    return _signed_in(request, account, query)


def _confirm_page(request: Request, ticket: str) -> HTMLResponse:
    """ "Sign in as NAME?": a `?token=` link another site's page led to could otherwise sign
    the person in as the link's account (login CSRF), their decisions then recorded under
    it. The form posts the short-lived ticket (`console_session.ticket`), never the token."""
    secret = request.app.state.settings.console_secret
    account = console_session.ticket_account(ticket, _accounts(request), secret=secret)
    if account is None:
        return _sign_in_page(request, _EXPIRED, 401)
    page = (STATIC / "confirm.html").read_text(encoding="utf-8")
    root = html.escape(str(request.scope.get("root_path", "")).rstrip("/"))
    page = page.replace('href="console/', f'href="{root}{PREFIX}/')
    page = page.replace('action="console/', f'action="{root}{PREFIX}/')
    page = page.replace('src="console/', f'src="{root}{PREFIX}/')
    page = page.replace('href="console"', f'href="{root}{PREFIX}"')
    page = page.replace("<!--name-->", html.escape(account.operator.name))
    page = page.replace("<!--role-->", html.escape(account.operator.role))
    page = page.replace("<!--ticket-->", html.escape(ticket))
    return HTMLResponse(page, headers=_HEADERS)


def _signed_in(request: Request, account: Account, query: list[tuple[str, str]]) -> Response:
    response = RedirectResponse(_home(request, query), status_code=303, headers=_HEADERS)
    # Over HTTPS `__Host-orch_console`: Secure, at `/`, no Domain, as a browser requires of
    # that name (see console_session); over plain HTTP `orch_console`, which it keeps.
    response.set_cookie(
        console_session.cookie_name(request.scope),
        console_session.issue(account, secret=request.app.state.settings.console_secret),
        max_age=console_session.SESSION_SECONDS,
        path="/",
        httponly=True,
        samesite="strict",
        secure=console_session.over_https(request.scope),
    )
    return response


#: A ticket past its 5 minutes, or of a token changed since.
_EXPIRED = "That sign-in link has expired; sign in here."

#: `Sec-Fetch-Site` values of a form the console may have sent: its own page's, a person's own
#: navigation's; programs send none.
_OWN_FORMS = frozenset({"", "same-origin", "none"})


def _from_another_site(request: Request) -> bool:
    """Whether a browser sent this form from a page that is not the console's (`Sec-Fetch-Site`,
    which pages cannot set): a sign-in form posted there would sign the person in as that
    page's account (login CSRF), and their decisions would be recorded under its name. Another
    host of the same site (`same-site`: wiki.example.com beside orch.example.com) is refused
    as well as another site: the console's own form is `same-origin`."""
    return request.headers.get("sec-fetch-site", "").strip().lower() not in _OWN_FORMS


@router.get("")
def console_page(request: Request) -> Response:
    """The console, the sign-in form, or (with `?token=`) a signed-in redirect without it."""
    query = parse_qsl(request.url.query, keep_blank_values=True)
    presented = _last(query, "token")
    rest = [(key, value) for key, value in query if key not in ("token", REFUSED, CONFIRM)]
    if presented is not None and _accounts(request):
        answer = _start_session(request, presented, rest, confirm=_from_another_site(request))
        if answer.status_code in (401, 429):
            # Refused (a typo, a revoked token, too many): the sign-in page, at a URL without
            # the token, so that it does not stay in the address bar and the history.
            why = "wait" if answer.status_code == 429 else "token"
            return RedirectResponse(_home(request, [*rest, (REFUSED, why)]), 303, headers=_HEADERS)
        return answer
    if presented is not None:  # an open API: nothing to sign in to, but drop the token from the URL
        return RedirectResponse(_home(request, rest), 303)
    ticket = _last(query, CONFIRM)
    if ticket is not None and _accounts(request):
        return _confirm_page(request, ticket)  # asks; only its form's POST signs in
    if _signed_in_as(request) is None:
        reason = _last(query, REFUSED)
        return _refused_page(request, reason) if reason is not None else _sign_in_page(request)
    return FileResponse(STATIC / "index.html", media_type="text/html", headers=_HEADERS)


def _last(query: list[tuple[str, str]], key: str) -> str | None:
    """The last value of `key` in the query (empty if given empty), or None when absent."""
    values = [value for name, value in query if name == key]
    return values[-1] if values else None


@router.get("/")
def console_slash(request: Request) -> Response:
    return RedirectResponse(_home(request), status_code=308)


@router.post("/session")
async def sign_in(request: Request) -> Response:
    """The sign-in form's POST (`token=...`, form-encoded)."""
    if not _accounts(request):  # an open API: nothing to sign in to, as with `?token=`
        return RedirectResponse(_home(request), 303, headers=_HEADERS)
    if _from_another_site(request):
        return _sign_in_page(request, "A sign-in sent from another site is refused.", 403)
    size = request.headers.get("content-length", "")
    if size.isdigit() and int(size) > _MAX_FORM_BYTES:
        return _sign_in_page(request, "The form is too large.", 413)
    # Read up to the bound whatever the length says (a chunked form has none): no more is kept.
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > _MAX_FORM_BYTES:
            return _sign_in_page(request, "The form is too large.", 413)
    form = dict(parse_qsl(raw.decode("utf-8", "replace"), keep_blank_values=True))
    if "ticket" in form:  # the confirming page of a link opened from another site
        secret = request.app.state.settings.console_secret
        account = console_session.ticket_account(form["ticket"], _accounts(request), secret=secret)
        if account is None:
            return _sign_in_page(request, _EXPIRED, 401)
        return _signed_in(request, account, [])
    return await run_in_threadpool(_start_session, request, form.get("token", "").strip(), [])


@router.get("/session")
def session_state(request: Request) -> JSONResponse:
    """Whether this browser is signed in, as whom, and whether signing in is needed at all.

    `account.shared` is true for the API token's account (and an open API): a decision's `by`
    then comes from the form; for an operator account it is the account's name."""
    operator = _signed_in_as(request)
    body: dict[str, Any] = {
        "signed_in": operator is not None,
        "required": bool(_accounts(request)),
        "account": None
        if operator is None
        else {"name": operator.name, "role": operator.role, "shared": operator.shared},
    }
    return JSONResponse(body, headers={"Cache-Control": "no-store"})


@router.post("/signout")
def sign_out(request: Request) -> Response:
    """Clears the cookie, and records its session as signed out so that a copy of it is refused
    too (by every API process: `orchestrator.api.signouts`). A store that cannot record it is
    a 503, the cookie kept: the person learns that signing out did not take, and tries again."""
    if _from_another_site(request):
        # SameSite keeps the cookie off such a request, but a forced sign-out is refused too.
        return _sign_in_page(request, "A sign-out sent from another site is refused.", 403)
    cookie = console_session.cookie_name(request.scope)
    value = console_session.cookie_from_headers(request.scope.get("headers", ()), cookie)
    accounts = _accounts(request)
    session = (
        console_session.signed_session(
            value, accounts, secret=request.app.state.settings.console_secret
        )
        if value is not None and accounts
        else None
    )
    if session is not None:
        request.app.state.signouts.sign_out(session)
    response = RedirectResponse(_home(request), status_code=303, headers=_HEADERS)
    # A browser refuses a `__Host-` cookie without Secure, the one that clears it included.
    response.delete_cookie(
        cookie,
        path="/",
        secure=cookie == console_session.HTTPS_COOKIE,
        httponly=True,
        samesite="strict",
    )
    return response


@router.get("/{asset}")
def console_asset(asset: str, if_none_match: str | None = IF_NONE_MATCH) -> Response:
    """A script or the style sheet, `no-cache`: the browser asks again at every load, and one
    it holds unchanged (its `ETag`, from the file's size and time) is answered `304` with no
    body. Fourteen modules were sent whole at every load (`FileResponse` answers no
    conditional request)."""
    media_type = _ASSETS.get(asset)
    if media_type is None:
        return JSONResponse(
            {"error": {"code": "not_found", "message": "Not Found", "details": []}}, 404
        )
    headers = {"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"}
    path = STATIC / asset
    response = FileResponse(path, media_type=media_type, headers=headers, stat_result=path.stat())
    unchanged = not_modified(if_none_match, response.headers["etag"])
    if unchanged is not None:
        unchanged.headers.update(headers)
        return unchanged
    return response


#: Query parameters whose values sign a browser in: never in an access line.
_SECRET_PARAMETERS = frozenset({"token", CONFIRM})


class _RedactToken(logging.Filter):
    """Drops the value of any `token=` (or confirming page's ticket) query parameter from
    uvicorn's access lines, however its name is percent-encoded (the console decodes names,
    so `%74oken=` signs in too)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and any(isinstance(a, str) and "?" in a for a in args):
            record.args = tuple(_redact(a) if isinstance(a, str) else a for a in args)
        return True


def _redact(text: str) -> str:
    path, sep, query = text.partition("?")
    if not sep:
        return text
    # Decoded whole: `token%3D<token>` (an `=` a tool encoded) signs no one in, but is the
    # token all the same, and a person who sent it should not find it in the log.
    parts = []
    for part in query.split("&"):
        name = unquote_plus(part).split("=", 1)[0]
        parts.append(f"{name}=[redacted]" if name in _SECRET_PARAMETERS else part)
    return path + "?" + "&".join(parts)


def redact_access_log() -> None:
    """Install the filter on uvicorn's access logger (once per process)."""
    logger = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, _RedactToken) for f in logger.filters):
        logger.addFilter(_RedactToken())
