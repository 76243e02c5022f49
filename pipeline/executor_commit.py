"""The staged path of the ``real`` and ``eager`` modes: a pinned staging slot and the
bucket's arena reserved in ``prepare``, with the batch's route -- its compute stream, the
plan bound to its arena and that arena's CUDA graph, the slot's views and events -- found
there too (cached: nothing is made for a batch whose bucket, arena and slot were seen
before). ``commit`` copies the rows into the slot and enqueues, under the enqueue lock:

* one stream per in-flight batch (``compute_streams >= max_in_flight``, as torch's own
  loop runs): host-to-device, the graph launch and device-to-host on the arena's compute
  stream, then the slot's one event -- ``memcpyAsync``, ``cudaGraphLaunch``,
  ``memcpyAsync``, ``cudaEventRecord``;
* fewer compute streams than batches in flight: the copies on the copy streams, handed
  over with the slot's own events (made once per slot, recorded again by each batch), so
  the copies of one batch overlap the compute of another.

The batch's result completes from its last event (``executor_completion``); the slot and
the reservation come back on every path.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from .async_result import AsyncResult
from .config import ExecutorConfig
from .device import COMPLETE, Backend, Event, Stream, StreamSet, is_device_array
from .engines.base import BoundModel, EnginePlan
from .executor_arenas import KeptArenas
from .executor_batch import PreparedBatch, row_runs, stage
from .executor_completion import Completions
from .executor_graphs import BoundGraphs
from .executor_models import ModelTable
from .executor_stats import Counters
from .faults import Injector
from .memory import DevicePool, PinnedRing, PinnedSlot, round_up


class SlotEvents:
    """One staging slot's events: the hand-overs between streams and the batch's last one."""

    __slots__ = ("h2d", "compute", "done")

    def __init__(self, backend: Backend, spin: bool = False) -> None:
        if not backend.is_cuda:
            self.h2d = self.compute = self.done = COMPLETE
            return
        import cupy  # the optional GPU backend

        with cupy.cuda.Device(backend.device_id):
            self.h2d = Event(cupy.cuda.Event(block=False, disable_timing=True))
            self.compute = Event(cupy.cuda.Event(block=False, disable_timing=True))
            # blocking sync: the thread that waits on it sleeps instead of spinning a core
            # (``executor.batch_wait: spin``: a plain event, waited on as the context says)
            self.done = Event(cupy.cuda.Event(block=not spin, disable_timing=True))


def record(event: Event, stream: Stream) -> None:
    if event.raw is not None:
        event.raw.record(stream.raw)


Copy = tuple[int, int, int]  # (destination address, source address, bytes)


class Route:
    """Where a prepared batch runs (chosen at prepare): its compute stream, bound plan and
    CUDA graph (or None), the slot's views and events, and on the GPU the addresses of its
    copies in and out (``memcpyAsync`` straight from them)."""

    __slots__ = ("compute", "bound", "graph", "stage_in", "outs_host", "events", "copies")

    def __init__(
        self,
        compute: Stream,
        bound: BoundModel,
        graph: Any,
        slot_part: tuple[np.ndarray, list[np.ndarray], tuple[Copy, tuple[Copy, ...]] | None],
        events: SlotEvents,
    ) -> None:
        self.compute, self.bound, self.graph = compute, bound, graph
        self.stage_in, self.outs_host, self.copies = slot_part
        self.events = events


def slot_views(slot: PinnedSlot, plan: EnginePlan) -> tuple[np.ndarray, list[np.ndarray]]:
    """The slot's input rows (a bucket's worth), then one view per output."""
    spec_in = plan.input_spec
    outs, off = [], round_up(spec_in.nbytes, 256)
    for s in plan.output_specs:
        outs.append(slot.view(off, s.shape, s.dtype))
        off += round_up(s.nbytes, 256)
    return slot.view(0, spec_in.shape, spec_in.dtype), outs


def copies_of(
    stage_in: np.ndarray, outs_host: list[np.ndarray], bound: BoundModel
) -> tuple[Copy, tuple[Copy, ...]]:
    """The addresses of a batch's copy in (slot -> arena) and out (arena -> slot)."""
    h2d = (int(bound.input.data.ptr), int(stage_in.ctypes.data), int(stage_in.nbytes))
    d2h = tuple(
        (int(h.ctypes.data), int(d.data.ptr), int(h.nbytes))
        for h, d in zip(outs_host, bound.outputs, strict=True)
    )
    return h2d, d2h


@dataclass(frozen=True)
class ModeParts:
    """What the executor hands its mode: its backend, pool, streams, model table, counters,
    fault injector, completions and enqueue lock."""

    backend: Backend
    pool: DevicePool
    streams: StreamSet
    models: ModelTable
    counters: Counters
    faults: Injector
    completions: Completions
    lock: threading.Lock


class StagedMode:
    """prepare/commit through the pinned ring, the pool and the fixed streams."""

    name = "staged"
    capture = False  # record each arena's first eager run as a CUDA graph (``GraphMode``)

    def __init__(self, config: ExecutorConfig, parts: ModeParts) -> None:
        backend, counters, faults = parts.backend, parts.counters, parts.faults
        self.config, self.backend, self.pool, self.streams = (
            config,
            backend,
            parts.pool,
            parts.streams,
        )
        self.models, self.counters, self.faults = parts.models, counters, faults
        self.completions, self.lock = parts.completions, parts.lock
        self.bound_graphs = BoundGraphs(counters.count)
        self.kept = KeptArenas(parts.pool, self._largest) if config.arenas == "kept" else None
        self.ring: PinnedRing | None = None
        self.one_stream = config.compute_streams >= config.max_in_flight
        self.capture = self.capture and backend.is_cuda
        self.warm_depth = config.max_in_flight if backend.is_cuda else 1
        self.warm_rounds = 2 if backend.is_cuda else 1
        # on the CPU no graph is captured: running the smallest bucket proves the model runs,
        # and the others are planned and reserved (their pool blocks made) without compute
        self.warm_runs_all = backend.is_cuda
        self._faults_on = faults.enabled  # the injector's config is fixed at start-up
        self._slot_parts: dict[tuple, Any] = {}  # (slot, bound-graph key) -> views, copies
        self._settled: set[str] = set()  # models past their warm-up (``settle``)
        self._events: dict[int, SlotEvents] = {}
        self._rt: Any = None
        if backend.is_cuda:
            from cupy.cuda import runtime  # cupy: the GPU backend

            self._rt = runtime

    def _largest(self, model: str, feed: str) -> int:
        """The arena of ``model``'s largest bucket for ``feed`` (a kept arena's size)."""
        return self.models.plan(model, self.models.buckets_of(model)[-1], feed).arena_bytes

    def settle(self, model: str) -> None:
        """``model``'s warm-up is over: from now on a batch on an arena new to its bucket is
        captured only where its engine allows it (``Engine.late_capture``)."""
        self._settled.add(model)

    def _may_capture(self, model: str) -> bool:
        return model not in self._settled or self.models.get(model).engine.late_capture

    def fit(self, slot_bytes: int) -> None:
        """A ring whose slots hold ``slot_bytes`` (grown only while nothing is in flight)."""
        if self.ring is not None and self.ring.slot_bytes >= slot_bytes:
            return
        if self.ring is not None and self.ring.available() != self.ring.slots:
            raise RuntimeError("cannot grow the staging ring while batches are in flight")
        old = self.ring
        self.ring = PinnedRing(self.backend, slot_bytes, self.config.max_in_flight)
        self._slot_parts.clear()
        if old is not None:
            old.close()

    # ------------------------------------------------------------------ phase one
    def prepare(
        self, model: str, n: int, bucket: int, plan: EnginePlan, timeout: float | None
    ) -> PreparedBatch:
        ring = self.ring
        assert ring is not None
        if len(self.completions) >= ring.slots:  # every slot may be held by a batch nobody
            self.completions.drive_oldest()  # waits for: finish the oldest of those here
        slot = ring.acquire(self.config.staging_timeout_s if timeout is None else timeout)
        try:
            faults = self.faults.next_batch()  # (an injected oom_reserve raises here)
            if self.kept is not None:
                res: Any = self.kept.take(model, plan.feed)
            else:
                res = self.pool.reserve(plan.arena_bytes)
        except BaseException:
            slot.release()
            raise
        p = PreparedBatch(model, n, bucket, plan, res, slot, False)
        p.faults = faults
        try:
            p.route = self._route(p, slot)
        except BaseException:
            p.release()
            raise
        return p

    def _route(self, p: PreparedBatch, slot: PinnedSlot) -> Route:
        assert p.reservation is not None
        ptr = p.reservation.ptr
        compute = self.streams.compute_for(ptr)  # one stream per arena
        gkey = (p.model, p.bucket, p.plan.feed, ptr, compute.name)
        bound, graph = self.bound_graphs.get(p, compute, self.models.get(p.model).engine, gkey)
        key = (slot.index, gkey)
        part = self._slot_parts.get(key)
        if part is None:
            if len(self._slot_parts) >= 4096:  # arenas come from a bounded pool; a guard
                self._slot_parts.clear()
            stage_in, outs = slot_views(slot, p.plan)
            copies = copies_of(stage_in, outs, bound) if self._rt is not None else None
            part = self._slot_parts[key] = (stage_in, outs, copies)
        events = self._events.get(slot.index)
        if events is None:
            spin = self.config.batch_wait == "spin"
            events = self._events[slot.index] = SlotEvents(self.backend, spin)
        return Route(compute, bound, graph, part, events)

    # ------------------------------------------------------------------ phase two
    def commit(self, p: PreparedBatch, x: np.ndarray | list[np.ndarray], label: str) -> AsyncResult:
        r: Route = p.route
        rows_d = (
            [(i, a) for i, a in enumerate(x) if is_device_array(a)] if isinstance(x, list) else []
        )
        on_device = bool(rows_d) and len(rows_d) == p.n  # rows already on this device, every one
        if not on_device:
            stage(r.stage_in, x, p.n, p.given)  # the host copy into pinned memory, here
        with self.lock:
            if self._rt is not None and self._rt.getDevice() != self.backend.device_id:
                self.backend.activate()  # (a thread's device stays set: checked, not set)
            replay = self._enqueue(p, r, x, rows_d, on_device)
        self.counters.committed(p.n, p.bucket - p.n, replay)
        return self._result(p, r, [a for _, a in rows_d], label)

    def _enqueue(
        self, p: PreparedBatch, r: Route, x: Any, rows_d: list[tuple[int, Any]], on_device: bool
    ) -> bool:
        """Enqueue the batch on its route (under the lock); True for a graph replay."""
        bound, compute, ev, streams = r.bound, r.compute, r.events, self.streams
        if on_device:  # rows already on this device (GPU preprocessing): d2d copies
            self._rows_in(bound.input, rows_d, p.n, compute)
        else:  # host rows go up first; device rows beside them are copied on the device
            up = compute if self.one_stream else streams.h2d
            if r.copies is not None:
                dst, src, nbytes = r.copies[0]
                self._rt.memcpyAsync(dst, src, nbytes, self._rt.memcpyHostToDevice, up.ptr)
            else:
                up.copy_h2d(bound.input, r.stage_in)
            if not self.one_stream:
                record(ev.h2d, up)
                compute.wait(ev.h2d)
            if rows_d:
                self._rows_in(bound.input, rows_d, None, compute)
        if self._faults_on:  # the middle of the batch: its arena and slot are held
            self.faults.on_commit(p.faults)
        replay = r.graph is not None
        if replay:
            r.graph.launch(compute.raw)
        else:
            bound.run(compute)
            if self.capture and self._may_capture(p.model):
                self.bound_graphs.capture(p, compute, bound)
        out = compute if self.one_stream else streams.d2h
        if not self.one_stream:
            record(ev.compute, compute)
            out.wait(ev.compute)
        if r.copies is not None:
            rt, out_ptr = self._rt, out.ptr
            for dst, src, nbytes in r.copies[1]:
                rt.memcpyAsync(dst, src, nbytes, rt.memcpyDeviceToHost, out_ptr)
        else:
            for host, dev in zip(r.outs_host, bound.outputs, strict=True):
                out.copy_d2h(host, dev)
        record(ev.done, out)
        return replay

    def _rows_in(
        self, dst: Any, rows: list[tuple[int, Any]], n: int | None, compute: Stream
    ) -> None:
        """Device rows (index, array) into the arena's input ``dst`` on ``compute``: a
        ``memcpyAsync`` per run of rows consecutive in memory (``row_runs``), a copy kernel
        for a strided one; with ``n``, the rows from ``n`` on (the bucket's padding) zeroed."""
        rt, flat = self._rt, dst.flags.c_contiguous
        n = None if n is None or n >= dst.shape[0] else n
        odd = rows if rt is None or not flat else [r for r in rows if not r[1].flags.c_contiguous]
        if rt is not None and flat:
            row_bytes, base, sp = dst.nbytes // dst.shape[0], int(dst.data.ptr), compute.ptr
            runs = row_runs(
                [(i, int(a.data.ptr)) for i, a in rows if a.flags.c_contiguous], row_bytes
            )
            for i, src, k in runs:
                rt.memcpyAsync(base + i * row_bytes, src, k * row_bytes, rt.memcpyDefault, sp)
            if n is not None:
                rt.memsetAsync(base + n * row_bytes, 0, (dst.shape[0] - n) * row_bytes, sp)
                n = None
        if odd or n is not None:
            with compute:
                for i, a in odd:
                    dst[i] = a
                if n is not None:
                    dst[n:] = 0

    def _result(self, p: PreparedBatch, r: Route, keep: list[Any], label: str) -> AsyncResult:
        """The batch's result, finished from its last event: the rows copied out of the
        slot, the slot and the reservation given back (on a failure too)."""
        n, outs_host, counters = p.n, r.outs_host, self.counters
        stall = self.faults.stall_s(p.faults)

        def finish() -> Any:
            if stall:
                time.sleep(stall)  # an injected hang: this batch does not finish meanwhile
            keep.clear()  # device rows live until the batch is done
            rows = [np.array(h[:n]) for h in outs_host]  # out of the slot before it is reused
            p.release()
            counters.finished()
            return rows[0] if len(rows) == 1 else tuple(rows)

        def failed(exc: BaseException) -> None:
            keep.clear()
            p.release()
            counters.failure(exc)
            counters.count(in_flight=-1, failed=1)

        return self.completions.add(r.events.done, finish, label or f"{p.model}[{n}]", failed)

    def forget(self, model: str) -> None:
        """Drop what was kept for ``model`` (unloaded): bound plans, graphs, slot views."""
        self.bound_graphs.forget(model)
        self._settled.discard(model)
        for key in [k for k in self._slot_parts if k[1][0] == model]:
            del self._slot_parts[key]
        if self.kept is not None:
            self.kept.forget(model)

    def close(self) -> None:
        self.bound_graphs.clear()
        if self.kept is not None:
            self.kept.close()
        self._slot_parts.clear()
        self._events.clear()
        if self.ring is not None:
            self.ring.close()
