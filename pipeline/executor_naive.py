"""``mode="naive"``: the baseline every benchmark reports beside the real path --
cudaMalloc of the arena, a synchronous pageable copy in, eager compute, a synchronous copy
out and cudaFree, per call (on the CPU: a fresh arena, a copy, compute, a copy)."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import numpy as np

from .async_result import AsyncResult
from .device import Stream
from .errors import DeviceError, FerryError
from .executor_batch import PreparedBatch, stage

if TYPE_CHECKING:
    from .executor import GpuExecutor

_TLS = threading.local()


def _stream(ex: GpuExecutor) -> Stream:
    """This thread's own stream on the executor's device (the baseline shares nothing)."""
    streams = getattr(_TLS, "streams", None)
    if streams is None:
        streams = _TLS.streams = {}
    s = streams.get(id(ex))
    if s is None:
        s = streams[id(ex)] = Stream("naive", ex.backend)
    return s


def commit_naive(
    ex: GpuExecutor, p: PreparedBatch, x: np.ndarray | list[np.ndarray], label: str
) -> AsyncResult:
    """The baseline: allocate, copy in synchronously, compute, copy out, free -- per call."""
    try:
        plan = p.plan
        engine = ex.engine_of(p.model)
        padded = np.empty(plan.input_spec.shape, dtype=plan.input_spec.np_dtype)  # pageable
        stage(padded, x, p.n)
        if ex.backend.is_cuda:
            import cupy
            from cupy.cuda import runtime

            ex.backend.activate()
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
            stream = _stream(ex)
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
            bound = engine.bind(plan, arena)
            np.copyto(bound.input, padded)
            bound.run(_stream(ex))
            rows = [np.array(o[: p.n]) for o in bound.outputs]
        ex.count(batches=1, items=p.n, padded_items=p.bucket - p.n, eager_runs=1)
        return AsyncResult.completed(rows[0] if len(rows) == 1 else tuple(rows), label)
    except BaseException as exc:
        ex.count(failed=1)
        err = exc if isinstance(exc, FerryError) else DeviceError(f"{type(exc).__name__}: {exc}")
        return AsyncResult.failed(err, label)
    finally:
        p.release()
