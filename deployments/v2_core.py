"""One v2 infer request, whatever carried it: a mixin of the ``Ingress`` deployment that both
fronts call -- the HTTP route (``ingress.py``: JSON and the binary tensor extension) and the
gRPC servicer (``grpc_service.py``: protobuf). Each front parses its own wire format with
``pipeline/protocol`` (the same checks of names, shapes, datatypes and rows) and hands the
typed request here; from here on a request is the same request: the same coalescer, queue
budget, deadline, priority, statistics book and answer.

    target = await self.v2_target(model, rid)            # 404/503, and the coalescer's check
    req = ...parse with target.sig, self.cfg.request_rows ...
    result = await self.v2_infer(target, req, opts, rid, deadline, priority, t0)
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline.coalescer import Coalescer
from pipeline.coarse_timeout import within
from pipeline.errors import DeadlineExceeded, Unavailable
from pipeline.protocol import encoded as triton_encoded
from pipeline.protocol import triton, v2
from pipeline.stages.messages import (
    Answer,
    Encoded,
    ImageRequest,
    PostSpec,
    RequestMeta,
    TensorRequest,
)
from pipeline.tasks.spec import Task

# past a request's deadline, how long the ingress still waits for the stage holding it to
# answer (its own 504) before it answers 503 itself (V2Core._await)
DEADLINE_GRACE_S = 1.0


def finish(result: Answer | BaseException, t0: float, queued: float) -> dict[str, Any]:
    """Raise a request's own error; else its answer as sent on, its timings complete
    (``Timings.report``: from its arrival at ``t0`` and its hand-over to the coalescer at
    ``queued``, perf_counter seconds, to now)."""
    if isinstance(result, BaseException):
        raise result
    now, wall = time.perf_counter(), time.time()
    return result.body(result.timings.report(t0 * 1e3, queued * 1e3, now * 1e3, wall * 1e3))


@dataclass(frozen=True)
class V2Target:
    """Where a v2 infer request goes: the model as asked (a model, or its encoded view), the
    model that runs it, that model's own tensors, whether it takes encoded images, and the
    coalescer it joins."""

    model: str
    base: str
    sig: v2.Signature
    encoded: bool
    coalescer: Coalescer
    task: Task | None = None  # an encoded view of a task model: its answers, BYTES outputs

    @property
    def output_names(self) -> tuple[str, ...]:
        """The outputs a request may ask for: the model's own, or its task view's one."""
        if self.task is not None:
            return (triton_encoded.TASK_OUTPUT[self.task.kind],)
        return self.sig.output_names


@dataclass(frozen=True)
class V2Result:
    """A v2 answer before its wire format: the model as asked, the request's own ``id``, its
    outputs by name (classification already applied), those asked for in binary (HTTP), and
    Ferry's parameters (request id, weights, batch size, timings)."""

    model: str
    id: str | None
    outputs: dict[str, np.ndarray]
    binary: frozenset[str]
    params: dict[str, Any]


class V2Core:
    """Needs of the class it is mixed into: ``cfg``, ``cards``, ``targets``, ``book``,
    ``down``, ``readiness``, ``encoded_views``, ``_signatures``, ``_model``, ``_v2_model``,
    ``_coalescer`` and the task views' ``view_task``, ``view_specs``, ``view_finish``
    (``task_routes.TaskRoutes``)."""

    async def _signature(self, model: str) -> v2.Signature:
        """The model's own tensors, from the engine the inference stage loaded (asked once)."""
        self._model(model)
        self.readiness.check(model)  # refused at load: 503, the reason, no retry
        if model not in self._signatures:
            got = await self.down.signatures()
            self._signatures.update({m: v2.Signature(*io) for m, io in got.items()})
            if model not in got:
                await self.readiness.not_loaded(model)
        return self._signatures[model]

    async def _await(self, coro: Any, request_id: str, deadline: float | None) -> Any:
        """The answer of a request handed downstream, waited for at most ``request_timeout_s``
        and, where it has a deadline (epoch s), until ``DEADLINE_GRACE_S`` after it. The stage
        that holds it answers its own 504 when the deadline passes in its queue; no answer at
        all by then means the stage is gone or wedged (a node lost under the call, which Ray
        reports only after its health checks fail, ~15 s): 503 with Retry-After, not a hang."""
        timeout = self.cfg.ingress.request_timeout_s
        if deadline is not None:
            timeout = min(timeout, max(0.0, deadline - time.time()) + DEADLINE_GRACE_S)
        try:  # (not wait_for: no task per request; one sweep a loop for all: coarse_timeout)
            with within(timeout):
                return await coro
        except TimeoutError:
            if deadline is not None and timeout < self.cfg.ingress.request_timeout_s:
                raise Unavailable(
                    "no answer from downstream by the request's deadline",
                    request_id=request_id,
                    waited_s=round(timeout, 3),
                    retry_after_s=self.cfg.batching.retry_after_s,
                ) from None
            raise DeadlineExceeded(
                "no answer in time",
                timeout_s=self.cfg.ingress.request_timeout_s,
                request_id=request_id,
            ) from None

    async def v2_target(self, model: str, rid: str) -> V2Target:
        """Where a request to ``model`` goes (404 for a model not served, 503 for one refused
        at load), refused at once (503) where its coalescer's queue would not take it -- before
        its body is read or parsed."""
        base = self._v2_model(model)
        sig = await self._signature(base)
        encoded = model in self.encoded_views
        coalescer = self._coalescer(base, "classify") if encoded else self._coalescer(model, "v2")
        coalescer.check(rid)
        task = await self.view_task(base) if encoded else None
        return V2Target(model, base, sig, encoded, coalescer, task)

    async def v2_infer(
        self,
        target: V2Target,
        req: v2.InferRequest | triton_encoded.EncodedRequest,
        opts: triton.RequestOptions,
        rid: str,
        deadline: float | None,
        priority: bool,
        t0: float,
    ) -> V2Result:
        """Run a parsed request (``v2.InferRequest`` of a tensor, or ``EncodedRequest`` of image
        files, each checked from its header here) and answer it: every image by the classify
        path, batched with the rest, or the tensor whole. ``deadline``: epoch s or None;
        ``t0``: its arrival (perf_counter s)."""
        if target.encoded:  # planned once: the plans travel with the bytes
            ic, aim = self.cfg.ingress, self.targets[target.base]
            images = triton_encoded.checked(
                req.images,
                lambda d: Encoded.checked(d, None, aim, ic.max_pixels, ic.max_image_work_bytes),
            )
        queued = time.perf_counter()
        meta = RequestMeta(
            rid,
            deadline,
            priority,
            # one budget from here to the GPU queue -- but a request of many images waits
            # here behind its own, so each of its calls meets the budget for its own wait
            time.time() if not target.encoded or len(images) == 1 else None,
        )
        names = tuple(o.name for o in target.sig.outputs)
        spec = PostSpec("v2", outputs=req.outputs, names=names)
        task = target.task
        if target.encoded:  # admitted as one request
            specs = self.view_specs(task, req, images) if task else [spec] * len(images)
            futs = target.coalescer.submit_many(
                [ImageRequest(item, s, meta) for item, s in zip(images, specs, strict=True)], rid
            )
            done = triton_encoded.answer(futs, self.view_finish(task, req, t0, queued, finish))
            result = await self._await(done, rid, meta.deadline)
        else:
            ask = TensorRequest(req.images, meta, spec)
            answer = await self._await(target.coalescer.submit(ask, rid), rid, meta.deadline)
            result = finish(answer, t0, queued)
        timings = result["timings_ms"]
        self.book.record(target.model, True, timings["total"], timings, len(req.images))
        outputs = dict(result["outputs"])
        for name, k in opts.classification.items() if task is None else ():  # Triton's
            outputs[name] = triton.classify(outputs[name], k, self.cards[target.base].label)
        params = {
            "request_id": rid,
            "random_weights": result["random_weights"],
            "batch_size": result["batch_size"],
            "timings_ms": timings,
        }
        return V2Result(target.model, req.id, outputs, req.binary_outputs, params)
