"""Inference: the GPU actor -- one GpuExecutor and one BatchScheduler per replica.

Rows from many calls (each already a coalesced group of requests) are merged into GPU
batches: full, or the oldest row waited ``max_wait_ms``. Up to ``max_in_flight`` batches
are staged or running at once. Preparing a batch may wait for a staging slot and copying
it into pinned memory takes time, so both run in a worker thread; the event loop only
awaits. The replica loads its models and warms every bucket (capturing its CUDA graphs)
in its constructor; then ``check_health`` tells the truth (``pipeline.health``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import numpy as np
from ray import serve

from pipeline import metrics
from pipeline.batching import Batch, BatchScheduler
from pipeline.config import PipelineConfig
from pipeline.errors import FerryError, ModelNotFound
from pipeline.executor import GpuExecutor
from pipeline.threads import thread_pool

from .messages import PostSpec, RequestMeta, Rows

logger = logging.getLogger(__name__)
TENSORS = "#tensors"  # the scheduler key of a model's v2 tensors: batched apart from images


def split_key(key: str) -> tuple[str, str]:
    """(model, feed) of a scheduler key."""
    if key.endswith(TENSORS):
        return key[: -len(TENSORS)], "tensors"
    return key, "image"


def _concat(parts: list[Any]) -> Any:
    """The outputs of a batch run in parts (a model whose max_batch is below the batch's)."""
    if isinstance(parts[0], tuple):
        return tuple(np.concatenate(c) for c in zip(*parts, strict=True))
    return np.concatenate(parts)


class InferenceCore:
    """The stage's logic without Ray: executor + scheduler + the row bookkeeping."""

    def __init__(self, config: PipelineConfig, preprocess_gpu: Any = None) -> None:
        self.config = config
        self.preprocess_gpu = preprocess_gpu  # a handle (or core) to PreprocessGPU, or None
        self.executor = GpuExecutor(config.executor)
        for m in config.models:
            self.executor.load_entry(m)  # fails the replica's start with the model's reason
        self.random = {name: lm.random_weights for name, lm in self.executor.models.items()}
        self.warmup_s: dict[str, float] = {}
        if config.warmup:
            self.warmup_s = self.executor.warmup()
        b = config.batching
        self.scheduler = BatchScheduler(
            self._run_batch,
            b.max_batch_size,
            b.max_wait_ms,
            b.max_queue,
            buckets=config.executor.buckets,
            max_in_flight=config.executor.max_in_flight,
            retry_after_s=b.retry_after_s,
            on_batch=self._on_batch,
            on_drop=lambda p, e: metrics.count_rejected(e.fields.get("reason", "deadline")),
            dispatch_when_idle=b.dispatch_when_idle,
        )
        self.submit_pool = thread_pool(config.executor.max_in_flight + 1, "ferry-submit")
        self.default_deadline_s = (
            None if b.default_deadline_ms is None else b.default_deadline_ms / 1e3
        )
        self.budget_s = {m.name: b.policy_for(m.name).budget_s for m in config.models}
        self._pool_reported = 0.0
        self.post = None
        if config.fusion.postprocess_in_inference:
            from .postprocess import PostprocessCore

            self.post = PostprocessCore(config)
        self.local_pre: Any = None
        if config.fusion.preprocess_in_inference:
            self.local_pre = self._local_preprocess(config)
        self._init_transport()
        self._start_metrics()
        self.health = self.executor.replica_health(config.health, self.scheduler.queue.__len__)

    def _start_metrics(self) -> None:
        """Gauges from the start (a scrape before the first batch finds them) and, on a
        GPU, NVML's readings of it."""
        for m in self.config.models:
            metrics.set_queue_depth(m.name, 0)
        metrics.set_pool(self.executor.pool.stats().as_dict())
        if self.executor.backend.is_cuda:
            from pipeline import gpu_metrics

            gpu_metrics.start(self.executor.backend.device_id)

    def _local_preprocess(self, config: PipelineConfig) -> Any:
        """Decode and resize here: on this replica's GPU, or on its threads."""
        if config.preprocess.device == "cpu":
            from .preprocess import PreprocessCore

            return PreprocessCore(config)
        if not self.executor.backend.is_cuda:
            raise FerryError(
                "preprocess.device 'gpu' with fusion.preprocess_in_inference needs a CUDA "
                "device in the inference replica"
            )
        from .preprocess_gpu import PreprocessGpuStage

        ex = self.executor  # the stage's batches come from this executor's pool
        return PreprocessGpuStage(config, ex.backend.device_id, local=True, pool=ex.pool)

    def _init_transport(self) -> None:
        """The receiving end of the GPU preprocess hop, when there is one."""
        self.endpoint: Any = None
        self.receivers: dict[str, Any] = {}
        self.to: dict[str, Any] = {}
        if self.preprocess_gpu is None:
            return
        from pipeline.transport.base import choose_transport
        from pipeline.transport.object_store import ObjectStoreReceiver

        cuda = self.executor.backend.is_cuda
        kind = choose_transport(self.config.transport.preprocess_to_inference, True, cuda)
        self.receivers["object_store"] = ObjectStoreReceiver("preprocess->inference", cuda)
        self.to = {"transport": kind}
        if kind == "nccl":
            from pipeline.transport.nccl import NcclEndpoint

            self.endpoint = NcclEndpoint(
                self.executor.backend.device_id, timeout_s=self.config.transport.timeout_s
            )
            self.receivers["nccl"] = self.endpoint.receiver("preprocess->inference")
            self.to["endpoint"] = self.endpoint.id
            self.to["gpu"] = self.endpoint.gpu
        self.recv_pool = thread_pool(4, "ferry-recv")
        logger.info("GPU preprocessing hands batches over by %s", kind)

    async def _recv(self, envelope: Any) -> Any:
        """The batch an envelope stands for. NCCL receives are posted from a thread and
        polled from here: one waiting for an earlier envelope never holds a thread."""
        loop = asyncio.get_running_loop()
        rx = self.receivers[envelope.transport]
        timeout = self.config.transport.timeout_s
        if envelope.transport != "nccl":
            data, _ = await loop.run_in_executor(self.recv_pool, rx.recv, envelope, timeout)
            return data
        posted = await loop.run_in_executor(self.recv_pool, rx.post, [envelope], timeout)
        pause = 5e-5
        while not posted.done():
            await asyncio.sleep(pause)
            pause = min(pause * 2, 1e-3)
        return posted.wait()[0][0]

    async def preprocess_here(self, model: str, items: list[tuple[bytes, str | None]]) -> Rows:
        """Encoded images: decoded and resized in this replica (fused), or by PreprocessGPU,
        which sends the batch here (on this GPU)."""
        if self.local_pre is not None:
            return await self.local_pre.run(model, items)
        if self.preprocess_gpu is None:
            raise FerryError("this inference replica has no preprocessing stage")
        images = await self.preprocess_gpu.remote(model, items, self.to)
        if images.envelope is not None:
            images.data = await self._recv(images.envelope)
            images.envelope = None
        return images

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

    async def _run_batch(self, batch: Batch) -> list[Any]:
        t0 = time.monotonic()
        loop = asyncio.get_running_loop()
        rows = [p.item for p in batch.items]
        top = self.executor.buckets(split_key(batch.key)[0])[-1]  # the model's max_batch
        parts = [
            await loop.run_in_executor(self.submit_pool, self._submit, batch.key, rows[i : i + top])
            for i in range(0, len(rows), top)
        ]
        done = [await r for r in parts]
        logits = done[0] if len(done) == 1 else _concat(done)
        t1 = time.monotonic()
        gpu_ms = (t1 - t0) * 1e3
        metrics.observe_stage("gpu", split_key(batch.key)[0], gpu_ms, len(batch))
        if t1 - self._pool_reported > 1.0:  # gauges once a second, not per batch
            self._pool_reported = t1
            metrics.set_pool(self.executor.pool.stats().as_dict())
        out = []
        multi = isinstance(logits, tuple)  # a model of several outputs: a tuple per row
        for i, p in enumerate(batch.items):
            row = tuple(o[i] for o in logits) if multi else logits[i]
            out.append((row, (t0 - p.enqueued) * 1e3, gpu_ms, len(batch)))
        return out

    async def run(
        self, model: str, images: Rows, meta: list[RequestMeta], feed: str = "image"
    ) -> Rows:
        """``feed``: ``image`` (uint8 pixels) or ``tensors`` (the model's own input tensor,
        from a v2 request)."""
        key = model if feed == "image" else f"{model}{TENSORS}"
        if model not in self.random:
            raise ModelNotFound("no such model", model=model, served=sorted(self.random))
        self.health.admit()  # a draining replica refuses at once (503: retry elsewhere)
        n = 0 if images.data is None else len(images.data)
        errors = dict(images.errors)
        futs = []
        now_epoch, now_mono = time.time(), time.monotonic()
        for i in range(n):
            m = meta[images.owner[i]]
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
                        None,  # the budget counts this queue's own wait (Triton's rule)
                        self.budget_s[model],
                    )
                )
            except FerryError as exc:  # QueueFull: this request, not the whole call
                metrics.count_rejected(exc.fields.get("reason", "queue_full"))
                futs.append(None)
                errors.setdefault(images.owner[i], exc)
        results = await asyncio.gather(*(f for f in futs if f is not None), return_exceptions=True)
        it = iter(results)
        rows, owner, queue_ms, gpu_ms, bsz = [], [], [], [], []
        for i, f in enumerate(futs):
            if f is None:
                continue
            r = next(it)
            o = images.owner[i]
            if isinstance(r, BaseException):
                errors.setdefault(
                    o, r if isinstance(r, FerryError) else FerryError(f"{type(r).__name__}: {r}")
                )
                continue
            if o in errors:
                continue
            rows.append(r[0])
            owner.append(o)
            queue_ms.append(r[1])
            gpu_ms.append(r[2])
            bsz.append(r[3])
        # a request whose rows partly failed is dropped whole
        keep = [j for j, o in enumerate(owner) if o not in errors]
        data, more = None, ()
        if keep and isinstance(rows[keep[0]], tuple):  # outputs after the first ride in .more
            cols = list(zip(*(rows[j] for j in keep), strict=True))
            data = np.stack(cols[0]).astype(np.float32)
            more = tuple(np.stack(c) for c in cols[1:])
        elif keep:
            data = np.stack([rows[j] for j in keep]).astype(np.float32)
        metrics.observe_items("queue", model, queue_ms)  # each item's own wait
        return Rows(
            images.n_requests,
            data,
            [owner[j] for j in keep],
            errors,
            dict(images.timings_ms),
            {
                "queue": [queue_ms[j] for j in keep],
                "gpu": [gpu_ms[j] for j in keep],
                "batch_size": [float(bsz[j]) for j in keep],
            },
            random_weights=self.random[model],
            more=more,
        )

    async def answer(
        self,
        model: str,
        images: Rows,
        meta: list[RequestMeta],
        specs: list[PostSpec] | None,
        feed: str = "image",
    ) -> Rows | list[Any]:
        """``run``, then -- when postprocessing is fused in here and the caller sent its
        specs -- the answers themselves (softmax and top-k in a worker thread)."""
        logits = await self.run(model, images, meta, feed)
        if specs is None:
            return logits
        if self.post is None:
            raise FerryError("postprocessing is not fused into this inference replica")
        return await asyncio.to_thread(self.post.run, model, logits, specs)

    def signatures(self) -> dict[str, Any]:
        """Every model's own input and output tensors, from its loaded engine."""
        from .v2 import Signature

        return {name: Signature.of(m.engine) for name, m in self.executor.models.items()}

    def status(self) -> dict[str, Any]:
        s = self.executor.stats()
        s["queue_depth"] = len(self.scheduler.queue)
        s["warmup_s"] = self.warmup_s
        s["models"] = {k: {"random_weights": v} for k, v in self.random.items()}
        s["health"] = self.health.snapshot()
        return s


def _stamp_hops(out: Rows | list[Any], arrived: float) -> Rows | list[Any]:
    """Answers made here carry when their call arrived and when it left (wall-clock ms), so
    the ingress can split the hops into the way here and the way back."""
    if isinstance(out, list):
        left = time.time() * 1e3
        for a in out:
            if isinstance(a, dict):
                a["timings_ms"].update(arrived_at=arrived, left_at=left)
    return out


@serve.deployment
class Inference:
    def __init__(self, config: dict[str, Any], preprocess_gpu: Any = None) -> None:
        cfg = PipelineConfig.model_validate(config)
        if not cfg.fusion.inference_in_ingress:  # else the ingress's options hold
            cfg.inference_deployment.apply_in_process()
        self.core = InferenceCore(cfg, preprocess_gpu)

    async def __call__(
        self,
        model: str,
        images: Rows,
        meta: list[RequestMeta],
        specs: list[PostSpec] | None = None,
        feed: str = "image",
    ) -> Rows | list[Any]:
        arrived = time.time() * 1e3
        return _stamp_hops(await self.core.answer(model, images, meta, specs, feed), arrived)

    async def encoded(
        self,
        model: str,
        items: list[tuple[bytes, str | None]],
        meta: list[RequestMeta],
        specs: list[PostSpec] | None = None,
    ) -> Rows | list[Any]:
        arrived = time.time() * 1e3
        images = await self.core.preprocess_here(model, items)
        return _stamp_hops(await self.core.answer(model, images, meta, specs), arrived)

    async def status(self) -> dict[str, Any]:
        return self.core.status()

    async def signatures(self) -> dict[str, Any]:
        return self.core.signatures()

    def check_health(self) -> None:
        self.core.health.check()  # raises: Serve replaces this replica


class _LocalMethod:
    __slots__ = ("fn",)

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def remote(self, *args: Any, **kwargs: Any) -> asyncio.Task:
        return asyncio.ensure_future(self.fn(*args, **kwargs))


class LocalInference:
    """The inference stage inside the calling process, called as its Serve handle is
    (``h.encoded.remote(...)``, ``h.remote(...)``, ``h.status.remote()``, each awaitable):
    with ``fusion.inference_in_ingress`` the ingress replica runs the whole pipeline and
    no call leaves the process."""

    def __init__(self, config: dict[str, Any]) -> None:
        replica = self.replica = Inference.func_or_class(config)
        self.encoded = _LocalMethod(replica.encoded)
        self.status = _LocalMethod(replica.status)
        self.signatures = _LocalMethod(replica.signatures)
        self._call = _LocalMethod(replica.__call__)

    def remote(self, *args: Any, **kwargs: Any) -> asyncio.Task:
        return self._call.remote(*args, **kwargs)
