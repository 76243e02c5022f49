"""The v1 routes of the tasks beyond classify, a mixin of the ``Ingress`` deployment:
``POST /v1/models/{m}/image``, ``/segment`` and ``/detect``, and ``GET /v1/models`` (which
says each model's task). Each goes the classify path (``Ingress.by_image``: the same limits,
errors, coalescer, batching, queue budget, deadlines, priority and metrics), with its
options read (``pipeline/tasks/options.py``) and its answer's memory checked before the
body is read and queued; the answer is the encoded image or mask itself (timings in
``Server-Timing``) or JSON.

(No ``from __future__ import annotations``: FastAPI must see real annotation objects.)
"""

import time
from collections.abc import Callable
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from pipeline.errors import FerryError, InvalidInput
from pipeline.models.repository import random_weights
from pipeline.protocol import encoded as triton_encoded
from pipeline.stages.messages import Encoded, PostSpec
from pipeline.tasks.answers import KINDS
from pipeline.tasks.options import check_work, for_image, parse_options
from pipeline.tasks.spec import Task, resolve_task

from .http_errors import request_id_of
from .ingress_http import JsonAnswer, app

ROUTE_OF = {"classify": "classify", "image": "image", "segment": "segment", "detect": "detect"}


def _timing_header(timings: dict[str, float]) -> str:
    """``Server-Timing`` of an answer whose body is an image: each stage, in ms."""
    return ", ".join(f"{k};dur={v}" for k, v in timings.items())


def task_answer(rid: str, model: str, body: dict[str, Any]) -> Response:
    """An answer of a task route: the encoded bytes with the request's facts in headers, or
    the JSON result with them as keys."""
    media = body.get("media")
    if media is not None:
        headers = {
            "x-batch-size": str(body["batch_size"]),
            "x-random-weights": "true" if body["random_weights"] else "false",
            "server-timing": _timing_header(body["timings_ms"]),
        }
        return Response(media, media_type=body["media_type"], headers=headers)
    return JsonAnswer(
        {
            "request_id": rid,
            "model": model,
            **(body.get("result") or {}),
            "timings_ms": body["timings_ms"],
            "batch_size": body["batch_size"],
            "random_weights": body["random_weights"],
        }
    )


class TaskRoutes:
    """Needs of the class it is mixed into: ``cfg``, ``models``, ``cards``, ``tasks`` (a
    dict), ``drain``, ``readiness``, ``_model``, ``_signature`` and ``by_image``."""

    def check_route(self, model: str, route: str) -> None:
        """400 when the model's task is another route's (the entry's task, or the one
        resolved from its outputs once the ingress has asked for them)."""
        told = self.models[model].task
        task = self.tasks.get(model)
        kind = task.kind if task is not None else told
        if kind is None or kind == route:
            return
        if kind == "tensors" and route == "classify" and told is None:
            return  # told by its outputs: classify answers what it can (a 400 if not ranked)
        raise InvalidInput(
            f"model {model!r} answers task {kind!r}, not {route!r}",
            model=model,
            task=kind,
            route=f"/v1/models/{model}/{ROUTE_OF[kind]}" if kind in ROUTE_OF else "/v2 infer",
        )

    async def task_of(self, model: str) -> Task:
        """The model's task, resolved once from its outputs (as the replica that loaded it
        resolved it: ``pipeline.tasks.spec.resolve_task``)."""
        task = self.tasks.get(model)
        if task is None:
            sig = await self._signature(model)
            task = resolve_task(self.models[model], self.cards[model], tuple(sig.outputs))
            self.tasks[model] = task
        return task

    async def view_task(self, model: str) -> Task | None:
        """The task of a model whose ``<model>_encoded`` view answers its task's BYTES output
        (image, segment, detect); None for the others (its view answers its tensors)."""
        task = await self.task_of(model)
        return task if task.kind in KINDS else None

    def view_specs(self, task: Task, req: Any, images: list[Encoded]) -> list[PostSpec]:
        """Each image's spec of a v2 request to a task model's view: the options from the
        request's ``parameters``, each image's answer memory checked (413)."""
        query, accept = triton_encoded.task_query(req.params)
        opts = parse_options(task.kind, query, accept)
        specs = []
        for i, item in enumerate(images):
            p = item.plan
            mine = for_image(opts, p.height, p.width, p.kind)
            try:
                check_work(task, mine, self.cfg.ingress.max_image_work_bytes)
            except FerryError as exc:
                exc.fields.setdefault("element", i)
                raise
            specs.append(PostSpec(task.kind, task=task, options=mine))
        return specs

    @staticmethod
    def view_finish(
        task: Task | None, req: Any, t0: float, queued: float, finish: Callable
    ) -> Callable[[Any], dict[str, Any]]:
        """How one image's answer becomes the view's row: ``finish`` (the ingress's), then,
        for a task, its BYTES output."""
        if task is None:
            return lambda r: finish(r, t0, queued)
        kind, binary = task.kind, req.binary_outputs
        return lambda r: triton_encoded.task_outputs(kind, finish(r, t0, queued), binary)

    # POST /v1/models/{model}/image, /segment, /detect: FerryApp serves them
    # (ingress_http.image, .segment and .detect document them)
    async def task_request(self, model: str, request: Request, kind: str) -> Response:
        """One request of a task route (``kind``: image, segment or detect): its options
        read, its answer's memory checked per image, then the classify path."""
        self.drain.start()
        rid = request_id_of(request)
        with self.drain.work(rid):  # 503 once the app is being stopped
            t0 = time.perf_counter()
            self._model(model)
            self.readiness.check(model)  # refused at load: 503, the reason, no retry
            opts = parse_options(kind, request.query_params, request.headers.get("accept"))
            task = await self.task_of(model)
            self.check_route(model, kind)
            limit = self.cfg.ingress.max_image_work_bytes

            def spec_of(item: Encoded) -> PostSpec:
                p = item.plan
                mine = for_image(opts, p.height, p.width, p.kind)
                check_work(task, mine, limit)  # 413: the answer's memory, before it queues
                return PostSpec(kind, task=task, options=mine)

            body = await self.by_image(model, request, t0, rid, spec_of)
            return task_answer(rid, model, body)

    @app.get("/v1/models")
    async def list_models(self) -> dict[str, Any]:
        out = []
        for name, m in self.models.items():
            card = self.cards[name]
            img = card.image
            try:  # resolved from the outputs the inference replica loaded (asked once)
                kind: str | None = (await self.task_of(name)).kind
            except Exception:  # refused at load, or not loaded yet: the entry's word
                kind = m.task
            out.append(
                {
                    "name": name,
                    "engine": m.engine,
                    "source": m.source,
                    "task": kind,
                    "input": {  # the config's names (input.resize: crop | fit | stretch)
                        "height": img.height,
                        "width": img.width,
                        "channels": img.channels,
                        "resize": img.resize,
                    },
                    "classes": len(card.labels) if card.labels else None,
                    "random_weights": random_weights(m),
                    **self.readiness.state_of(name),
                }
            )
        return {"models": out}
