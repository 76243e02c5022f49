"""Ferry's error answers over HTTP: every error, whoever raises it -- Ferry, FastAPI's
router (404, 405), its request validation (422, answered as 400), or a bug (500) -- is JSON
``{"error", "type", "request_id", "detail"}`` with the right status. Building the answer
never fails, whatever the error's fields hold.
"""

import logging
import math
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from pipeline import metrics
from pipeline.errors import FerryError, InvalidInput, QueueFull, Unavailable

from .observe import request_id_from

logger = logging.getLogger("deployments.ingress")


def request_id_of(request: Request) -> str:
    """The request's id: Serve's proxy passes the client's X-Request-ID (or one it made up)
    to the replica and puts the same id on the response, so logs, body and header agree."""
    rid = getattr(request.state, "request_id", None)
    if rid is None:
        rid = request.state.request_id = request_id_from(request.scope.get("headers") or [])
    return rid


@dataclass(frozen=True)
class ErrorAnswer:
    """Ferry's answer to a failed request, before its transport: the HTTP status of the
    error's class (gRPC maps it to a status code: ``grpc_service``), the JSON body
    ``{"error", "type", "request_id", "detail"}``, the Retry-After of a 503 that a retry can
    help (seconds, as sent), and whether the connection closes (HTTP)."""

    status: int
    body: dict[str, Any]
    retry_after: str | None = None
    closes: bool = False


def error_answer(exc: BaseException, request_id: str) -> ErrorAnswer:
    """The answer to ``exc``: a ``FerryError``'s status, message and fields; anything else
    a 500 (a bug), logged with the request id the body carries; 408, 413, 503 and 504
    counted as rejections. Never fails: field values are made JSON-safe (NaN, deep lists,
    huge integers) first, and a failure to build it is the last resort's fixed 500."""
    try:
        return _error_answer(exc, request_id)
    except Exception:  # the last resort: a fixed body
        logger.exception("building the error answer of %s failed", request_id)
        return ErrorAnswer(500, {"error": "internal error", "request_id": request_id})


def error_response(exc: BaseException, request_id: str) -> JSONResponse:
    """Ferry's error answer over HTTP (``error_answer``) as a JSON response."""
    a = error_answer(exc, request_id)
    headers = {}
    if a.retry_after is not None:
        headers["retry-after"] = a.retry_after
    if a.closes:
        headers["connection"] = "close"
    try:
        return JSONResponse(a.body, status_code=a.status, headers=headers)
    except Exception:  # the last resort: a fixed body
        logger.exception("building the error response of %s failed", request_id)
        return JSONResponse({"error": "internal error", "request_id": request_id}, 500)


def _error_answer(exc: BaseException, request_id: str) -> ErrorAnswer:
    if isinstance(exc, FerryError):
        status = exc.http_status
        body: dict[str, Any] = {
            "error": exc.message or type(exc).__name__,
            "type": type(exc).__name__,
            "request_id": request_id,
        }
        if exc.fields:
            body["detail"] = exc.public_detail()
    else:
        status = 500
        body = {"error": "internal error", "request_id": request_id}
        logger.error("request %s failed: %s", request_id, exc, exc_info=exc)
    retry_after = None
    if status == 503 and getattr(exc, "retryable", True):  # a refused model's 503 is not
        retry = exc.retry_after_s if isinstance(exc, QueueFull | Unavailable) else 1.0
        retry_after = str(max(1, round(retry)) if math.isfinite(retry) else 1)
    if status in (408, 413, 503, 504):
        metrics.count_rejected(
            {408: "slow_client", 413: "too_large", 503: "overloaded", 504: "deadline"}[status]
        )
    return ErrorAnswer(status, body, retry_after, getattr(exc, "closes_connection", False))


def _scope_request_id(scope: dict) -> str:
    state = scope.get("state") or {}
    rid = state.get("request_id") if isinstance(state, dict) else None
    return rid or request_id_from(scope.get("headers") or [])


class JsonErrors:
    """Pure ASGI, outermost: whatever escapes the app (a bug: a 500) is answered with
    Ferry's error JSON carrying the request id, if no answer has started yet."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: dict) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:
            if started:
                raise
            await error_response(exc, _scope_request_id(scope))(scope, receive, send)


def install(app: FastAPI) -> None:
    """Ferry's handlers on ``app`` and ``JsonErrors`` as its outermost middleware (call it
    after the app's other middleware is added)."""
    app.add_exception_handler(FerryError, _ferry_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_middleware(JsonErrors)


async def _ferry_error(request: Request, exc: FerryError) -> JSONResponse:
    return error_response(exc, request_id_of(request))


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    # FastAPI's 422 is Ferry's 400: the fields it names, cut short
    errors = [
        {"loc": ".".join(str(p) for p in e.get("loc", ()))[:80], "msg": str(e.get("msg"))[:120]}
        for e in exc.errors()[:8]
    ]
    return error_response(
        InvalidInput("bad request parameters", errors=errors), request_id_of(request)
    )


class HttpError(FerryError):
    """The router's own refusals (no such route: 404, wrong method: 405), as Ferry errors."""

    def __init__(self, message: str = "", status: int = 400, **fields: Any) -> None:
        super().__init__(message, status=status, **fields)
        self.http_status = status


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    status = exc.status_code if 400 <= exc.status_code <= 599 else 500
    msg = {404: "no such route", 405: "method not allowed"}.get(status, str(exc.detail)[:200])
    resp = error_response(
        HttpError(msg, status, method=request.method, path=request.url.path[:200]),
        request_id_of(request),
    )
    if exc.headers:  # 405's Allow
        resp.headers.update(exc.headers)
    return resp


# Ray's errors for a replica that died or cannot be reached under a call: nothing of the
# request is kept, inference has no side effects, so the client may simply retry (503)
REPLICA_LOST = {
    "RayActorError",
    "ActorDiedError",
    "ActorUnavailableError",
    "DeploymentUnavailableError",
}


def _replica_lost(exc: BaseException | None) -> bool:
    """A Ray actor error, or one that Serve wrapped with it as the cause (an upstream
    replica that died under a chained call)."""
    for _ in range(4):
        if exc is None:
            return False
        if REPLICA_LOST & {c.__name__ for c in type(exc).__mro__}:
            return True
        exc = exc.__cause__
    return False


def unwrap(exc: BaseException) -> BaseException:
    """The FerryError inside a Ray task error; Serve's back-pressure refusal as QueueFull;
    a replica lost under the call as Unavailable (503: retry)."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException):
        exc = cause
    if type(exc).__name__ == "BackPressureError":
        return QueueFull("a pipeline stage is at its queue limit", retry_after_s=1.0)
    if _replica_lost(exc):
        return Unavailable(
            "a replica stopped under this request; retry", cause=type(exc).__name__, retry_after_s=1
        )
    return exc
