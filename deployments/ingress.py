"""Ingress: the HTTP front as a Serve deployment (FastAPI through ``@serve.ingress``; the app,
its ASGI layers and ``FerryApp`` -- which takes POST classify, nearly all the traffic, past
Starlette's middleware and FastAPI's router -- are in ``ingress_http.py``).

(No ``from __future__ import annotations`` here: Serve rebuilds the route functions, and
FastAPI must see real annotation objects, not strings, to recognise ``Request``.)

It validates what it can without decoding (size, media type, image header and its decode
plan, tensor shape), gives every request an id, and coalesces the requests that arrive
within ``coalesce_window_ms`` into one downstream call. Where that call goes is the way it
is given (``way_down``, ``ingress_route``): the chained Serve deployments of ``four_stage``,
one Serve hop to an inference replica that answers (``split``, ``gpu_preprocess``), or the
inference stage in this very process (``one_process``). The
image's decode plan travels with its bytes, so no stage reads its header again.
"""

import asyncio
import logging
import time
from typing import Any

import numpy as np
from fastapi import Request
from fastapi.responses import JSONResponse, Response
from ray import serve

from pipeline import metrics
from pipeline.coalescer import Coalescer
from pipeline.config import PipelineConfig
from pipeline.errors import (
    FerryError,
    InvalidInput,
    ModelNotFound,
)
from pipeline.models.repository import model_card
from pipeline.protocol import encoded as triton_encoded
from pipeline.protocol import triton, v2
from pipeline.protocol.validate import header_int
from pipeline.stages.messages import (
    Answer,
    Encoded,
    HostRows,
    ImageRequest,
    PostSpec,
    RequestMeta,
    TensorRequest,
)
from pipeline.threads import name_os_thread

from . import drain, load_board, triton_stats
from .direct import DirectListener
from .grpc_service import GrpcInference
from .grpc_stream import GrpcStream
from .http_errors import request_id_of, unwrap
from .ingress_http import JsonAnswer, app, deadline_of, multipart_image, priority_of
from .ingress_route import way_down
from .readiness import Readiness
from .task_routes import TaskRoutes
from .triton_routes import TritonRoutes
from .uploads import UploadGate
from .v2_core import V2Core, finish

logger = logging.getLogger(__name__)


def _stamped(results: list[Answer | FerryError], t_send: float) -> list[Answer | FerryError]:
    """Each answer stamped with when its group left the coalescer (``t_send``, perf_counter
    s) and, where a Serve call reached the replica that answered (which stamped the
    ``Hop``), when that call left (wall clock, as that replica stamps its arrival).

    (A function of this module on purpose. The class below travels to its replicas by value
    -- its name here is the deployment, not the class -- and a method of it that calls a
    function of this module makes the replica import this module; that import is what
    makes Serve's class-based view of the routes there, including ``TritonRoutes``' and the
    other mixins', whose functions travel by reference. Without it their routes take
    ``self`` as a query parameter: 400.)"""
    wall_call = t_send + time.time() - time.perf_counter()
    for r in results:
        if isinstance(r, Answer):
            r.timings.left_coalescer = t_send * 1e3
            if r.timings.hop is not None:
                r.timings.hop.sent = wall_call * 1e3
    return results


@serve.deployment
@serve.ingress(app)
class Ingress(TritonRoutes, TaskRoutes, V2Core, GrpcInference, GrpcStream):  # (mixins: each module)
    def __init__(
        self,
        config: dict[str, Any],
        way: str = "chain",
        preprocess: Any = None,
        inference: Any = None,
        postprocess: Any = None,
    ) -> None:
        """``way``: how this ingress reaches the rest (``ingress_route.way_down``), with the
        handles of the deployments it calls (none for ``in_process``, which builds the
        inference stage here). The composition root (``deployments/app.py``) gives both."""
        self.cfg = PipelineConfig.model_validate(config)
        self.cfg.ingress_deployment.apply_in_process()
        self.down = way_down(way, self.cfg, preprocess, inference, postprocess)
        self.models = {m.name: m for m in self.cfg.models}
        self.cards = {m.name: model_card(m) for m in self.cfg.models}
        self._signatures: dict[str, v2.Signature] = {}
        self.tasks: dict[str, Any] = {}  # model -> its Task, resolved from its signature
        self.encoded_views = triton_encoded.views(self.models)  # v2 name -> model
        self.targets = {name: card.target() for name, card in self.cards.items()}
        ic = self.cfg.ingress
        self._coalescers: dict[tuple[str, str], Coalescer] = {}
        self._window_s = ic.coalesce_window_ms / 1e3
        self.uploads = UploadGate(
            min(
                ic.max_concurrent_uploads,
                max(1, self.cfg.ingress_deployment.max_ongoing_requests * 3 // 4),
            ),
            ic.body_idle_timeout_s,
            ic.body_timeout_s,
            ic.upload_grace_s,
        )
        # the statistics extension: this replica's book, and the sum over the app's replicas
        self.book = triton.Stats()
        self.stats = triton_stats.for_this_replica(self.book)
        self.drain = drain.for_this_replica(self.cfg.batching.retry_after_s)
        self.drain.start()  # (in Serve's event loop; else from the first request)
        board = load_board.for_this_replica(self.cfg)  # what the inference replica said
        self.readiness = Readiness(
            self.down.status, board and board.read, lambda: self.drain.draining
        )
        self.readiness.start()  # (as the drain's)
        self.direct: DirectListener | None = None  # Ferry's own listener, once the app is built

    def __serve_build_asgi_app__(self) -> Any:
        """The app this replica serves (Serve calls this after the constructor): Serve's
        copy of the FastAPI app, with this ingress in its state -- where the ASGI layers
        outside FastAPI's routes (``FerryApp``'s classify path, ``RequestMetrics``) find it."""
        app = self.app
        app.state.ingress = self
        port = self.cfg.ingress.direct_port
        if port is not None and self.direct is None:
            # Ferry's own listener on the same app, on this loop (deployments/direct.py)
            # (at most max_ongoing_requests in the app from this port, as from Serve's)
            self.direct = DirectListener(
                app,
                self.cfg.ingress.direct_host,
                port,
                max_ongoing=self.cfg.ingress_deployment.max_ongoing_requests,
            ).start()
            # named now, not at its first request (FerryApp's): a replica that a benchmark's
            # level finds without a connection yet would otherwise count the loop's start-up
            # CPU (the model's compile) into the level's thread list once its first came
            name_os_thread("ferry-loop")
        return app

    def __del__(self) -> Any:
        """Serve stops this replica: its own listener (``ingress.direct_port``), if any, stops
        accepting -- the port's other replicas take the new connections -- and what this
        returns in the event loop, which Serve awaits, ends once the listener's open requests
        are answered (Serve's drain counts only the requests of its own path)."""
        direct = getattr(self, "direct", None)  # (a constructor that failed set none)
        if direct is None:
            return None
        direct.close()
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # (collected outside a loop: nothing to wait in)
            return None
        return direct.closed()

    def check_health(self) -> None:
        """In ``one_process`` this replica owns the GPU: its inference stage's health. And
        its own listener (``ingress.direct_port``), where it has one, must still listen."""
        if self.direct is not None:
            self.direct.check()
        check = getattr(self.down, "check_health", None)
        if check is not None:
            check()

    # ------------------------------------------------------------------ plumbing
    def _coalescer(self, model: str, kind: str) -> Coalescer:
        key = (model, kind)
        c = self._coalescers.get(key)
        if c is None:
            run = (
                (lambda items, m=model: self._classify_group(m, items))
                if kind == "classify"
                else (lambda items, m=model: self._v2_group(m, items))
            )
            ic = self.cfg.ingress
            c = self._coalescers[key] = Coalescer(
                run,
                self._window_s,
                ic.max_coalesce,
                max_in_flight=ic.max_groups_in_flight,
                # a group that starts while none is out leaves at once: a lone request pays
                # no window (RESULTS.md: 1.5x img/s at one client, equal at 48)
                dispatch_when_idle=True,
                budget_s=self.cfg.batching.policy_for(model).budget_s,
                retry_after_s=self.cfg.batching.retry_after_s,
                on_reject=metrics.count_rejected,
                held=lambda: self.drain.in_flight,  # (the requests in this replica's handlers)
            )
        return c

    def _model(self, name: str) -> str:
        if name not in self.models:
            raise ModelNotFound("no such model", model=name, served=sorted(self.models))
        return name

    async def _classify_group(
        self, model: str, items: list[ImageRequest]
    ) -> list[Answer | FerryError]:
        t_send = time.perf_counter()
        metrics.observe_group(model, len(items))
        encoded = [it.image for it in items]
        meta = [it.meta for it in items]
        specs = [it.spec for it in items]
        return await self._answers(model, self.down.classify(model, encoded, meta, specs), t_send)

    async def _v2_group(self, model: str, items: list[TensorRequest]) -> list[Answer | FerryError]:

        t_send = time.perf_counter()
        owner = [i for i, it in enumerate(items) for _ in range(len(it.tensors))]
        metrics.observe_group(model, len(owner))
        rows = HostRows(len(items), owner, data=np.concatenate([it.tensors for it in items]))
        meta = [it.meta for it in items]
        specs = [it.spec for it in items]
        return await self._answers(model, self.down.tensors(model, rows, meta, specs), t_send)

    async def _answers(self, model: str, pending: Any, t_send: float) -> list[Answer | FerryError]:
        """The answers of a group, stamped (``_stamped``)."""
        try:
            results = await pending
        except BaseException as exc:  # (a model refused at load: its 503, not a retry)
            raise self.readiness.explain(model, unwrap(exc)) from None
        return _stamped(results, t_send)

    # ------------------------------------------------------------------ v1
    # POST /v1/models/{model}/classify: FerryApp serves it, and documents it as the app's first
    # route (ingress_http.classify)

    async def classify_request(self, model: str, request: Request, top_k: Any) -> Response:
        self.drain.start()
        with self.drain.work(request_id_of(request)):  # 503 once the app is being stopped
            return await self._classify(model, request, top_k)

    async def _classify(self, model: str, request: Request, top_k: Any) -> Response:
        t0 = time.perf_counter()
        rid = request_id_of(request)
        self._model(model)
        self.readiness.check(model)  # refused at load: 503, the reason, no retry
        self.check_route(model, "classify")  # a model of another task: 400, its route named
        if isinstance(top_k, str):
            try:
                top_k = int(top_k)
            except ValueError:
                raise InvalidInput("bad request parameters", top_k=top_k) from None
        k = self.cfg.ingress.default_top_k if top_k is None else top_k
        labels = self.cards[model].labels
        kmax = min(64, len(labels)) if labels else 64  # (and at most the model's classes)
        if not 1 <= k <= kmax:
            raise InvalidInput("top_k out of range", top_k=k, max=kmax)
        spec = PostSpec("classify", top_k=k)
        body = await self.by_image(model, request, t0, rid, lambda _item: spec)
        return JsonAnswer({"request_id": rid, "model": model, **body})

    async def by_image(
        self, model: str, request: Request, t0: float, rid: str, spec_of: Any
    ) -> dict[str, Any]:
        """One image request down the classify path -- the model's coalescer (refused before
        its body is read when it is full), the body's limits and media checks, the decode
        plan from its header, the deadline, the priority and the queue budget -- asking
        ``spec_of(item)`` back (called with the checked image, before it is queued: its
        400/406/413 cost no GPU time). Every v1 image route goes this way."""
        coalescer = self._coalescer(model, "classify")
        coalescer.check(rid)  # refused before its body is read: an overload costs no upload
        body = await self.uploads.read(request, self.cfg.ingress.max_body_bytes)
        ct = request.headers.get("content-type")
        if ct and ct.lower().startswith("multipart/form-data"):
            body, ct = multipart_image(body, ct)
        ic = self.cfg.ingress
        # 400 / 413 / 415 before anything is decoded: media type, pixels, the resize plan;
        # the plan travels with the bytes, so the header is read once
        item = Encoded.checked(
            body, ct, self.targets[model], ic.max_pixels, ic.max_image_work_bytes
        )
        spec = spec_of(item)
        queued = time.perf_counter()
        meta = RequestMeta(
            rid,
            deadline_of(request, self.cfg.batching.default_deadline_ms),
            priority_of(request),
            time.time(),
        )
        ask = ImageRequest(item, spec, meta)
        result = await self._await(coalescer.submit(ask, rid), rid, meta.deadline)
        body = finish(result, t0, queued)  # (observe.RequestMetrics counts it and its total)
        self.book.record(model, True, body["timings_ms"]["total"], body["timings_ms"], 1)
        return body

    # ------------------------------------------------------------------ v2 (Open Inference Protocol)
    @app.get("/v2")
    async def server_metadata(self) -> dict[str, Any]:
        return {"name": "ferry", "version": "0.1.0", "extensions": list(triton.EXTENSIONS)}

    @app.get("/v2/health/live")
    async def live(self) -> dict[str, Any]:
        return {"live": True}

    @app.get("/v2/health/ready")
    async def ready(self) -> Response:
        """Answered at once, with why when not ready (``deployments/readiness.py``)."""
        self.drain.start()
        return JSONResponse(*await self.readiness.server())

    @app.get("/v2/models/{model}")
    async def model_metadata(self, model: str) -> dict[str, Any]:
        if model in self.encoded_views:  # the model's outputs (its task's), a BYTES input
            base = self._v2_model(model)
            meta, task = await self.model_metadata(base), await self.view_task(base)
            if task is not None:
                return triton_encoded.task_metadata(model, meta, task.kind)
            return triton_encoded.metadata(model, meta)
        return v2.model_metadata(model, await self._signature(model), self.cards[model].engine)

    @app.get("/v2/models/{model}/ready")
    async def model_ready(self, model: str) -> Response:
        self.drain.start()
        return JSONResponse(*await self.readiness.model(model, self._v2_model(model)))

    # POST /v2/models/{model}/infer: FerryApp serves it (ingress_http.infer documents it)
    async def infer(self, model: str, request: Request) -> Response:
        self.drain.start()
        with self.drain.work(request_id_of(request)):  # 503 once the app is being stopped
            return await self._infer(model, request)

    async def _infer(self, model: str, request: Request) -> Response:
        """The HTTP half of a v2 infer request (JSON, and the binary tensor extension); the
        rest is the one v2 core both fronts call (``v2_core.V2Core``)."""
        t0 = time.perf_counter()
        rid = request_id_of(request)
        target = await self.v2_target(model, rid)  # refused before its body is read
        body = await self.uploads.read(request, self.cfg.ingress.max_body_bytes)
        hl = header_int(request.headers.get(v2.HEADER_LEN), "Inference-Header-Content-Length")
        rows = self.cfg.request_rows  # they form GPU batches of up to the model's max_batch
        if target.encoded:  # JPEG/PNG files, each checked from its header before decoding
            req: Any = triton_encoded.parse(body, hl, target.output_names, rows)
        else:
            req = v2.parse_infer(body, hl, target.sig, rows)
        opts = triton.request_options(body if hl is None else body[:hl], time.time())
        deadline = opts.deadline or deadline_of(request, self.cfg.batching.default_deadline_ms)
        priority = opts.priority_high or priority_of(request)
        result = await self.v2_infer(target, req, opts, rid, deadline, priority, t0)
        payload, headers = triton.encode(
            model, result.id, result.outputs, result.binary, result.params
        )
        return Response(payload, headers=headers)
