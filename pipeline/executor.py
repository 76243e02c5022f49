"""The GPU actor's core: streams, pool, pinned staging, plans and CUDA graphs per bucket.

    ex = GpuExecutor(ExecutorConfig())
    ex.load(load_model("resnet50", "resnet50"))   # any engine: pipeline/engines/
    ex.warmup()
    p = ex.prepare("resnet50", 37)          # bucket 64: arena reserved, staging slot taken
    r = ex.commit(p, images_uint8)          # enqueued; returns at once
    logits = await r                        # or r.wait()

``prepare`` is admission control: it takes a pinned staging slot (waiting up to
``staging_timeout_s``) and reserves the bucket's whole arena from the pool, or fails with
``ResourceExhausted`` before any work starts. ``commit`` copies the batch into the pinned
slot, then enqueues host-to-device on the copy stream, the graph (a CUDA graph replay once
one is captured for that bucket and arena) on a compute stream, and device-to-host on the
third stream, handing over between streams with events only; one completion thread
finishes the result when the last event fires. The slot and the reservation are returned
on every path: success, a failed commit, a device error.

The model itself is an engine (``pipeline/engines``): the executor asks it for a plan per
bucket and feed, binds the plan to the reserved arena and enqueues it; nothing here depends
on which engine it is.

``mode="naive"`` is the baseline every benchmark reports beside the real path: cudaMalloc
of the arena, a synchronous pageable copy in, eager compute, a synchronous copy out and
cudaFree, per call.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from .async_result import AsyncResult, CompletionWatcher
from .config import ExecutorConfig, Settings
from .device import Backend, Stream, StreamSet, is_device_array, select_backend
from .engines.base import BoundModel, Engine, EngineContext, EnginePlan, Feed
from .errors import DeviceError, FerryError, InvalidInput, ModelNotFound
from .memory import PinnedRing, PinnedSlot, Reservation, make_pool, round_up
from .models.registry import LoadedModel, load_model

logger = logging.getLogger(__name__)
MAX_BOUND = 256  # bound graphs (and their CUDA graphs) kept, least recently used dropped


@dataclass
class _Model:
    loaded: LoadedModel
    engine: Engine
    weights_bytes: int
    buckets: tuple[int, ...]  # the executor's, up to the model's max_batch


class PreparedBatch:
    """What ``prepare`` reserved for one batch. Committing hands it over; else release it."""

    __slots__ = (
        "model",
        "n",
        "bucket",
        "plan",
        "reservation",
        "slot",
        "naive",
        "_lock",
        "_released",
        "committed",
    )

    def __init__(
        self,
        model: str,
        n: int,
        bucket: int,
        plan: EnginePlan,
        reservation: Reservation | None,
        slot: PinnedSlot | None,
        naive: bool,
    ) -> None:
        self.model = model
        self.n = n
        self.bucket = bucket
        self.plan = plan
        self.reservation = reservation
        self.slot = slot
        self.naive = naive
        self._lock = threading.Lock()
        self._released = False
        self.committed = False

    def release(self) -> None:
        """Give back the staging slot and the reservation; safe to call more than once."""
        with self._lock:
            if self._released:
                return
            self._released = True
        if self.reservation is not None:
            self.reservation.release()
        if self.slot is not None:
            self.slot.release()

    @property
    def released(self) -> bool:
        return self._released

    def __enter__(self) -> PreparedBatch:
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self.committed:
            self.release()


class GpuExecutor:
    """Runs model graphs on one device for many concurrent callers."""

    def __init__(
        self, config: ExecutorConfig | None = None, backend: Backend | None = None
    ) -> None:
        self.config = config or ExecutorConfig()
        kind = self.config.backend
        if kind == "auto":
            kind = Settings.from_env().backend or "auto"  # FERRY_BACKEND=numpy forces the CPU path
        self.backend = backend or select_backend(kind, self.config.device_id)
        self.backend.activate()
        self.dtype = (
            self.backend.compute_dtype.name if self.config.dtype == "auto" else self.config.dtype
        )
        self.target = "cuda" if self.backend.is_cuda else "host"
        self.naive = self.config.mode == "naive"
        self.pool = make_pool(
            self.backend, self.config.pool_limit_bytes, self.config.pool_limit_fraction
        )
        self.streams = StreamSet(self.backend, self.config.compute_streams)
        self.watcher = CompletionWatcher(f"ferry-completion-{self.backend.device_id}")
        self.ring: PinnedRing | None = None
        self._models: dict[str, _Model] = {}
        self._lock = threading.Lock()  # held while enqueueing: streams and cuBLAS handles
        self._bound: OrderedDict[tuple, tuple[BoundModel, Any]] = OrderedDict()
        self._tls = threading.local()
        self._stats_lock = threading.Lock()
        self._n = {
            "batches": 0,
            "items": 0,
            "padded_items": 0,
            "graph_replays": 0,
            "eager_runs": 0,
            "captures": 0,
            "failed": 0,
            "in_flight": 0,
            "max_in_flight_seen": 0,
        }
        self.warmed_up = False
        self._closed = False
        logger.info(
            "executor on %s, dtype %s, mode %s, pool limit %.1f GiB",
            self.backend.describe(),
            self.dtype,
            self.config.mode,
            self.pool.limit_bytes / 2**30,
        )

    # ------------------------------------------------------------------ models
    def load(self, loaded: LoadedModel, max_batch: int | None = None) -> None:
        """Put a model's weights on the device and size the staging ring for it; it is run
        at the executor's buckets up to ``max_batch``."""
        engine = loaded.engine
        engine.load(
            EngineContext(
                self.backend, self.dtype, self.target, self.config.max_workspace_bytes, self.pool
            )
        )
        inputs = engine.inputs
        if len(inputs) != 1:
            raise InvalidInput(
                "models with more than one input tensor are not served yet",
                model=loaded.name,
                inputs=[t.name for t in inputs],
            )
        wbytes = engine.weights_bytes
        buckets = tuple(b for b in self.config.buckets if max_batch is None or b <= max_batch)
        if not buckets:
            raise InvalidInput(
                "max_batch is below the smallest bucket",
                model=loaded.name,
                max_batch=max_batch,
                buckets=self.config.buckets,
            )
        with self._lock:
            self._models[loaded.name] = _Model(loaded, engine, wbytes, buckets)
            self._size_ring()
        logger.info(
            "loaded %s (%s engine, %s): %.1f MB of weights",
            loaded.name,
            engine.name,
            loaded.source,
            wbytes / 1e6,
        )

    def load_model(
        self, name: str, arch: str, weights: str | None = None, seed: int = 0
    ) -> LoadedModel:
        loaded = load_model(name, arch, weights, seed)
        self.load(loaded)
        return loaded

    def load_entry(self, entry: Any) -> LoadedModel:
        """Load a repository entry (``ModelConfig``) with its engine, checked at startup."""
        from .models.repository import load_entry

        loaded = load_entry(entry)
        self.load(loaded, entry.max_batch)
        return loaded

    @property
    def models(self) -> dict[str, LoadedModel]:
        return {k: m.loaded for k, m in self._models.items()}

    def _model(self, name: str) -> _Model:
        m = self._models.get(name)
        if m is None:
            raise ModelNotFound("no such model", model=name, served=sorted(self._models))
        return m

    def _size_ring(self) -> None:
        need = max(
            self._slot_bytes(self.plan(name, m.buckets[-1], feed))
            for name, m in self._models.items()
            for feed in m.engine.feeds
        )
        if self.ring is not None and self.ring.slot_bytes >= need:
            return
        if self.ring is not None and self.ring.available() != self.ring.slots:
            raise RuntimeError("cannot grow the staging ring while batches are in flight")
        old = self.ring
        self.ring = PinnedRing(self.backend, need, self.config.max_in_flight)
        if old is not None:
            old.close()

    @staticmethod
    def _slot_bytes(plan: EnginePlan) -> int:
        return round_up(plan.input_spec.nbytes, 256) + sum(
            round_up(s.nbytes, 256) for s in plan.output_specs
        )

    # ------------------------------------------------------------------ planning
    def buckets(self, model: str | None = None) -> tuple[int, ...]:
        """The buckets ``model`` runs at (the executor's, up to its ``max_batch``)."""
        return self.config.buckets if model is None else self._model(model).buckets

    def bucket_for(self, n: int, model: str | None = None) -> int:
        buckets = self.buckets(model)
        for b in buckets:
            if b >= n:
                return b
        raise InvalidInput(
            "batch larger than the largest bucket", batch_size=n, max_bucket=buckets[-1]
        )

    def plan(self, model: str, bucket: int, feed: Feed = "image") -> EnginePlan:
        engine = self._model(model).engine
        return engine.plan(bucket, engine.feed_for(feed))

    # ------------------------------------------------------------------ phase one
    def prepare(
        self, model: str, batch_size: int, timeout: float | None = None, feed: Feed = "image"
    ) -> PreparedBatch:
        """Reserve what a batch of ``batch_size`` needs, or fail now (``ResourceExhausted``).

        ``feed``: ``image`` (uint8 pixels from the image path) or ``tensors`` (the model's
        own input tensor, as a v2 request sends it); the same for the built-in models."""
        if self._closed:
            raise RuntimeError("executor is closed")
        if not isinstance(batch_size, int | np.integer) or batch_size < 1:
            raise InvalidInput("batch_size must be a positive integer", batch_size=batch_size)
        bucket = self.bucket_for(int(batch_size), model)
        plan = self.plan(model, bucket, feed)
        if self.naive:
            return PreparedBatch(model, int(batch_size), bucket, plan, None, None, True)
        assert self.ring is not None
        slot = self.ring.acquire(self.config.staging_timeout_s if timeout is None else timeout)
        try:
            res = self.pool.reserve(plan.arena_bytes)
        except BaseException:
            slot.release()
            raise
        return PreparedBatch(model, int(batch_size), bucket, plan, res, slot, False)

    # ------------------------------------------------------------------ phase two
    def commit(
        self, prepared: PreparedBatch, host_batch: np.ndarray, label: str = ""
    ) -> AsyncResult:
        """Enqueue the batch; the result is the model's output rows for the batch's items.

        Bad input raises ``InvalidInput`` here (the reservation already returned); a
        failure while enqueueing or on the device arrives through the result.
        """
        if prepared.committed or prepared.released:
            raise RuntimeError("a prepared batch is committed once")
        prepared.committed = True
        try:
            x = self._check_input(prepared, host_batch)
        except BaseException:
            prepared.release()
            raise
        if prepared.naive:
            return self._commit_naive(prepared, x, label)
        try:
            return self._commit_real(prepared, x, label)
        except BaseException as exc:
            prepared.release()
            self._count(failed=1)
            err = (
                exc if isinstance(exc, FerryError) else DeviceError(f"{type(exc).__name__}: {exc}")
            )
            return AsyncResult.failed(err, label)

    def _check_input(self, p: PreparedBatch, x: Any) -> np.ndarray | list[np.ndarray]:
        """An array [n, *item], or a list of n arrays [*item] (copied row by row into the
        staging slot, which saves stacking them first)."""
        spec = p.plan.input_spec
        item = tuple(spec.shape[1:])
        if isinstance(x, list | tuple):
            if len(x) != p.n:
                raise InvalidInput("batch has the wrong number of rows", rows=len(x), expected=p.n)
            on_device = bool(x) and is_device_array(x[0])
            mixed = on_device and not all(is_device_array(r) for r in x)
            if on_device and (p.naive or mixed or not self.backend.is_cuda):
                # the baseline and the CPU take host rows, and so does a batch that mixes
                # device rows with host rows (v2 tensors beside GPU-decoded images)
                x = [r.get() if is_device_array(r) else r for r in x]
                on_device = False
            for r in x:
                if (
                    not (is_device_array(r) if on_device else isinstance(r, np.ndarray))
                    or tuple(r.shape) != item
                    or r.dtype != spec.np_dtype
                ):
                    raise InvalidInput(
                        "a row does not match the model's input",
                        shape=getattr(r, "shape", None),
                        dtype=str(getattr(r, "dtype", type(r).__name__)),
                        expected=item,
                        expected_dtype=spec.dtype,
                    )
            return list(x)
        if not isinstance(x, np.ndarray):
            raise InvalidInput(
                "a batch must be a numpy array or a list of rows", got=type(x).__name__
            )
        want = (p.n, *item)
        if tuple(x.shape) != want:
            raise InvalidInput(
                "batch shape does not match the prepared batch", shape=tuple(x.shape), expected=want
            )
        if x.dtype != spec.np_dtype:
            raise InvalidInput(
                "batch dtype does not match the model's input",
                dtype=x.dtype.name,
                expected=spec.dtype,
            )
        return x

    @staticmethod
    def _stage(dst: np.ndarray, x: np.ndarray | list[np.ndarray], n: int) -> None:
        if isinstance(x, list):
            for i, r in enumerate(x):
                dst[i] = r
        else:
            dst[:n] = x
        if n < len(dst):
            dst[n:] = 0

    def _commit_real(
        self, p: PreparedBatch, x: np.ndarray | list[np.ndarray], label: str
    ) -> AsyncResult:
        plan, slot = p.plan, p.slot
        assert slot is not None and p.reservation is not None
        spec_in = plan.input_spec
        stage_in = slot.view(0, spec_in.shape, spec_in.dtype)
        on_device = isinstance(x, list) and bool(x) and is_device_array(x[0])
        if not on_device:
            self._stage(stage_in, x, p.n)  # the host copy into pinned memory, in this thread
        outs_host = []
        off = round_up(spec_in.nbytes, 256)
        for s in plan.output_specs:
            outs_host.append(slot.view(off, s.shape, s.dtype))
            off += round_up(s.nbytes, 256)
        streams = self.streams
        with self._lock:
            self.backend.activate()
            compute = streams.next_compute()
            bound, cuda_graph = self._bound_graph(p, compute)
            if on_device:  # rows already on this device (GPU preprocessing): d2d copies
                with compute:
                    for i, r in enumerate(x):
                        bound.input[i] = r
                    if p.n < p.bucket:
                        bound.input[p.n :] = 0
            else:
                streams.h2d.copy_h2d(bound.input, stage_in)
                compute.wait(streams.h2d.record())
            if cuda_graph is not None:
                cuda_graph.launch(compute.raw)
                replay = True
            else:
                bound.run(compute)
                replay = False
                if self.backend.is_cuda and self.config.cuda_graphs:
                    self._capture(p, compute, bound)
            streams.d2h.wait(compute.record())
            for host, dev in zip(outs_host, bound.outputs, strict=True):
                streams.d2h.copy_d2h(host, dev)
            done = streams.d2h.record()
        self._count(
            batches=1,
            items=p.n,
            padded_items=p.bucket - p.n,
            in_flight=1,
            graph_replays=int(replay),
            eager_runs=int(not replay),
        )
        n = p.n

        keep = list(x) if on_device else []  # device rows live until the batch is done

        def finish() -> Any:
            keep.clear()
            rows = [np.array(h[:n]) for h in outs_host]  # out of the slot before it is reused
            p.release()
            self._count(in_flight=-1)
            return rows[0] if len(rows) == 1 else tuple(rows)

        def failed(_exc: BaseException) -> None:
            keep.clear()
            p.release()
            self._count(in_flight=-1, failed=1)

        result: AsyncResult = AsyncResult(label or f"{p.model}[{p.n}]")
        self.watcher.watch(done, finish, result, on_error=failed)
        return result

    def _key(self, p: PreparedBatch, compute: Stream) -> tuple:
        assert p.reservation is not None
        return (p.model, p.bucket, p.plan.feed, p.reservation.ptr, compute.name)

    def _bound_graph(self, p: PreparedBatch, compute: Stream) -> tuple[BoundModel, Any]:
        assert p.reservation is not None
        key = self._key(p, compute)
        hit = self._bound.get(key)
        if hit is not None:
            self._bound.move_to_end(key)
            return hit
        bound = self._model(p.model).engine.bind(p.plan, p.reservation.buffer)
        self._bound[key] = (bound, None)
        while len(self._bound) > MAX_BOUND:
            self._bound.popitem(last=False)
        return bound, None

    def _capture(self, p: PreparedBatch, compute: Stream, bound: BoundModel) -> None:
        """Record the bound graph as a CUDA graph for the next batch that gets this arena."""
        key = self._key(p, compute)
        try:
            graph = bound.capture(compute)
        except Exception:
            logger.exception(
                "CUDA graph capture failed for %s bucket %d; staying eager", p.model, p.bucket
            )
            return
        self._bound[key] = (bound, graph)
        self._count(captures=1)

    def _naive_stream(self) -> Stream:
        s = getattr(self._tls, "stream", None)
        if s is None:
            s = self._tls.stream = Stream("naive", self.backend)
        return s

    def _commit_naive(
        self, p: PreparedBatch, x: np.ndarray | list[np.ndarray], label: str
    ) -> AsyncResult:
        """The baseline: allocate, copy in synchronously, compute, copy out, free -- per call."""
        try:
            plan = p.plan
            model = self._model(p.model)
            padded = np.empty(plan.input_spec.shape, dtype=plan.input_spec.np_dtype)  # pageable
            self._stage(padded, x, p.n)
            if self.backend.is_cuda:
                import cupy
                from cupy.cuda import runtime

                self.backend.activate()
                mem = cupy.cuda.Memory(plan.arena_bytes)  # cudaMalloc
                arena = cupy.ndarray(
                    (plan.arena_bytes,), dtype=cupy.uint8, memptr=cupy.cuda.MemoryPointer(mem, 0)
                )
                bound = model.engine.bind(plan, arena)
                runtime.memcpy(
                    int(bound.input.data.ptr),
                    int(padded.ctypes.data),
                    padded.nbytes,
                    runtime.memcpyHostToDevice,
                )  # synchronous, pageable
                stream = self._naive_stream()
                bound.run(stream)
                stream.synchronize()
                rows = []
                for o in bound.outputs:
                    h = np.empty(o.shape, dtype=o.dtype)
                    runtime.memcpy(
                        int(h.ctypes.data), int(o.data.ptr), h.nbytes, runtime.memcpyDeviceToHost
                    )
                    rows.append(h[: p.n])
                del bound, arena, mem  # cudaFree
            else:
                arena = np.empty(plan.arena_bytes, dtype=np.uint8)
                bound = model.engine.bind(plan, arena)
                np.copyto(bound.input, padded)
                bound.run(self._naive_stream())
                rows = [np.array(o[: p.n]) for o in bound.outputs]
            self._count(batches=1, items=p.n, padded_items=p.bucket - p.n, eager_runs=1)
            return AsyncResult.completed(rows[0] if len(rows) == 1 else tuple(rows), label)
        except BaseException as exc:
            self._count(failed=1)
            err = (
                exc if isinstance(exc, FerryError) else DeviceError(f"{type(exc).__name__}: {exc}")
            )
            return AsyncResult.failed(err, label)
        finally:
            p.release()

    # ------------------------------------------------------------------ conveniences
    def infer(
        self, model: str, batch: np.ndarray, timeout: float | None = None, feed: Feed = "image"
    ) -> np.ndarray:
        """Run a whole host batch (split into the largest bucket) and wait for the rows
        (a tuple of them, one per output, for a model with several outputs)."""
        top = self.buckets(model)[-1]
        results = []
        for i in range(0, len(batch), top):
            chunk = np.ascontiguousarray(batch[i : i + top])
            p = self.prepare(model, len(chunk), feed=feed)
            results.append(self.commit(p, chunk))
        parts = [r.wait(timeout) for r in results]
        if isinstance(parts[0], tuple):
            return tuple(np.concatenate(rows) for rows in zip(*parts, strict=True))  # type: ignore[return-value]
        return np.concatenate(parts)

    def warmup(self, models: list[str] | None = None) -> dict[str, float]:
        """Plan every bucket and run it -- twice on the GPU, so its CUDA graphs are captured
        (one per in-flight arena) and replayed once. Small buckets first, so the pool's
        blocks for each bucket are exact fits that later batches get back."""
        times: dict[str, float] = {}
        gpu = self.backend.is_cuda and not self.naive
        depth = self.config.max_in_flight if gpu else 1  # one arena per in-flight batch to capture
        for name in models or list(self._models):
            t0 = time.perf_counter()
            for feed in self._model(name).engine.feeds:
                item = self.plan(name, 1, feed).input_spec
                for bucket in self._model(name).buckets:
                    for _round in range(2 if gpu else 1):
                        prepared = [self.prepare(name, bucket, feed=feed) for _ in range(depth)]
                        zeros = np.zeros((bucket, *item.shape[1:]), dtype=item.np_dtype)
                        for r in [self.commit(p, zeros) for p in prepared]:
                            r.wait()
            times[name] = time.perf_counter() - t0
            logger.info(
                "warmed up %s: %d buckets in %.2f s", name, len(self.buckets(name)), times[name]
            )
        self.warmed_up = True
        return times

    # ------------------------------------------------------------------ stats
    def _count(self, **deltas: int) -> None:
        with self._stats_lock:
            for k, v in deltas.items():
                self._n[k] += v
            if self._n["in_flight"] > self._n["max_in_flight_seen"]:
                self._n["max_in_flight_seen"] = self._n["in_flight"]

    def stats(self) -> dict[str, Any]:
        with self._stats_lock:
            out: dict[str, Any] = dict(self._n)
        out.update(
            backend=self.backend.name,
            dtype=self.dtype,
            mode=self.config.mode,
            warmed_up=self.warmed_up,
            pool=self.pool.stats().as_dict(),
            bound_graphs=len(self._bound),
            staging_waits=self.ring.waits if self.ring else 0,
            weights_bytes=sum(m.weights_bytes for m in self._models.values()),
        )
        return out

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.watcher.close()
        self.streams.synchronize()
        self._bound.clear()
        for m in self._models.values():
            m.engine.close()
        self.streams.close()
        if self.ring is not None:
            self.ring.close()
        self.pool.trim()
