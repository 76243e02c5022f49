"""The ingress's HTTP plumbing, apart from the deployment (``ingress.py``): the FastAPI app
and the pure-ASGI layers around it -- metrics (outermost), JSON errors, the bearer-token
check and the live streams' WebSocket route (``streams_route.py``); ``FerryApp``, which
takes ``POST /v1/models/{model}/classify`` (nearly all the traffic) through those layers
only, straight to the replica's handler -- and the request parsers that need no replica
state (multipart, deadline, priority).

(No ``from __future__ import annotations`` here: FastAPI must see real annotation objects.)
"""

import email.parser
import email.policy
import re
import time
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from pipeline.config import Settings
from pipeline.errors import FerryError, InvalidInput, Unavailable
from pipeline.protocol.validate import finite_float
from pipeline.threads import name_os_thread

from . import docs, http_errors, streams_route
from .http_errors import error_response, request_id_of, unwrap
from .observe import RequestMetrics, ingress_of, request_id_from

CLASSIFY_PATH = re.compile(r"^/v1/models/([^/]+)/classify$")
INFER_PATH = re.compile(r"^/v2/models/([^/]+)(?:/versions/([^/]+))?/infer$")
TASK_PATH = re.compile(r"^/v1/models/([^/]+)/(image|segment|detect)$")


async def _classify(ingress: Any, match: Any, request: Request) -> Response:
    return await ingress.classify_request(
        match.group(1), request, request.query_params.get("top_k")
    )


async def _infer(ingress: Any, match: Any, request: Request) -> Response:
    model, version = match.group(1), match.group(2)
    if version is not None:
        return await ingress.version_infer(model, version, request)
    return await ingress.infer(model, request)


async def _task(ingress: Any, match: Any, request: Request) -> Response:
    return await ingress.task_request(match.group(1), request, match.group(2))


FAST_ROUTES = ((CLASSIFY_PATH, _classify), (INFER_PATH, _infer), (TASK_PATH, _task))
"""The routes ``FerryApp`` takes past FastAPI (all ``POST``): v1 classify, nearly all of
Ferry's own traffic, v2 infer (with or without a version), all of a Triton client's, and
the other tasks' v1 routes (image, segment, detect): every request that runs a model."""


def fast_route(scope: dict) -> tuple[Any, Any] | None:
    """(the path's match, its handler) where ``scope`` is a POST of ``FAST_ROUTES``."""
    if scope["type"] != "http" or scope["method"] != "POST":
        return None
    path = scope["path"]
    for pattern, handler in FAST_ROUTES:
        m = pattern.match(path)
        if m:
            return m, handler
    return None


class FerryApp(FastAPI):
    """FastAPI whose ``__call__`` takes the requests that run a model (``FAST_ROUTES``: ``POST
    /v1/models/{model}/classify``, ``/image``, ``/segment``, ``/detect`` and ``POST
    /v2/models/{model}[/versions/{version}]/infer``) -- nearly all the traffic -- through
    Ferry's own layers only (metrics, JSON errors, the token check: the same classes as in
    the stack, ``fast``) to the replica's handler, past Starlette's and FastAPI's middleware
    (server errors, exception telemetry, the body limit: Ferry bounds a body itself,
    ``uploads.py``) and the router. Every other request, and every request before the
    replica has put itself in ``state``, takes the whole stack, where the routes of the same
    paths below serve it. A layer costs a call per ASGI message and per request: these paths
    had eleven, they have three."""

    fast: Any = None

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        found = fast_route(scope)
        if found and getattr(self.state, "ingress", None) is not None:
            scope["app"] = self  # as Starlette sets it: ingress_of reads it
            scope["fast_route"] = found
            if self.root_path:
                scope["root_path"] = self.root_path
            if self.fast is None:
                self.fast = RequestMetrics(http_errors.JsonErrors(BearerAuth(serve_fast)))
                name_os_thread("ferry-loop")  # the event loop's CPU apart from its process's
            await self.fast(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


async def serve_fast(scope: dict, receive: Any, send: Any) -> None:
    """A fast request straight to the replica's method (``FerryApp`` put the path's match and
    its handler in the scope, and the replica is in the scope's app): no router, no
    dependency solving; a Ferry error or a bug is its JSON answer."""
    match, handler = scope["fast_route"]
    request = Request(scope, receive)
    try:
        response = await handler(ingress_of(scope), match, request)
    except Exception as exc:
        response = error_response(unwrap(exc), request_id_of(request))
    await response(scope, receive, send)


app = FerryApp(
    title="Ferry",
    description="GPU inference at high concurrency on Ray Serve",
    version="0.1.0",
    docs_url=None,  # docs.install: Swagger UI from local files, not a CDN
    redoc_url=None,
)


@app.post("/v1/models/{model}/classify")
async def classify(model: str, request: Request, top_k: int | None = None) -> Response:
    """Classify one image (the raw body or a multipart file): top-k labels and scores.

    ``FerryApp`` serves this path ahead of the router; the route documents it, and answers
    503 for a request that comes before the replica is in the app's state. It is the app's
    first route, so that Serve's route lookup, made for every request, stops at it."""
    return await _replica(request).classify_request(model, request, top_k)


@app.post("/v2/models/{model}/infer")
async def infer(model: str, request: Request) -> Response:
    """Open Inference Protocol (KServe v2 / Triton) inference: JSON tensors, or the binary
    tensor extension (``Inference-Header-Content-Length``), as ``tritonclient.http`` sends.

    Served ahead of the router by ``FerryApp``, as classify is, and declared right after it
    so that Serve's per-request route lookup finds it second."""
    return await _replica(request).infer(model, request)


@app.post("/v2/models/{model}/versions/{version}/infer")
async def version_infer(model: str, version: str, request: Request) -> Response:
    """v2 inference of a model's version (each model has version "1")."""
    return await _replica(request).version_infer(model, version, request)


@app.post("/v1/models/{model}/image")
async def image(model: str, request: Request) -> Response:
    """An image in, the model's image out: ``Accept`` (image/jpeg, image/png, image/webp;
    default the input's format), ``quality``, ``size=input|model``."""
    return await _replica(request).task_request(model, request, "image")


@app.post("/v1/models/{model}/segment")
async def segment(model: str, request: Request) -> Response:
    """An image in, its class mask out: a PNG, one byte a pixel at the input's size, or
    ``format=json``: each class's pixels."""
    return await _replica(request).task_request(model, request, "segment")


@app.post("/v1/models/{model}/detect")
async def detect(model: str, request: Request) -> Response:
    """An image in, boxes out (JSON, in the input's pixels): ``score_threshold``,
    ``iou_threshold``, ``max_boxes``."""
    return await _replica(request).task_request(model, request, "detect")


def _replica(request: Request) -> Any:
    """The ingress replica serving ``request``; 503 before it is in the app's state."""
    ingress = ingress_of(request.scope)
    if ingress is None:
        raise Unavailable("the ingress replica is starting")
    return ingress


docs.install(app)
PUBLIC_PATHS = ("/v2/health/",)


class BearerAuth:
    """Pure ASGI middleware: every route but /v2/health/* needs ``Authorization: Bearer``,
    WebSocket streams too (refused at their handshake: HTTP 401 where the server speaks
    ASGI's ``websocket.http.response`` extension, else 403).

    The token is read from the replica's environment at its first request -- not at
    import: Serve pickles this app in the driver, where the variable may not be set.
    (Starlette's ``BaseHTTPMiddleware`` costs a task and a stream per request; at thousands
    of requests a second a plain ASGI callable is the cheap way.)
    """

    _UNREAD = object()

    def __init__(self, app: Any) -> None:
        self.app = app
        self.expected: Any = self._UNREAD

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if self.expected is self._UNREAD:
            token = Settings.from_env().auth_token
            self.expected = f"Bearer {token}".encode() if token else None
        if (
            self.expected is None
            or scope["type"] not in ("http", "websocket")
            or scope["path"].startswith(PUBLIC_PATHS)
        ):
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        if headers.get(b"authorization") == self.expected:
            await self.app(scope, receive, send)
            return
        rid = request_id_from(scope.get("headers") or [])
        if scope["type"] == "websocket":
            await _refuse_handshake(scope, receive, send, rid)
            return
        resp = JSONResponse(
            {"error": "missing or wrong bearer token", "request_id": rid},
            status_code=401,
            headers={"www-authenticate": "Bearer"},
        )
        await resp(scope, receive, send)


async def _refuse_handshake(scope: dict, receive: Any, send: Any, rid: str) -> None:
    """A WebSocket handshake without the token: 401 with the JSON error where the server
    can answer a handshake with a response, else the plain refusal (403)."""
    await receive()  # websocket.connect
    if "websocket.http.response" not in (scope.get("extensions") or {}):
        await send({"type": "websocket.close", "code": 1008})
        return
    body = orjson.dumps({"error": "missing or wrong bearer token", "request_id": rid})
    await send(
        {
            "type": "websocket.http.response.start",
            "status": 401,
            "headers": [
                (b"content-type", b"application/json"),
                (b"www-authenticate", b"Bearer"),
            ],
        }
    )
    await send({"type": "websocket.http.response.body", "body": body})


class JsonAnswer(Response):
    """An answer as JSON encoded by orjson: the same keys and values as Starlette's
    ``JSONResponse`` (compact, UTF-8), about 30x less CPU for a classify answer (a float's
    shortest form may be spelled differently, ``2.8e-05`` as ``0.000028``: the same number).
    Numpy scalars are numbers, as a float64 was for ``JSONResponse``; a NaN or infinity
    becomes ``null``, where ``JSONResponse`` failed the request."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY)


streams_route.install(app)  # the WebSocket route, inside the auth check
app.add_middleware(BearerAuth)
http_errors.install(app)  # JsonErrors: outside auth
app.add_middleware(RequestMetrics)  # outermost: every answer is counted, JSON 500s and 401s too


def multipart_image(body: bytes, content_type: str) -> tuple[bytes, str | None]:
    """The first file part of a multipart/form-data body (stdlib parser, no extra package);
    400 for whatever the parser cannot make sense of."""
    try:
        msg = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
            b"Content-Type: " + content_type.encode("latin-1", "replace") + b"\r\n\r\n" + body
        )
        if not msg.is_multipart():
            raise InvalidInput("malformed multipart body")
        for part in msg.iter_parts():
            if part.get_filename() is not None or part.get_param(
                "name", header="content-disposition"
            ) in ("file", "image"):
                payload = part.get_payload(decode=True) or b""
                if not isinstance(payload, bytes):
                    raise InvalidInput("malformed multipart file part")
                return payload, part.get_content_type()
    except FerryError:
        raise
    except Exception as exc:  # the stdlib parser's own failures on malformed input
        raise InvalidInput("malformed multipart body", detail=f"{type(exc).__name__}") from None
    raise InvalidInput("multipart body has no file part (name it 'file' or 'image')")


def deadline_of(request: Request, default_ms: float | None) -> float | None:
    raw = request.headers.get("x-deadline-ms") or request.query_params.get("deadline_ms")
    return deadline_in(raw, default_ms)


def deadline_in(raw: str | None, default_ms: float | None) -> float | None:
    """The deadline (epoch s) of an ``X-Deadline-Ms`` value (HTTP's header or query, gRPC's
    metadata), else ``default_ms`` from now (None: none)."""
    if raw is None:
        return None if default_ms is None else time.time() + default_ms / 1e3
    ms = finite_float(raw, "X-Deadline-Ms", 0.0, 3_600_000.0)
    return time.time() + ms / 1e3


def priority_of(request: Request) -> bool:
    return (
        request.headers.get("x-priority") or request.query_params.get("priority") or ""
    ).lower() == "high"
