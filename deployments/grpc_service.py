"""KServe v2 / Triton's ``inference.GRPCInferenceService``, a mixin of the ``Ingress``
deployment: Serve's gRPC proxy calls the ingress's method of each RPC's name
(``grpc_proxy.py`` adds the service to it), with the request message and the call's context.

Every method answers what the HTTP route of the same meaning answers, by calling it or the
core both call: metadata, configuration, statistics and the repository index are the HTTP
routes' own answers as protobuf (``grpc_codec.message``); ``ModelInfer`` is the v2 core
(``v2_core.V2Core``: the same coalescer, queue budget, deadline, priority and statistics).
Over gRPC, the request id is the ``x-request-id`` metadata (or Serve's ``request_id``), the
deadline is the call's own (``grpc_proxy.DEADLINE_KEY``) or ``x-deadline-ms``, priority is
``parameters.priority`` or ``x-priority: high``, and the token of ``FERRY_AUTH_TOKEN`` is
``authorization: Bearer <token>`` (``ServerLive`` and ``ServerReady`` need none, as
``/v2/health/*``). An error is a status code (``CODES``, from its HTTP status) whose details
are Ferry's JSON error, with ``retry-after`` trailing metadata where a retry can help.
``ModelStreamInfer``: ``grpc_stream.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from tritonclient.grpc import model_config_pb2
from tritonclient.grpc import service_pb2 as pb

from pipeline import metrics
from pipeline.config import Settings
from pipeline.errors import ModelNotFound, PayloadTooLarge
from pipeline.protocol import triton

from . import grpc_codec
from .grpc_proxy import DEADLINE_KEY, SERVICE
from .http_errors import HttpError, error_answer
from .ingress_http import deadline_in

logger = logging.getLogger(__name__)
CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    404: grpc.StatusCode.NOT_FOUND,
    408: grpc.StatusCode.DEADLINE_EXCEEDED,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,  # (gRPC's own answer to a message too large)
    415: grpc.StatusCode.INVALID_ARGUMENT,
    499: grpc.StatusCode.CANCELLED,
    501: grpc.StatusCode.UNIMPLEMENTED,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}
PUBLIC = ("ServerLive", "ServerReady")  # as /v2/health/*: no token
UNIMPLEMENTED = (
    "SystemSharedMemoryStatus",
    "SystemSharedMemoryRegister",
    "SystemSharedMemoryUnregister",
    "CudaSharedMemoryStatus",
    "CudaSharedMemoryRegister",
    "CudaSharedMemoryUnregister",
    "TraceSetting",
    "LogSettings",
)
_UNREAD = object()


class Call:
    """What one RPC carries besides its message: the metadata, the request id, and the
    context its answer's status goes on (None outside Serve)."""

    def __init__(self, method: str, context: Any) -> None:
        self.method = method
        self.context = context
        self.t0 = time.perf_counter()
        pairs = context.invocation_metadata() if context is not None else ()
        self.metadata = {str(k).lower(): v for k, v in pairs if isinstance(v, str)}
        given = (self.metadata.get("x-request-id") or self.metadata.get("request_id") or "")[:128]
        self.request_id = given if given and given.isprintable() else uuid.uuid4().hex

    @property
    def route(self) -> str:
        return f"/{SERVICE}/{self.method}"

    def deadline(self, default_ms: float | None) -> float | None:
        """The earliest of the call's own deadline and ``x-deadline-ms``; else the default."""
        given = [deadline_in(self.metadata.get("x-deadline-ms"), None)]
        with contextlib.suppress(KeyError, ValueError):
            given.append(float(self.metadata[DEADLINE_KEY]))
        given = [d for d in given if d is not None]
        return min(given) if given else deadline_in(None, default_ms)

    def one_of_stream(self, n: int) -> Call:
        """The ``n``-th request of this stream: its metadata, its own id (``<stream's>.n``)
        and start, no context (its answer is a message of the stream, not a status)."""
        one = Call(self.method, None)
        one.metadata, one.request_id = self.metadata, f"{self.request_id}.{n}"
        return one

    def answer_of(self, exc: BaseException) -> tuple[grpc.StatusCode, str, str | None]:
        """Ferry's answer to ``exc``: its gRPC code, its JSON error (the details), and the
        ``retry-after`` where a retry can help."""
        a = error_answer(exc, self.request_id)
        return CODES.get(a.status, grpc.StatusCode.INTERNAL), json.dumps(a.body), a.retry_after

    def fail(self, exc: BaseException) -> grpc.StatusCode:
        """Ferry's answer to ``exc`` on the context (``answer_of``; ``retry-after`` as
        trailing metadata); its code."""
        code, details, retry_after = self.answer_of(exc)
        if self.context is not None:
            self.context.set_code(code)
            self.context.set_details(details)
            trailing = [("x-request-id", self.request_id)]
            if retry_after is not None:
                trailing.append(("retry-after", retry_after))
            self.context.set_trailing_metadata(trailing)
        return code


class GrpcInference:
    """Needs of the class it is mixed into: what ``V2Core`` needs, and ``drain``,
    ``readiness``, ``stats``, ``models``, ``encoded_views``, ``_v2_model`` and the HTTP
    routes ``server_metadata``, ``model_metadata``, ``model_config``, ``all_model_stats``,
    ``model_stats`` and ``repository_index``."""

    def grpc_auth(self, call: Call) -> None:
        """401 (UNAUTHENTICATED) unless the call carries ``authorization: Bearer <token>``
        of ``FERRY_AUTH_TOKEN`` (read at the first call, in the replica, where the variable
        is set), or no token is set, or the method is public."""
        expected = self.__dict__.get("_grpc_bearer", _UNREAD)
        if expected is _UNREAD:
            got = Settings.from_env().auth_token
            expected = self.__dict__["_grpc_bearer"] = f"Bearer {got}" if got else None
        public = call.method in PUBLIC
        if expected and not public and call.metadata.get("authorization") != expected:
            raise HttpError("missing or wrong bearer token", 401)

    def _label(self, model: str) -> str:
        return model if model in self.models or model in self.encoded_views else "?"

    async def _unary(
        self, call: Call, model: str, answer: Callable[[], Awaitable[Any]], empty: type
    ) -> Any:
        """Run one RPC's ``answer``: the token checked, the drain started, the answer counted;
        an error answered as Ferry answers it (``Call.fail``) with an ``empty`` message."""
        self.drain.start()
        code = grpc.StatusCode.OK
        try:
            self.grpc_auth(call)
            return await answer()
        except asyncio.CancelledError:  # the client went away
            code = grpc.StatusCode.CANCELLED
            raise
        except Exception as exc:
            code = call.fail(exc)
            return empty()
        finally:
            metrics.count_request(
                self._label(model) if model else "", call.route, code.name, "grpc"
            )

    # ------------------------------------------------------------------ health and metadata
    async def ServerLive(self, request: Any, grpc_context: Any = None) -> Any:
        async def answer() -> Any:
            return pb.ServerLiveResponse(live=True)

        return await self._unary(
            Call("ServerLive", grpc_context), "", answer, pb.ServerLiveResponse
        )

    async def ServerReady(self, request: Any, grpc_context: Any = None) -> Any:
        async def answer() -> Any:
            _, status = await self.readiness.server()
            return pb.ServerReadyResponse(ready=status == 200)

        call = Call("ServerReady", grpc_context)
        return await self._unary(call, "", answer, pb.ServerReadyResponse)

    async def ModelReady(self, request: Any, grpc_context: Any = None) -> Any:
        async def answer() -> Any:  # a model not served is not ready (HTTP: 404)
            try:
                triton.check_version(request.name, request.version or triton.VERSION)
                base = self._v2_model(request.name)
            except ModelNotFound:
                return pb.ModelReadyResponse(ready=False)
            _, status = await self.readiness.model(request.name, base)
            return pb.ModelReadyResponse(ready=status == 200)

        call = Call("ModelReady", grpc_context)
        return await self._unary(call, request.name, answer, pb.ModelReadyResponse)

    async def ServerMetadata(self, request: Any, grpc_context: Any = None) -> Any:
        async def answer() -> Any:
            return grpc_codec.message(pb.ServerMetadataResponse, await self.server_metadata())

        call = Call("ServerMetadata", grpc_context)
        return await self._unary(call, "", answer, pb.ServerMetadataResponse)

    async def ModelMetadata(self, request: Any, grpc_context: Any = None) -> Any:
        async def answer() -> Any:
            triton.check_version(request.name, request.version or triton.VERSION)
            meta = await self.model_metadata(request.name)  # (404: not served)
            return grpc_codec.message(pb.ModelMetadataResponse, meta)

        call = Call("ModelMetadata", grpc_context)
        return await self._unary(call, request.name, answer, pb.ModelMetadataResponse)

    async def ModelConfig(self, request: Any, grpc_context: Any = None) -> Any:
        async def answer() -> Any:
            triton.check_version(request.name, request.version or triton.VERSION)
            config = await self.model_config(request.name)
            return pb.ModelConfigResponse(
                config=grpc_codec.message(model_config_pb2.ModelConfig, config)
            )

        call = Call("ModelConfig", grpc_context)
        return await self._unary(call, request.name, answer, pb.ModelConfigResponse)

    async def ModelStatistics(self, request: Any, grpc_context: Any = None) -> Any:
        async def answer() -> Any:  # no name: every model (/v2/models/stats)
            if not request.name:
                return grpc_codec.message(pb.ModelStatisticsResponse, await self.all_model_stats())
            triton.check_version(request.name, request.version or triton.VERSION)
            stats = await self.model_stats(request.name)
            return grpc_codec.message(pb.ModelStatisticsResponse, stats)

        call = Call("ModelStatistics", grpc_context)
        return await self._unary(call, request.name, answer, pb.ModelStatisticsResponse)

    async def RepositoryIndex(self, request: Any, grpc_context: Any = None) -> Any:
        async def answer() -> Any:  # ready: only the models ready to serve
            index = await self.repository_index()
            if request.ready:
                index = [m for m in index if m["state"] == "READY"]
            return grpc_codec.message(pb.RepositoryIndexResponse, {"models": index})

        call = Call("RepositoryIndex", grpc_context)
        return await self._unary(call, "", answer, pb.RepositoryIndexResponse)

    async def RepositoryModelLoad(self, request: Any, grpc_context: Any = None) -> Any:
        async def answer() -> Any:  # model control mode NONE, as over HTTP
            triton.model_control(request.model_name, "load")

        call = Call("RepositoryModelLoad", grpc_context)
        return await self._unary(call, "", answer, pb.RepositoryModelLoadResponse)

    async def RepositoryModelUnload(self, request: Any, grpc_context: Any = None) -> Any:
        async def answer() -> Any:
            triton.model_control(request.model_name, "unload")

        call = Call("RepositoryModelUnload", grpc_context)
        return await self._unary(call, "", answer, pb.RepositoryModelUnloadResponse)

    # ------------------------------------------------------------------ inference
    async def ModelInfer(self, request: Any, grpc_context: Any = None) -> Any:
        call = Call("ModelInfer", grpc_context)
        model = request.model_name

        async def answer() -> Any:
            try:
                resp = await self.grpc_infer(request, call)
            except BaseException:
                if self._label(model) != "?":  # (statistics of a model served, as HTTP)
                    ms = (time.perf_counter() - call.t0) * 1e3
                    self.book.record(model, False, ms, None, 0)
                raise
            metrics.observe_stage("total", model, (time.perf_counter() - call.t0) * 1e3)
            return resp

        return await self._unary(call, model, answer, pb.ModelInferResponse)

    async def grpc_infer(self, request: Any, call: Call) -> Any:
        """One ``ModelInferRequest`` answered (or its error raised): parsed with
        ``grpc_codec`` against the model's own tensors, run by the v2 core."""
        rid = call.request_id
        with self.drain.work(rid):  # 503 once the app is being stopped
            model = request.model_name
            triton.check_version(model, request.model_version or triton.VERSION)
            target = await self.v2_target(model, rid)
            size, limit = request.ByteSize(), self.cfg.ingress.max_body_bytes
            if size > limit:
                raise PayloadTooLarge("request message too large", bytes=size, limit_bytes=limit)
            rows = self.cfg.request_rows
            if target.encoded:
                req: Any = grpc_codec.parse_encoded(request, target.output_names, rows)
            else:
                req = grpc_codec.parse_infer(request, target.sig, rows)
            opts = grpc_codec.options(request, time.time())
            deadline = opts.deadline or call.deadline(self.cfg.batching.default_deadline_ms)
            high = opts.priority_high or call.metadata.get("x-priority", "").lower() == "high"
            result = await self.v2_infer(target, req, opts, rid, deadline, high, call.t0)
        return grpc_codec.infer_response(model, result.id, result.outputs, result.params)


def _refuse(name: str) -> Callable:
    async def method(self: GrpcInference, request: Any, grpc_context: Any = None) -> Any:
        async def answer() -> Any:
            raise HttpError(f"{name} is not implemented by Ferry", 501, method=name)

        empty = getattr(pb, f"{name}Response")
        return await self._unary(Call(name, grpc_context), "", answer, empty)

    method.__name__, method.__qualname__ = name, f"GrpcInference.{name}"
    return method


for _name in UNIMPLEMENTED:  # the rest of the service: UNIMPLEMENTED, with Ferry's error
    setattr(GrpcInference, _name, _refuse(_name))
