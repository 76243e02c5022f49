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

``mode="naive"`` is the baseline every benchmark reports beside the real path
(``executor_naive``). The prepared batch and the row checks are ``executor_batch``; bound
graphs, CUDA graph capture and warm-up are ``executor_graphs``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .async_result import AsyncResult, CompletionWatcher
from .config import ExecutorConfig, Settings
from .device import Backend, StreamSet, select_backend
from .engines.base import Engine, EngineContext, EnginePlan, Feed
from .errors import DeviceError, FerryError, InvalidInput, ModelNotFound
from .executor_batch import PreparedBatch, check_input
from .executor_commit import commit_real
from .executor_graphs import BoundGraphs, warmup
from .executor_naive import commit_naive
from .faults import Injector, resolve
from .health import HealthConfig, ReplicaHealth, as_ferry_error, probe
from .memory import PinnedRing, make_pool, round_up
from .models.registry import LoadedModel, load_model

logger = logging.getLogger(__name__)
__all__ = ["GpuExecutor", "PreparedBatch"]


@dataclass
class _Model:
    loaded: LoadedModel
    engine: Engine
    weights_bytes: int
    buckets: tuple[int, ...]  # the executor's, up to the model's max_batch


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
        self.enqueue_lock = threading.Lock()  # held while enqueueing: streams and cuBLAS handles
        self.bound_graphs = BoundGraphs(self.count)
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
        self.faults = Injector(resolve(self.config.faults, Settings.from_env().faults))
        self._device_error: DeviceError | None = None
        self.last_progress = time.monotonic()  # when a batch last finished (health)
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
        with self.enqueue_lock:
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

    def unload(self, name: str) -> None:
        """Drop a model (one refused at load or warm-up): its bound plans and CUDA graphs,
        and what its engine holds on the device."""
        with self.enqueue_lock:
            m = self._models.pop(name, None)
            self.bound_graphs.forget(name)
        if m is not None:
            m.engine.close()

    @property
    def models(self) -> dict[str, LoadedModel]:
        return {k: m.loaded for k, m in self._models.items()}

    def engine_of(self, name: str) -> Engine:
        return self._model(name).engine

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
            faults = self.faults.next_batch()  # (an injected oom_reserve raises here)
            res = self.pool.reserve(plan.arena_bytes)
        except BaseException:
            slot.release()
            raise
        prepared = PreparedBatch(model, int(batch_size), bucket, plan, res, slot, False)
        prepared.faults = faults
        return prepared

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
            x = check_input(prepared, host_batch, self.backend)
        except BaseException:
            prepared.release()
            raise
        if prepared.naive:
            return commit_naive(self, prepared, x, label)
        try:
            return commit_real(self, prepared, x, label)
        except BaseException as exc:
            prepared.release()
            self.count(failed=1)
            return AsyncResult.failed(self.record_failure(exc), label)

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

    def warmup(
        self,
        models: list[str] | None = None,
        starting: Callable[[str], None] | None = None,
        failed: Callable[[str, Exception], None] | None = None,
    ) -> dict[str, float]:
        """Run every bucket of every model (``executor_graphs.warmup``); ready after it.
        ``starting(name)`` is told before each model; given ``failed``, a model whose
        warm-up fails is handed to it (``failed(name, exc)``) and the others warm on."""
        self.faults.warmup_delay()
        times: dict[str, float] = {}
        for name in list(models or self.models):
            if starting is not None:
                starting(name)
            try:
                times.update(warmup(self, [name]))
            except Exception as exc:
                if failed is None:
                    raise
                failed(name, exc)
        self.warmed_up = True
        self.faults.armed = True  # injected faults count batches from here
        return times

    # ------------------------------------------------------------------ health
    def record_failure(self, exc: BaseException) -> FerryError:
        """A batch's failure as Ferry's error; a device error poisons the executor."""
        err = as_ferry_error(exc)
        self.last_progress = time.monotonic()
        if isinstance(err, DeviceError) and self._device_error is None:
            logger.error("device error, the executor is poisoned: %s", err)
            self._device_error = err
        return err

    @property
    def device_error(self) -> DeviceError | None:
        """The error that poisoned the device, once a batch has had one."""
        return self._device_error or self.faults.poisoned

    @property
    def in_flight(self) -> int:
        return self._n["in_flight"]

    def replica_health(self, config: HealthConfig, pending: Any) -> ReplicaHealth:
        """The health of a replica built around this executor, ready now (its constructor
        has warmed it); ``pending()`` counts the rows queued for it."""
        return ReplicaHealth(config, self, pending, warm=True)

    def probe(self) -> None:
        """``DeviceError`` when the device no longer answers (``health.probe``)."""
        if self.faults.poisoned is not None:
            raise self.faults.poisoned
        probe(self.backend)

    # ------------------------------------------------------------------ stats
    def count(self, **deltas: int) -> None:
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
            bound_graphs=len(self.bound_graphs),
            staging_waits=self.ring.waits if self.ring else 0,
            weights_bytes=sum(m.weights_bytes for m in self._models.values()),
            faults_injected=dict(self.faults.injected),
        )
        return out

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.watcher.close()
        self.streams.synchronize()
        self.bound_graphs.clear()
        for m in self._models.values():
            m.engine.close()
        self.streams.close()
        if self.ring is not None:
            self.ring.close()
        self.pool.trim()
