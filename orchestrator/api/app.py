"""The FastAPI application factory: services on the app state, routers, one error envelope.

Every error leaves as `{"error": {"code", "message", "details"}}`; invalid input is a 422, never
a 500, and an unexpected failure is a 500 envelope without a traceback.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request, Security
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response
from sqlalchemy.exc import DataError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from orchestrator import __version__
from orchestrator.api import (
    actions,
    auth,
    collaboration,
    human_steps,
    invocations,
    outbox,
    plans,
    sessions,
    stream,
    task_records,
    task_stream,
    tasks,
)
from orchestrator.api import console as console_pages
from orchestrator.api.body_limit import BodyLimit
from orchestrator.api.contract import (
    BEARER,
    COMMON_ERRORS,
    INTERNAL_BEARER,
    declare_write_refusals,
)
from orchestrator.api.open_guard import OpenGuard
from orchestrator.api.readiness import Readiness
from orchestrator.api.response_headers import ResponseHeaders
from orchestrator.api.sign_in_limit import FailedSignIns, SignInLimit
from orchestrator.api.signouts import SignOuts
from orchestrator.errors import OrchestratorError, Unauthorized
from orchestrator.events import CompositeNotifier, PlanHub, PlanNotifier, RedisNotifier
from orchestrator.metrics import CONTENT_TYPE_LATEST, render
from orchestrator.operators import OperatorsError
from orchestrator.operators_file import OperatorsFile
from orchestrator.services.plans import PlanService
from orchestrator.services.sessions import SessionService
from orchestrator.settings import Settings, SettingsError, load_settings
from orchestrator.store.db import Database

__all__ = ["INTERNAL_PREFIX", "INTERNAL_ROUTERS", "PUBLIC_ROUTERS", "create_app"]

log = logging.getLogger(__name__)

#: Routers behind ORCH_API_TOKEN (when set). Add a resource by appending its router here.
PUBLIC_ROUTERS: list[APIRouter] = [
    sessions.router,
    plans.router,
    stream.router,
    task_stream.router,
    tasks.router,
    actions.router,
    invocations.router,
    task_records.router,
    human_steps.router,
    collaboration.router,
    outbox.router,
]
#: Routers of the trusted tool bridge, mounted under INTERNAL_PREFIX behind AGENT_INTERNAL_TOKEN.
INTERNAL_ROUTERS: list[APIRouter] = [plans.internal_router]
INTERNAL_PREFIX = "/api/v1/internal"

_HEALTHZ = "/healthz"
_READYZ = "/readyz"
_BODY_PARSE_FAILED = "There was an error parsing the body"
_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 413: "too_large"}


def _envelope(
    status: int, code: str, message: str, details: list[Any] | None = None
) -> JSONResponse:
    body = {"error": {"code": code, "message": message, "details": details or []}}
    return JSONResponse(body, status_code=status)


async def _orchestrator_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, OrchestratorError)
    response = JSONResponse(exc.to_dict(), status_code=exc.http_status)
    if isinstance(exc, Unauthorized):
        response.headers["WWW-Authenticate"] = "Bearer"
    return response


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    details = []
    for error in exc.errors():
        kind = str(error.get("type", ""))
        code = "invalid_json" if kind == "json_invalid" else "invalid_request"
        where = ".".join(str(part) for part in error.get("loc", ()))
        # The input itself is never echoed: it may be large or hold secrets.
        # A validator's own words, not pydantic's kind of error before them ("Value error, ").
        message = str(error.get("msg", "")).removeprefix("Value error, ")
        details.append({"code": code, "message": message, "field": where})
    said_who = human_steps.missing_by(request, exc.body)
    if said_who is not None and not any(d["field"] == "body.by" for d in details):
        details.append(said_who)  # named with the rest, not on the next call
    if not details:
        details = [{"code": "invalid_request", "message": "the request is not valid"}]
    sent_as = _not_json(request)
    if sent_as and any(d.get("field") == "body" for d in details):
        # FastAPI does not parse a body of another type as JSON (`curl -d` sends a form), and
        # the error it leaves says the body is not an object, which misleads: say what to send.
        message = f"the body must be JSON sent with Content-Type: application/json, not {sent_as}"
        details = [{"code": "invalid_request", "message": message, "field": "body"}]
        return _envelope(422, "invalid_request", message, details)
    return _envelope(422, details[0]["code"], "the request is not valid", details)


def _not_json(request: Request) -> str | None:
    """The media type of a request body declared as something other than JSON, else None."""
    declared = request.headers.get("content-type", "")
    media = declared.split(";")[0].strip().lower()
    if not media or media == "application/json" or media.endswith("+json"):
        return None
    # A header, not the body, but still the client's text: printable and short.
    return "".join(c for c in media if c.isprintable())[:100]


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 400 and exc.detail == _BODY_PARSE_FAILED:
        # FastAPI's answer to a body it cannot decode (bad UTF-8, JSON nested too deep).
        detail = {"code": "invalid_json", "message": "the body is not valid JSON"}
        return _envelope(422, "invalid_json", "the request is not valid", [detail])
    code = _HTTP_CODES.get(exc.status_code, "http_error")
    return _envelope(exc.status_code, code, str(exc.detail))


async def _data_error(request: Request, exc: Exception) -> JSONResponse:
    # The store refused a value of the request (a NUL character for Postgres, say): bad input.
    detail = {"code": "invalid_request", "message": "a value of the request cannot be stored"}
    return _envelope(422, "invalid_request", "the request is not valid", [detail])


async def _store_unavailable(request: Request, exc: Exception) -> JSONResponse:
    # The store is down, refused the connection or the pool is exhausted: not the request's
    # fault and not a bug; one line in the log (no traceback per request), and a retry later.
    cause = getattr(exc, "orig", None) or exc
    first = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
    log.warning("store unavailable on %s %s: %s", request.method, request.url.path, first)
    response = _envelope(503, "store_unavailable", "the store is unavailable; try again later")
    response.headers["Retry-After"] = "5"
    return response


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.error("unexpected error on %s %s", request.method, request.url.path, exc_info=exc)
    return _envelope(500, "internal_error", "the server failed unexpectedly; see its log")


def _sign_in_limit(redis_url: str | None) -> SignInLimit:
    """The limit on wrong tokens: shared in Redis when it is configured (redis-py is imported
    then only), else this process's own."""
    if not redis_url:
        return FailedSignIns()
    from orchestrator.api.shared_sign_ins import SharedFailedSignIns

    return SharedFailedSignIns(redis_url)


def create_app(
    settings: Settings | None = None,
    *,
    db: Database | None = None,
    hub: PlanHub | None = None,
    keepalive_seconds: float | None = None,
    public_routers: Sequence[APIRouter] | None = None,
    internal_routers: Sequence[APIRouter] | None = None,
) -> FastAPI:
    """The API for `settings` (read from the environment when None); `keepalive_seconds`, when
    given, stands for ORCH_STREAM_KEEPALIVE_SECONDS."""
    settings = settings or load_settings()
    try:
        # Read again at each request when it changed: see orchestrator.operators_file.
        accounts = OperatorsFile(settings.operators) if settings.operators else ()
    except OperatorsError as exc:
        raise SettingsError(f"invalid setting ORCH_OPERATORS: {exc}") from None
    owns_db = db is None
    database = db or Database.from_url(
        settings.store_url, pool_size=settings.db_pool_size, max_overflow=settings.db_max_overflow
    )
    plan_hub = hub or PlanHub(settings.redis_url)
    redis_notifier = RedisNotifier(settings.redis_url) if settings.redis_url else None
    notifier: PlanNotifier = (
        CompositeNotifier([plan_hub, redis_notifier]) if redis_notifier else plan_hub
    )
    # A task event this process commits (a requeue, a decision) wakes its task streams here
    # at once, and those of other API processes through Redis.
    database.after_commit = notifier.wake_keys

    readiness = Readiness(database, settings.redis_url)
    signouts = SignOuts(database)
    # Wrong tokens per client address, the API's and the console sign-in's together: in Redis
    # for every API process when it is configured, else in this process's memory.
    failures = _sign_in_limit(settings.redis_url)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await plan_hub.start()
        await run_in_threadpool(signouts.start)  # its first read of the store, off the loop
        try:
            yield
        finally:
            signouts.stop()
            failures.close()
            await plan_hub.stop()
            readiness.close()
            if redis_notifier is not None:
                redis_notifier.close()
            if owns_db:
                database.dispose()

    # With ORCH_API_TOKEN set, /openapi.json needs the token like every public route, and the
    # browser pages are off: Swagger UI and ReDoc fetch the schema without a bearer header.
    pages = not settings.api_token and not settings.operators
    app = FastAPI(
        title="condition-orchestrator",
        version=__version__,
        lifespan=lifespan,
        docs_url="/docs" if pages else None,
        redoc_url="/redoc" if pages else None,
    )
    app.state.settings = settings
    app.state.operators = accounts
    app.state.db = database
    app.state.hub = plan_hub
    app.state.signouts = signouts
    app.state.sign_in_failures = failures
    app.state.plans = PlanService(database, notifier)
    app.state.sessions = SessionService(database)
    app.state.keepalive_seconds = (
        settings.stream_keepalive_seconds if keepalive_seconds is None else keepalive_seconds
    )

    app.add_exception_handler(OrchestratorError, _orchestrator_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(DataError, _data_error)
    app.add_exception_handler(OperationalError, _store_unavailable)
    app.add_exception_handler(PoolTimeout, _store_unavailable)
    app.add_exception_handler(Exception, _unexpected)

    # The tokens are checked ahead of routing and body parsing (a request without the right one
    # is a 401 whatever its body); the router dependencies check again, for defence in depth.
    # Outermost after the token check: a body over ORCH_MAX_BODY_BYTES is a 413, never read.
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(
        auth.BearerTokens,
        settings=settings,
        internal_prefix=INTERNAL_PREFIX,
        open_paths=(_HEALTHZ, _READYZ),
        accounts=accounts,
        open_prefixes=(console_pages.PREFIX,),
        revoked=signouts.revoked,
        failures=failures,
    )
    # Outside the token check, so a browser's preflight (no credentials) is answered.
    if settings.cors_origin_list:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origin_list,
            allow_credentials=True,
            allow_methods=["GET", "POST", "DELETE", "OPTIONS"],
            allow_headers=["Authorization", "Content-Type", "Last-Event-ID", "X-Orch-Console"],
            max_age=600,
        )
    if pages:
        # No token keeps other sites out of an open API: only loopback names and own-origin
        # writes (outermost: a rebound Host is refused before anything else looks at it).
        app.add_middleware(OpenGuard, cors_origins=settings.cors_origin_list)
    # Outermost: a refusal of the middlewares above carries them too.
    app.add_middleware(ResponseHeaders)
    app.include_router(console_pages.router)
    console_pages.redact_access_log()
    # Security(...) only declares the bearer schemes in the OpenAPI document.
    public = [Depends(auth.require_api_token), Security(BEARER)]
    for router in PUBLIC_ROUTERS if public_routers is None else public_routers:
        declare_write_refusals(router.routes)  # before the include, which copies the routes
        app.include_router(router, dependencies=public, responses=COMMON_ERRORS)
    internal = [Depends(auth.require_internal_token), Security(INTERNAL_BEARER)]
    for router in INTERNAL_ROUTERS if internal_routers is None else internal_routers:
        app.include_router(router, prefix=INTERNAL_PREFIX, dependencies=internal)

    @app.get("/metrics", include_in_schema=False, dependencies=[Depends(auth.require_api_token)])
    def metrics() -> Response:
        """Prometheus text format; behind ORCH_API_TOKEN like every public route."""
        return Response(render(database, settings.outbox_kinds), media_type=CONTENT_TYPE_LATEST)

    @app.get(_HEALTHZ, include_in_schema=False)
    def healthz() -> dict[str, str]:
        """Liveness: the process answers (whatever the store and Redis do)."""
        return {"status": "ok"}

    @app.get(_READYZ, include_in_schema=False, response_model=None)
    async def readyz() -> dict[str, Any] | JSONResponse:
        """Readiness: the store and Redis answer in time; else 503 naming what failed."""
        checks = await readiness.check()
        failed = [check for check in checks if check.code is not None]
        if not failed:
            return {"status": "ready", "checks": {check.part: "ok" for check in checks}}
        details = [{"code": c.code, "message": c.message, "field": c.part} for c in failed]
        names = ", ".join(check.part for check in failed)
        response = _envelope(503, "not_ready", f"not ready: {names}", details)
        response.headers["Retry-After"] = "5"
        return response

    return app
