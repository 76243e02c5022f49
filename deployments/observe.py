"""What the ingress tells Prometheus about each HTTP request, as one pure-ASGI middleware.

``RequestMetrics`` sits outside every other layer of the ingress app (auth, the classify
fast path, FastAPI), so every answer is counted -- successes, 401s, 404s and errors alike --
in ``ferry_requests_total{model, route, code}``, and every 2xx answer of a model's infer or
classify route observes ``ferry_stage_latency_ms{stage="total"}``: from the request reaching
this replica to its response headers leaving (v1 and v2 alike). A client that closed the
connection before its answer -- Serve's proxy cancels the request, or the app reads
``http.disconnect`` -- is counted as ``code="499"`` (nginx's and Triton's code for it),
never as a 500: no one received an error, and 500 stays what a bug answers. It also fixes
the request's id (the client's ``X-Request-ID``, else one made here) in the ASGI scope's
state, where ``ingress.request_id_of`` finds it, so body, header, metrics and logs name the
same id.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from typing import Any

from pipeline import metrics

_MODEL_ROUTE = re.compile(
    r"^/v(?P<v>[12])/models/(?P<model>[^/]+)(?P<version>/versions/[^/]+)?(?P<rest>/[a-z_]+)?$"
)
_STATIC = {
    "/v1/models",
    "/v2",
    "/v2/health/live",
    "/v2/health/ready",
    "/v2/models/stats",
    "/v2/repository/index",
    "/docs",
    "/openapi.json",
}
TIMED = ("/classify", "/infer", "/image", "/segment", "/detect")
CLIENT_CLOSED = 499  # the client went away before the answer (nginx, Triton)


def ingress_of(scope: dict) -> Any:
    """The Ingress replica serving this request: Starlette puts the app in the scope, and
    the replica puts itself in the app's state (``Ingress.__serve_build_asgi_app__``);
    None before that (an app outside a replica)."""
    app = scope.get("app")
    return getattr(getattr(app, "state", None), "ingress", None)


def route_of(path: str) -> tuple[str, str]:
    """(model, route template) of a request path; the template keeps label values few:
    ``("digits", "/v2/models/{model}/infer")``, ``("", "/v2/health/ready")``, ``("", "other")``."""
    m = None if path in _STATIC else _MODEL_ROUTE.match(path)
    if m:
        version = "/versions/{version}" if m.group("version") else ""
        return m.group(
            "model"
        ), f"/v{m.group('v')}/models/{{model}}{version}{m.group('rest') or ''}"
    if path in _STATIC or path.startswith("/docs/"):
        return "", path if not path.startswith("/docs/") else "/docs/{asset}"
    return "", "other"


def request_id_from(headers: list[tuple[bytes, bytes]]) -> str:
    """The client's ``X-Request-ID`` (printable, at most 128 characters), else a new one: the
    one rule of request ids (``http_errors.request_id_of``, the JSON 500 and 401 answers)."""
    for k, v in headers:
        if k == b"x-request-id":
            given = v.decode("latin-1")[:128]
            if given and given.isprintable():
                return given
            break
    return uuid.uuid4().hex


class RequestMetrics:
    """Pure ASGI (no task or stream per request, unlike Starlette's BaseHTTPMiddleware)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        # path -> (model, route, timed) of a served model's paths, worked out once each
        self._routes: dict[str, tuple[str, str, bool]] = {}

    def _labels(self, scope: dict) -> tuple[str, str, bool]:
        """(model, route template, whether its latency is observed) of a request's path;
        a model this ingress does not serve is ``?`` (any path is not a series)."""
        path = scope["path"]
        known = self._routes.get(path)
        if known is not None:
            return known
        model, route = route_of(path)
        if model:
            active = ingress_of(scope)
            if active is not None:
                if model in active.models or model in active.encoded_views:
                    if len(self._routes) < 4096:  # (a served model's paths: few)
                        self._routes[path] = model, route, route.endswith(TIMED)
                else:
                    model = "?"
        return model, route, bool(model) and route.endswith(TIMED)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        state = scope.setdefault("state", {})
        if "request_id" not in state:
            state["request_id"] = request_id_from(scope.get("headers") or [])
        model, route, timed = self._labels(scope)
        status = [500]  # what a request that ends with no answer and no reason counts as
        started = [False]
        gone = [False]  # the client went away before the answer started

        async def receive_watched() -> dict:
            try:
                message = await receive()
            except BaseException:  # the client's stream broke: Serve cancelled the request
                gone[0] = True  # (a layer inside may answer it anyway, to no one)
                raise
            if message.get("type") == "http.disconnect":
                gone[0] = True
            return message

        async def send_counted(message: dict) -> None:
            if message["type"] == "http.response.start":
                started[0] = True
                status[0] = CLIENT_CLOSED if gone[0] else message["status"]
                if timed and 200 <= status[0] < 300:
                    metrics.observe_stage("total", model, (time.perf_counter() - t0) * 1e3)
            await send(message)

        try:
            await self.app(scope, receive_watched, send_counted)
        except asyncio.CancelledError:  # Serve's proxy cancels a request whose client left
            gone[0] = True
            raise
        finally:
            task = asyncio.current_task()
            if task is not None and task.cancelling():  # cancelled, whatever was raised
                gone[0] = True
            if gone[0] and not started[0]:
                status[0] = CLIENT_CLOSED
            metrics.count_request(model, route, status[0])
            if timed and model != "?" and status[0] >= 400:
                ingress = ingress_of(scope)
                if ingress is not None:
                    ingress.book.record(model, False, (time.perf_counter() - t0) * 1e3, None, 0)
