"""The real path of a commit: the batch into its pinned staging slot, host-to-device on the
copy stream, the graph (a CUDA graph replay once one is captured for that bucket, arena
and stream) on a compute stream, device-to-host on the third stream, handing over between
streams with events only; the completion thread finishes the result when the last event
fires and returns the slot and the reservation (on a failure too)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np

from .async_result import AsyncResult
from .device import is_device_array
from .executor_batch import PreparedBatch, stage
from .memory import round_up

if TYPE_CHECKING:
    from .executor import GpuExecutor


def commit_real(
    ex: GpuExecutor, p: PreparedBatch, x: np.ndarray | list[np.ndarray], label: str
) -> AsyncResult:
    plan, slot = p.plan, p.slot
    assert slot is not None and p.reservation is not None
    spec_in = plan.input_spec
    stage_in = slot.view(0, spec_in.shape, spec_in.dtype)
    rows_d = [(i, r) for i, r in enumerate(x) if is_device_array(r)] if isinstance(x, list) else []
    on_device = bool(rows_d) and len(rows_d) == p.n  # rows already on this device, every one
    if not on_device:
        stage(stage_in, x, p.n)  # the host copy into pinned memory, in this thread
    outs_host = []
    off = round_up(spec_in.nbytes, 256)
    for s in plan.output_specs:
        outs_host.append(slot.view(off, s.shape, s.dtype))
        off += round_up(s.nbytes, 256)
    streams = ex.streams
    with ex.enqueue_lock:
        ex.backend.activate()
        compute = streams.compute_for(p.reservation.ptr)  # one stream per arena
        bound, cuda_graph = ex.bound_graphs.get(p, compute, ex.engine_of(p.model))
        if on_device:  # rows already on this device (GPU preprocessing): d2d copies
            with compute:
                for i, r in enumerate(x):
                    bound.input[i] = r
                if p.n < p.bucket:
                    bound.input[p.n :] = 0
        else:  # host rows go up on the copy stream; device rows beside them d2d after
            streams.h2d.copy_h2d(bound.input, stage_in)
            compute.wait(streams.h2d.record())
            with compute:
                for i, r in rows_d:
                    bound.input[i] = r
        if ex.faults.enabled:  # the middle of the batch: its arena and slot are held
            ex.faults.on_commit(p.faults)
        if cuda_graph is not None:
            cuda_graph.launch(compute.raw)
            replay = True
        else:
            bound.run(compute)
            replay = False
            if ex.backend.is_cuda and ex.config.cuda_graphs:
                ex.bound_graphs.capture(p, compute, bound)
        streams.d2h.wait(compute.record())
        for host, dev in zip(outs_host, bound.outputs, strict=True):
            streams.d2h.copy_d2h(host, dev)
        done = streams.d2h.record()
    ex.count(
        batches=1,
        items=p.n,
        padded_items=p.bucket - p.n,
        in_flight=1,
        graph_replays=int(replay),
        eager_runs=int(not replay),
    )
    n = p.n

    keep = [r for _, r in rows_d]  # device rows live until the batch is done
    stall = ex.faults.stall_s(p.faults)

    def finish() -> Any:
        if stall:
            time.sleep(stall)  # an injected hang: this batch does not finish meanwhile
        keep.clear()
        rows = [np.array(h[:n]) for h in outs_host]  # out of the slot before it is reused
        p.release()
        ex.last_progress = time.monotonic()
        ex.count(in_flight=-1)
        return rows[0] if len(rows) == 1 else tuple(rows)

    def failed(exc: BaseException) -> None:
        keep.clear()
        p.release()
        ex.record_failure(exc)
        ex.count(in_flight=-1, failed=1)

    result: AsyncResult = AsyncResult(label or f"{p.model}[{p.n}]")
    ex.watcher.watch(done, finish, result, on_error=failed)
    return result
