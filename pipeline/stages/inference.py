"""The inference stage (``InferenceStage``): the GPU actor -- one GpuExecutor and one
BatchScheduler per process that owns the device.

Rows from many calls (each already a coalesced group of requests) are merged into GPU
batches: full, or the oldest row waited ``max_wait_ms``. Up to ``max_in_flight`` batches
are staged or running at once. Preparing a batch may wait for a staging slot and copying
it into pinned memory takes time, so both run in a worker thread; the event loop only
awaits. It is given an executor whose models are loaded and every bucket warmed (its CUDA
graphs captured; ``pipeline.stages.build``), so ``check_health`` tells the truth from the
start (``pipeline.health``). A model refused at load (``pipeline.models.loading``) gets 503
``ModelUnavailable`` with the reason; the others are served.

Three calls, each with one answer type: ``logits`` (rows -> ``Logits``), ``answers`` (rows ->
one ``Answer`` or error per request, made by the ``answerer`` it was given) and ``encoded``
(image bytes -> answers, decoded by its ``decoder`` or fetched from PreprocessGPU). Which it
is given is the composition root's choice (``deployments/app.py``); the stage never asks
which placement it runs in.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import numpy as np

from pipeline import gpu_metrics, metrics
from pipeline.batch_scheduler import BatchScheduler, settled
from pipeline.batching import Batch
from pipeline.config import PipelineConfig
from pipeline.engines.epilogue import has_epilogue
from pipeline.errors import FerryError, ModelNotFound, QueueFull
from pipeline.executor import GpuExecutor
from pipeline.handoff import Workers
from pipeline.models.loading import LoadReport, ModelUnavailable

from .inference_in import BatchReceiver
from .inference_rows import RowOut, collect, concat, stack, waited_s
from .messages import (
    Answer,
    DeviceRows,
    Encoded,
    HostRows,
    Logits,
    PostSpec,
    RequestMeta,
    RowTimes,
    SendTo,
)

logger = logging.getLogger(__name__)
TENSORS = "#tensors"  # the scheduler key of a model's v2 tensors: batched apart from images


def split_key(key: str) -> tuple[str, str]:
    """(model, feed) of a scheduler key."""
    if key.endswith(TENSORS):
        return key[: -len(TENSORS)], "tensors"
    return key, "image"


Fetch = Callable[[str, list[Encoded], SendTo], Awaitable[DeviceRows]]
"""``fetch(model, items, to)``: the PreprocessGPU deployment decodes ``items`` and sends the
batch as ``to`` says (``gpu_preprocess``); the rows it answers carry the batch's envelope."""


class Decoder(Protocol):
    """Decodes and resizes a call's image bytes in this process (``PreprocessStage`` on
    threads, ``PreprocessGpuStage`` on this executor's GPU)."""

    async def run(self, model: str, items: list[Encoded]) -> HostRows | DeviceRows: ...


class Answerer(Protocol):
    """Makes a call's answers from its logits (``PostprocessStage``)."""

    def run(
        self, model: str, logits: Logits, specs: list[PostSpec]
    ) -> list[Answer | FerryError]: ...


class InferenceStage:
    """Executor + scheduler + the row bookkeeping, without Ray, given what it works with
    (``pipeline.stages.build.build_inference`` assembles it):

    * ``executor``: the GpuExecutor whose models ``report`` says were loaded and warmed
      (``refused``: model -> why it is not served);
    * ``decoder``: decodes and resizes image bytes in this process (``encoded``), or None;
    * ``fetch`` + ``receiver``: asks the PreprocessGPU deployment for a batch and receives it
      on this GPU, or None;
    * ``answerer``: makes the answers here (``answers``), or None where a Postprocess
      deployment does.
    """

    def __init__(
        self,
        config: PipelineConfig,
        executor: GpuExecutor,
        report: LoadReport,
        *,
        decoder: Decoder | None = None,
        answerer: Answerer | None = None,
        fetch: Fetch | None = None,
        receiver: BatchReceiver | None = None,
    ) -> None:
        self.config = config
        self.executor = executor
        self.refused = report.refused
        self.random = {name: lm.random_weights for name, lm in executor.models.items()}
        self.epilogued = {n for n, lm in executor.models.items() if has_epilogue(lm.engine)}
        self.warmup_s: dict[str, float] = report.warmup_s
        self.decoder, self.answerer = decoder, answerer
        self.fetch, self.receiver = fetch, receiver
        self.to: SendTo | None = receiver.to if receiver is not None else None
        b = config.batching
        # each model's batches fill to its own max_batch (its ModelBatch, as the executor
        # runs it); its v2 tensors are batched apart, to the same size
        sizes = {m.name: config.batch_of(m.name).max_batch for m in config.models}
        self.scheduler = BatchScheduler(
            self._run_batch,
            config.largest_batch,
            b.max_wait_ms,
            b.max_queue,
            sizes={**sizes, **{k + TENSORS: v for k, v in sizes.items()}},
            buckets=config.executor.buckets,
            max_in_flight=config.executor.max_in_flight,
            retry_after_s=b.retry_after_s,
            on_batch=self._on_batch,
            on_drop=lambda p, e: metrics.count_rejected(e.reason),
            # with no batch running the queue leaves at once: a lone request pays no
            # max_wait_ms (RESULTS.md, "The GPU queue leaves at once when idle")
            dispatch_when_idle=True,
        )
        self.submit_pool = Workers(config.executor.max_in_flight + 1, "ferry-submit")
        # the answers of a call off the loop (a task's may wait on its device encode)
        self.answer_pool = Workers(4, "ferry-answer")
        self.default_deadline_s = (
            None if b.default_deadline_ms is None else b.default_deadline_ms / 1e3
        )
        self.budget_s = {m.name: b.policy_for(m.name).budget_s for m in config.models}
        self._pool_reported = 0.0
        self._start_metrics()
        self.health = executor.replica_health(config.health, self.scheduler.queue.__len__)

    def _start_metrics(self) -> None:
        """Gauges from the start (a scrape before the first batch finds them) and, on a
        GPU, NVML's readings of it."""
        for m in self.config.models:
            metrics.set_queue_depth(m.name, 0)
        self._report_executor()
        if self.executor.backend.is_cuda:
            gpu_metrics.start(self.executor.backend.device_id)

    def _report_executor(self) -> None:
        """The executor's gauges: its pool and its counts."""
        metrics.set_pool(self.executor.pool.stats().as_dict())
        metrics.set_executor(self.executor.counters.snapshot())

    async def _images(self, model: str, items: list[Encoded]) -> HostRows | DeviceRows:
        """Encoded images: decoded and resized in this process, or by PreprocessGPU, which
        sends the batch here (on this GPU)."""
        if self.decoder is not None:
            return await self.decoder.run(model, items)
        if self.fetch is None:
            raise FerryError("this replica is given decoded images: it has no decoder")
        images = await self.fetch(model, items, self.to)
        if images.envelope is None:  # every image failed: nothing was sent
            return images
        assert self.receiver is not None
        return images.received(await self.receiver.recv(images.envelope))

    def _on_batch(self, batch: Batch) -> None:
        model = split_key(batch.key)[0]  # a model's v2 tensors count as the model
        metrics.observe_batch(model, len(batch))
        metrics.set_queue_depth(model, self.scheduler.queue.depth(batch.key))

    def _submit(self, key: str, rows: list[np.ndarray]) -> Any:
        model, feed = split_key(key)
        p = self.executor.prepare(model, len(rows), feed=feed)
        return self.executor.commit(
            p, rows, label=f"{key}[{len(rows)}]"
        )  # rows go straight to pinned memory

    def _run_parts(self, key: str, rows: list[Any], top: int) -> Any:
        """A batch's outputs, in a submit thread: its parts (``top`` rows at most, the
        model's max batch) committed, then waited on here -- the thread sleeps on each
        part's event and finishes it itself, so a batch costs the loop one hand-off out
        and one back (no completion thread between)."""
        parts = [self._submit(key, rows[i : i + top]) for i in range(0, len(rows), top)]
        done = [r.wait() for r in parts]
        return done[0] if len(done) == 1 else concat(done)

    async def _run_batch(self, batch: Batch) -> list[RowOut]:
        t0 = time.monotonic()
        rows = [p.item for p in batch.items]
        top = self.executor.buckets(split_key(batch.key)[0])[-1]  # the model's max_batch
        logits = await self.submit_pool.run(self._run_parts, batch.key, rows, top)
        t1 = time.monotonic()
        gpu_ms = (t1 - t0) * 1e3
        metrics.observe_stage("gpu", split_key(batch.key)[0], gpu_ms, len(batch))
        if t1 - self._pool_reported > 1.0:  # gauges once a second, not per batch
            self._pool_reported = t1
            self._report_executor()
        out = []
        multi = isinstance(logits, tuple)  # a model of several outputs: a tuple per row
        for i, p in enumerate(batch.items):
            row = tuple(o[i] for o in logits) if multi else logits[i]
            out.append(RowOut(row, (t0 - p.enqueued) * 1e3, gpu_ms, len(batch)))
        return out

    async def logits(
        self,
        model: str,
        images: HostRows | DeviceRows,
        meta: list[RequestMeta],
        feed: str = "image",
    ) -> Logits:
        """The model's outputs for a call's rows, one ``Logits`` (a request that failed is
        carried as its error). ``feed``: ``image`` (uint8 pixels) or ``tensors`` (the model's
        own input tensor, from a v2 request)."""
        self._served(model)
        self.health.admit()  # a draining replica refuses at once (503: retry elsewhere)
        errors = dict(images.errors)
        futs = self._submit_rows(model, feed, images, meta, errors)
        results = await settled([f for f in futs if f is not None])
        rows, owner, times = collect(futs, results, images.owner, errors)
        # a request whose rows partly failed is dropped whole
        keep = [j for j, o in enumerate(owner) if o not in errors]
        data, more = stack([rows[j] for j in keep])
        finite = None  # a task's epilogue: (its bytes, each row's finiteness)
        if feed == "image" and model in self.epilogued and more:
            more, finite = more[:-1], more[-1]
        metrics.observe_items("queue", model, times.queue)  # each item's own wait
        kept = RowTimes(*([c[j] for j in keep] for c in (times.queue, times.gpu, times.batch_size)))
        return Logits(
            images.n_requests,
            [owner[j] for j in keep],
            errors,
            images.preprocess_ms,
            data=data,
            more=more,
            row_times=kept,
            random_weights=self.random[model],
            finite=finite,
        )

    def _submit_rows(
        self,
        model: str,
        feed: str,
        images: HostRows | DeviceRows,
        meta: list[RequestMeta],
        errors: dict[int, FerryError],
    ) -> list[asyncio.Future | None]:
        """Each row into the scheduler: its future, or None where its request is refused
        (already, or now by the queue: its reason put in ``errors``)."""
        key = model if feed == "image" else f"{model}{TENSORS}"
        n = 0 if images.data is None else len(images.data)
        futs: list[asyncio.Future | None] = []
        now_epoch, now_mono = time.time(), time.monotonic()
        decoding_s = (images.preprocess_ms or 0.0) / 1e3
        admitted: set[int] = set()  # a request's rows are admitted as one: by its first row
        for i in range(n):
            o = images.owner[i]
            if o in errors:  # refused (or bad) already: its other rows cost nothing
                futs.append(None)
                continue
            m = meta[o]
            deadline = None
            if m.deadline is not None:
                deadline = now_mono + (m.deadline - now_epoch)
            elif self.default_deadline_s is not None:
                deadline = now_mono + self.default_deadline_s
            try:
                futs.append(
                    self.scheduler.submit_nowait(
                        images.data[i],
                        key,
                        m.priority,
                        deadline,
                        m.request_id,
                        # one budget for the model, as Triton's: what the request waited
                        # since it joined the ingress's queue, less its decoding, counts
                        self.scheduler.clock() - waited_s(m, now_epoch, decoding_s),
                        # only a request's first row meets the budget: its own rows are not
                        # queue ahead of one another, and once admitted none is dropped; a
                        # stream's frame was admitted with its stream (the frame lane)
                        None if o in admitted or m.frame else self.budget_s[model],
                        m.frame,
                    )
                )
                admitted.add(o)
            except QueueFull as exc:  # this request, not the whole call
                metrics.count_rejected(exc.reason)
                futs.append(None)
                # without its traceback: that holds this frame, and with it every row of the
                # call (and their batch's lease), in a cycle only the cyclic GC would end
                errors.setdefault(o, exc.with_traceback(None))
        return futs

    async def answers(
        self,
        model: str,
        images: HostRows | DeviceRows,
        meta: list[RequestMeta],
        specs: list[PostSpec],
        feed: str = "image",
    ) -> list[Answer | FerryError]:
        """The answers for a call's rows, one per request: the logits, then softmax and
        top-k on the loop (a classify call's: no hand-off to pay for), or the v2 outputs and
        the tasks' answers (large tensors, encodes that may wait on the device) in a thread."""
        if self.answerer is None:
            raise FerryError(
                "this replica is not given an answerer: a Postprocess deployment answers"
            )
        logits = await self.logits(model, images, meta, feed)
        if all(s.kind == "classify" for s in specs):  # softmax and top-k: here, no hand-off
            return self.answerer.run(model, logits, specs)
        return await self.answer_pool.run(self.answerer.run, model, logits, specs)

    async def encoded(
        self, model: str, items: list[Encoded], meta: list[RequestMeta], specs: list[PostSpec]
    ) -> list[Answer | FerryError]:
        """Checked image bytes in, answers out: decode (here or by PreprocessGPU), batch, run."""
        self._served(model)
        images = await self._images(model, items)
        return await self.answers(model, images, meta, specs)

    def _served(self, model: str) -> None:
        """A model this replica serves, or why not: refused at load (503, not retryable),
        or no such model (404)."""
        if model in self.refused:
            raise ModelUnavailable(model=model, reason=self.refused[model])
        if model not in self.random:
            raise ModelNotFound("no such model", model=model, served=sorted(self.random))

    def signatures(self) -> dict[str, tuple[tuple[Any, ...], tuple[Any, ...]]]:
        """Every model's own input and output tensors (``TensorInfo``), from its engine."""
        return {
            name: (tuple(m.engine.inputs), tuple(m.engine.outputs))
            for name, m in self.executor.models.items()
        }

    def check_health(self) -> None:
        self.health.check()  # raises: Serve replaces this replica

    def status(self) -> dict[str, Any]:
        s = self.executor.stats()
        s["queue_depth"] = len(self.scheduler.queue)
        s["warmup_s"] = self.warmup_s
        s["models"] = {
            k: {"random_weights": v, "precision": self.executor.precision_of(k).as_dict()}
            for k, v in self.random.items()
        }
        s["refused"] = dict(self.refused)  # model -> why it is not served
        s["health"] = self.health.snapshot()
        return s
