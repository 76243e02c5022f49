"""A batch lease that dies in the cyclic collector, and what a refusal leaves for it.

Under the GPU overload pulse replicas died of a SIGSEGV in cuEventQuery: a GPU-queue
refusal's traceback held the call's rows (and their batch's lease) in a reference cycle;
the collector finalizes such a cycle in no fixed order, and cupy.cuda.Event is a Python
class whose ``__del__`` destroys its CUDA handle -- so the lease could query an event
that was already gone. Here, on the numpy backend, ``CupyLikeEvent`` behaves as
cupy.cuda.Event does at finalization (its ``__del__`` ends the handle) and counts every use
after it; tests/gpu/test_lease_gc_gpu.py runs the same life on a real CUDA event.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import weakref

import numpy as np

from pipeline.async_result import CompletionWatcher
from pipeline.batch_scheduler import BatchScheduler
from pipeline.config import PipelineConfig
from pipeline.device import Backend, Event
from pipeline.errors import ResourceExhausted
from pipeline.imaging import encode_jpeg
from pipeline.memory import make_pool
from pipeline.memory import pool as pool_mod
from pipeline.preprocess_gpu import fitter as fitter_mod
from pipeline.preprocess_gpu.stage import PreprocessGpuCore
from pipeline.queue_budget import RateMeter
from pipeline.stages.build import build_inference
from pipeline.stages.decode import PreprocessStage
from pipeline.stages.messages import Encoded, RequestMeta

CPU = Backend("numpy")


class CupyLikeEvent:
    """cupy.cuda.Event's finalization: ``__del__`` destroys the handle, ``ptr`` stays."""

    used_after_destroy = 0

    def __init__(self, done: bool) -> None:
        self.ptr, self.alive, self._done = 1, True, done

    def __del__(self) -> None:
        self.alive = False  # runtime.eventDestroy(self.ptr)

    @property
    def done(self) -> bool:
        if not self.alive:
            CupyLikeEvent.used_after_destroy += 1
        return self._done

    def synchronize(self) -> None:
        if not self.alive:
            CupyLikeEvent.used_after_destroy += 1


class Owner:
    """What a cupy row view holds of its batch (UnownedMemory(owner=lease)), GC-tracked."""

    def __init__(self, lease: object) -> None:
        self.lease = lease


def test_a_lease_collected_in_a_cycle_never_uses_its_finalized_event():
    held_before = set(fitter_mod._HELD)  # (leases other tests still hold)
    pool = make_pool(CPU, 1 << 24)
    watcher = CompletionWatcher("t")
    CupyLikeEvent.used_after_destroy = 0
    gc.collect()
    gc.disable()
    try:
        for k in range(40):
            # the event made first: the collector then finalizes it before the lease, the
            # order a young collection gives a serving process's cycles
            ev = Event(CupyLikeEvent(done=k % 2 == 0))  # odd: still running, for the watcher
            lease = fitter_mod._Lease(pool.reserve(4096), watcher)
            lease.after = ev
            cycle = [Owner(lease)]
            cycle.append(cycle)  # a traceback's frame holding the call's rows
            del ev, lease, cycle
            gc.collect()
    finally:
        gc.enable()
    watcher.close()
    assert CupyLikeEvent.used_after_destroy == 0
    assert pool.bytes_in_use == 0 and set(fitter_mod._HELD) <= held_before


def test_a_gpu_queue_refusal_frees_the_calls_batch_without_the_collector():
    cfg = PipelineConfig.model_validate(
        {
            "placement": "four_stage",
            "models": [{"name": "digits", "arch": "digits"}],
            "executor": {"backend": "numpy", "buckets": [1, 8], "max_in_flight": 2},
            "transport": {"staging_slots": 2, "staging_slot_bytes": 1 << 20},
            "batching": {
                "max_wait_ms": 5,
                "queue_policy": {"timeout_ms": 1000},
            },
        }
    )
    stage = build_inference(cfg)
    core = PreprocessGpuCore(
        cfg, PreprocessStage(cfg, fitted=False), local=True, pool=stage.executor.pool, backend=CPU
    )
    t = core.targets["digits"]
    blobs = [encode_jpeg(np.full((20, 30, 1), 40 * i, np.uint8)) for i in range(4)]
    imgs = [Encoded.checked(b, "image/jpeg", t, 1 << 24, 1 << 30) for b in blobs]
    leases = []
    output = core.fitter.output

    def watched(target, n):
        out, lease = output(target, n)
        leases.append(weakref.ref(lease))
        return out, lease

    core.fitter.output = watched

    async def call():
        rows = await core.process("digits", imgs)  # views of one leased batch
        # a queue measured to drain 1 row/s: the 2nd request on waits past the 1 s budget
        stage.scheduler.queue.rates["digits"] = RateMeter(rate=1.0, samples=3, mean_n=1, mean_dt=1)
        out = await stage.logits("digits", rows, [RequestMeta(f"r{i}") for i in range(4)])
        return {o: e.fields.get("reason") for o, e in out.errors.items()}

    gc.collect()
    gc.disable()  # reference counting alone from here
    try:
        errors = asyncio.run(call())
        # the stage's pool thread holds its call's result for a moment after handing it on
        until = time.monotonic() + 5.0
        while any(r() is not None for r in leases) and time.monotonic() < until:
            time.sleep(0.01)
        alive = [r for r in leases if r() is not None]
        in_use = stage.executor.pool.bytes_in_use
    finally:
        gc.enable()
        core.close()
    assert errors and set(errors.values()) == {"queue_budget"}  # the refusal did happen
    assert leases and not alive and in_use == 0


def test_pool_stats_survives_a_collection_that_releases_into_the_pool(monkeypatch):
    pool = make_pool(CPU, 1 << 24)
    gc.collect()
    gc.disable()
    try:
        cycle: list = [fitter_mod._Lease(pool.reserve(4096), CompletionWatcher("t"))]
        cycle.append(cycle)  # garbage whose lease gives its bytes back when collected
        del cycle
        made = pool_mod.PoolStats.__init__

        def collecting(self, *a, **kw):  # a collection starts as the stats object is made
            gc.collect()
            made(self, *a, **kw)

        monkeypatch.setattr(pool_mod.PoolStats, "__init__", collecting)
        th = threading.Thread(target=pool.stats, daemon=True)
        th.start()
        th.join(5)
    finally:
        gc.enable()
    assert not th.is_alive()  # before: it waited on the pool's lock that it held itself
    assert pool.bytes_in_use == 0


class Rows:
    """Device rows a failed batch was working on (GC-tracked, as cupy arrays are)."""


def test_a_failed_batch_leaves_its_rows_to_reference_counting():
    rows: list = []

    async def run_batch(batch):
        held = Rows()  # in this frame when it raises: the exception's traceback holds it
        rows.append(weakref.ref(held))
        raise ResourceExhausted("memory pool limit reached", requested_bytes=1 << 20)

    async def main():
        s = BatchScheduler(run_batch, max_batch_size=4, max_wait_ms=1, max_queue=16)
        got = await asyncio.gather(
            *(s.submit_nowait(i, "m") for i in range(4)), return_exceptions=True
        )
        await s.close()
        return [type(e).__name__ for e in got]

    gc.collect()
    gc.disable()
    try:
        names = asyncio.run(main())
        alive = [r for r in rows if r() is not None]
    finally:
        gc.enable()
    assert rows and names == ["ResourceExhausted"] * 4  # every item heard of the failure
    assert not alive  # before: the exception, traceback and all, kept them until a collection
