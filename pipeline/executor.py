"""The GPU actor's core: streams, pool, pinned staging, plans and CUDA graphs per bucket.

    ex = GpuExecutor(ExecutorConfig())
    ex.load(load_model("resnet50", "resnet50"))   # any engine: pipeline/engines/
    ex.warmup()
    p = ex.prepare("resnet50", 37)          # bucket 64: arena reserved, staging slot taken
    r = ex.commit(p, images_uint8)          # enqueued; returns at once
    logits = await r                        # or r.wait()

``prepare`` is admission control: it takes a pinned staging slot (waiting up to
``staging_timeout_s``) and reserves the bucket's whole arena from the pool, or fails with
``ResourceExhausted`` before any work starts; it also finds the batch's route (compute
stream, the plan bound to the arena and its CUDA graph). ``commit`` copies the batch into
the pinned slot and enqueues the copy in, the graph and the copy out (``executor_commit``);
the batch's result completes from its one last event (``executor_completion``: a thread
that waits is woken once, by the device). The slot and the reservation are returned on
every path: success, a failed commit, a device error.

The mode is a class chosen once here (``executor_modes``: ``real``, ``eager``, ``naive``,
the baseline every benchmark reports beside the real path); each part is handed what it
uses -- the models (``executor_models``), the book of counts and failures
(``executor_stats``), the pool, streams, fault injector, completions and enqueue lock.
The model itself is an engine (``pipeline/engines``): nothing here depends on which.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .async_result import AsyncResult
from .config import ExecutorConfig, Settings
from .cuda_wait import host_wait_of
from .device import Backend, StreamSet, select_backend
from .engines.base import Engine, EngineContext, EnginePlan, Feed
from .errors import DeviceError, FerryError, InvalidInput
from .executor_batch import PreparedBatch, check_input
from .executor_commit import ModeParts
from .executor_completion import Completions
from .executor_graphs import BoundGraphs, warmup
from .executor_models import ModelTable
from .executor_modes import Mode, make_mode
from .executor_precision import Precision
from .executor_stats import Counters
from .faults import Injector, resolve
from .health import HealthConfig, ReplicaHealth, probe
from .memory import PinnedRing, make_pool
from .models import repository
from .models.registry import LoadedModel, load_model

logger = logging.getLogger(__name__)
__all__ = ["GpuExecutor", "PreparedBatch"]


class GpuExecutor:
    """Runs model graphs on one device for many concurrent callers."""

    def __init__(
        self,
        config: ExecutorConfig | None = None,
        backend: Backend | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config or ExecutorConfig()
        kind = self.config.backend
        if kind == "auto":
            kind = Settings.from_env().backend or "auto"  # FERRY_BACKEND=numpy forces the CPU path
        self.backend = backend or select_backend(kind, self.config.device_id, self.config.host_wait)
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
        self.completions = Completions(f"ferry-completion-{self.backend.device_id}")
        self.enqueue_lock = threading.Lock()  # held while enqueueing: streams and cuBLAS handles
        self.counters = Counters(clock)  # (clock: when batches end, for health; tests' fake)
        self.faults = Injector(resolve(self.config.faults, Settings.from_env().faults))
        ctx = EngineContext(
            self.backend, self.dtype, self.target, self.config.max_workspace_bytes, self.pool
        )
        self._models = ModelTable(ctx, self.config.buckets)
        parts = ModeParts(
            self.backend,
            self.pool,
            self.streams,
            self._models,
            self.counters,
            self.faults,
            self.completions,
            self.enqueue_lock,
        )
        self.mode: Mode = make_mode(self.config, parts)
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
    def load(
        self,
        loaded: LoadedModel,
        max_batch: int | None = None,
        buckets: tuple[int, ...] | None = None,
        precision: str = "auto",
    ) -> None:
        """Put a model's weights on the device and size the staging ring for it; it is run
        at ``buckets`` (the executor's by default) up to ``max_batch``, in its own compute
        dtype: ``precision`` (the entry's), else the executor's, probed where that is float16
        (``executor_precision``)."""
        m = self._models.build(loaded, max_batch, buckets, precision)
        with self.enqueue_lock:
            self._models.add(m)
            self.mode.fit(self._models.slot_bytes())

    def load_model(
        self, name: str, arch: str, weights: str | None = None, seed: int = 0
    ) -> LoadedModel:
        loaded = load_model(name, arch, weights, seed)
        self.load(loaded)
        return loaded

    def load_entry(self, entry: Any) -> LoadedModel:
        """Load a repository entry (``ModelConfig``) with its engine, checked at startup."""
        loaded = repository.load_entry(entry)
        self.load(loaded, entry.max_batch, entry.buckets, entry.precision)  # (ModelConfig.batch)
        return loaded

    def unload(self, name: str) -> None:
        """Drop a model (one refused at load or warm-up): its bound plans and CUDA graphs,
        and what its engine holds on the device."""
        with self.enqueue_lock:
            m = self._models.pop(name)
            self.mode.forget(name)
        if m is not None:
            m.engine.close()

    @property
    def models(self) -> dict[str, LoadedModel]:
        return self._models.loaded()

    def engine_of(self, name: str) -> Engine:
        return self._models.get(name).engine

    def precision_of(self, name: str) -> Precision:
        """The model's compute dtype and what chose it (its entry, the executor, the probe)."""
        return self._models.get(name).precision

    @property
    def ring(self) -> PinnedRing | None:
        """The pinned staging ring (None in naive mode, which stages nothing)."""
        return self.mode.ring

    @property
    def bound_graphs(self) -> BoundGraphs:
        return self.mode.bound_graphs

    # ------------------------------------------------------------------ planning
    def buckets(self, model: str | None = None) -> tuple[int, ...]:
        """The buckets ``model`` runs at (the executor's, up to its ``max_batch``)."""
        return self._models.buckets_of(model)

    def bucket_for(self, n: int, model: str | None = None) -> int:
        return self._models.bucket_for(n, model)

    def plan(self, model: str, bucket: int, feed: Feed = "image") -> EnginePlan:
        return self._models.plan(model, bucket, feed)

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
        n = int(batch_size)
        bucket = self._models.bucket_for(n, model)
        return self.mode.prepare(model, n, bucket, self._models.plan(model, bucket, feed), timeout)

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
        try:
            return self.mode.commit(prepared, x, label)
        except BaseException as exc:
            prepared.release()
            self.counters.count(failed=1)
            return AsyncResult.failed(self.counters.failure(exc), label)

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
        depth, rounds, runs_all = (
            self.mode.warm_depth,
            self.mode.warm_rounds,
            self.mode.warm_runs_all,
        )
        for name in list(models or self.models):
            if starting is not None:
                starting(name)
            try:
                times.update(
                    warmup(self._models, self.prepare, self.commit, [name], depth, rounds, runs_all)
                )
                self.mode.settle(name)
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
        return self.counters.failure(exc)

    @property
    def last_progress(self) -> float:
        """When a batch last finished (the executor's clock, ``time.monotonic`` unless a
        test passes one; health reads it)."""
        return self.counters.last_progress

    @property
    def device_error(self) -> DeviceError | None:
        """The error that poisoned the device, once a batch has had one."""
        return self.counters.device_error or self.faults.poisoned

    @property
    def in_flight(self) -> int:
        """Batches committed and not yet finished (finishing those whose events are done)."""
        self.completions.reap()
        return self.counters.in_flight

    def replica_health(self, config: HealthConfig, pending: Any) -> ReplicaHealth:
        """The health of a replica built around this executor, ready now (its constructor
        has warmed it); ``pending()`` counts the rows queued for it."""
        return ReplicaHealth(config, self, pending, warm=True, clock=self.counters.clock)

    def probe(self) -> None:
        """``DeviceError`` when the device no longer answers (``health.probe``)."""
        if self.faults.poisoned is not None:
            raise self.faults.poisoned
        probe(self.backend)

    # ------------------------------------------------------------------ stats
    def count(self, **deltas: int) -> None:
        self.counters.count(**deltas)

    def stats(self) -> dict[str, Any]:
        self.completions.reap()
        out: dict[str, Any] = self.counters.snapshot()
        ring = self.ring
        out.update(
            backend=self.backend.name,
            dtype=self.dtype,
            mode=self.config.mode,
            warmed_up=self.warmed_up,
            pool=self.pool.stats().as_dict(),
            bound_graphs=len(self.bound_graphs),
            staging_waits=ring.waits if ring else 0,
            weights_bytes=sum(m.weights_bytes for m in self._models.values()),
            dtypes={m.loaded.name: m.precision.dtype for m in self._models.values()},
            faults_injected=dict(self.faults.injected),
        )
        if self.backend.is_cuda:  # what the context really has (the driver's word)
            wait = host_wait_of(self.backend.device_id)
            out["host_wait"] = wait.mode if wait else "unknown"
        return out

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.completions.close()
        self.streams.synchronize()
        self.mode.close()
        for m in self._models.values():
            m.engine.close()
        self.streams.close()
        self.pool.trim()
