"""``mode="naive"``: the baseline every benchmark reports beside the real path --
cudaMalloc of the arena, a synchronous pageable copy in, eager compute, a synchronous copy
out and cudaFree, per call (on the CPU: a fresh arena, a copy, compute, a copy). It holds
no ring, no pool reservation and no shared stream: each thread has its own."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from .async_result import AsyncResult
from .device import Backend, Stream
from .engines.base import Engine, EnginePlan
from .errors import DeviceError, FerryError
from .executor_batch import PreparedBatch, stage
from .executor_graphs import BoundGraphs
from .executor_models import ModelTable
from .executor_stats import Counters


class NaiveMode:
    name = "naive"
    ring = None
    warm_depth = 1
    warm_rounds = 1
    warm_runs_all = True  # (naive is for measuring: every bucket as the real modes run it)

    def __init__(self, backend: Backend, models: ModelTable, counters: Counters) -> None:
        self.backend, self.models, self.counters = backend, models, counters
        self.bound_graphs = BoundGraphs(counters.count)  # stays empty: no graph is bound
        self._tls = threading.local()

    def fit(self, slot_bytes: int) -> None:
        """No staging to size."""

    def prepare(
        self, model: str, n: int, bucket: int, plan: EnginePlan, timeout: float | None
    ) -> PreparedBatch:
        return PreparedBatch(model, n, bucket, plan, None, None, True)

    def _stream(self) -> Stream:
        """This thread's own stream on the executor's device (the baseline shares nothing)."""
        s = getattr(self._tls, "stream", None)
        if s is None:
            s = self._tls.stream = Stream("naive", self.backend)
        return s

    def commit(self, p: PreparedBatch, x: np.ndarray | list[np.ndarray], label: str) -> AsyncResult:
        """The baseline: allocate, copy in synchronously, compute, copy out, free -- per call."""
        try:
            plan = p.plan
            engine = self.models.get(p.model).engine
            padded = np.empty(plan.input_spec.shape, dtype=plan.input_spec.np_dtype)  # pageable
            stage(padded, x, p.n)
            if self.backend.is_cuda:
                rows = self._on_gpu(engine, plan, padded, p.n)
            else:
                arena = np.empty(plan.arena_bytes, dtype=np.uint8)
                bound = engine.bind(plan, arena)
                np.copyto(bound.input, padded)
                bound.run(self._stream())
                rows = [np.array(o[: p.n]) for o in bound.outputs]
            self.counters.count(batches=1, items=p.n, padded_items=p.bucket - p.n, eager_runs=1)
            return AsyncResult.completed(rows[0] if len(rows) == 1 else tuple(rows), label)
        except BaseException as exc:
            self.counters.count(failed=1)
            err = (
                exc if isinstance(exc, FerryError) else DeviceError(f"{type(exc).__name__}: {exc}")
            )
            return AsyncResult.failed(err, label)
        finally:
            p.release()

    def _on_gpu(self, engine: Engine, plan: EnginePlan, padded: np.ndarray, n: int) -> list[Any]:
        import cupy  # the optional GPU backend
        from cupy.cuda import runtime  # optional: cupy

        self.backend.activate()
        mem = cupy.cuda.Memory(plan.arena_bytes)  # cudaMalloc
        arena = cupy.ndarray(
            (plan.arena_bytes,), dtype=cupy.uint8, memptr=cupy.cuda.MemoryPointer(mem, 0)
        )
        bound = engine.bind(plan, arena)
        runtime.memcpy(
            int(bound.input.data.ptr),
            int(padded.ctypes.data),
            padded.nbytes,
            runtime.memcpyHostToDevice,
        )  # synchronous, pageable
        stream = self._stream()
        bound.run(stream)
        stream.synchronize()
        rows = []
        for o in bound.outputs:
            h = np.empty(o.shape, dtype=o.dtype)
            runtime.memcpy(
                int(h.ctypes.data), int(o.data.ptr), h.nbytes, runtime.memcpyDeviceToHost
            )
            rows.append(h[:n])
        del bound, arena, mem  # cudaFree
        return rows

    def settle(self, model: str) -> None:
        """(No graphs here: nothing changes after a warm-up.)"""

    def forget(self, model: str) -> None:
        """Nothing is kept per model."""

    def close(self) -> None:
        """Nothing is held."""
