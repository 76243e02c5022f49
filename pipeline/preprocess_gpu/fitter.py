"""GpuFitter: images -> a model's uint8 input batch, under the two-phase contract.

    out = fitter.output(target, n)              # the batch, a pool reservation
    p = fitter.prepare(target, images, out)     # validate, size, reserve, plan
    done = fitter.commit(p)                     # enqueue only; an event

``prepare`` plans the resize (``ops.resize_crop``: per-image geometry, the workspace
table), lays out the host images and the table (``plan.plan_staging``), reserves the
device bytes (in power-of-two size classes, ``size_class``) from the hard-limited pool (``ResourceExhausted`` at once past its limit) and
takes the pinned slots from the ring (waiting up to ``timeout_s`` for the fits before it
to hand theirs back, then ``ResourceExhausted``). ``commit`` writes the host bytes into
the slots, enqueues one copy per slot on the copy stream, makes the compute stream wait
for it with an event and launches the one resize kernel there; the completion watcher
returns the slots and the reservation when the launch is done. Nothing allocates outside
the pool, and the host never waits for the device.

On the numpy backend the same code runs: pool and ring are host memory, copies are inline
and the op's host path computes the reference.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..async_result import AsyncResult, CompletionWatcher
from ..device import Backend, Event, Stream
from ..errors import InvalidInput, ResourceExhausted
from ..memory import DevicePool, PinnedRing, PinnedSlot, Reservation
from ..ops.base import OpPlan, TensorSpec
from ..ops.resize_crop import RESIZE_CROP, table_offsets, target_attrs
from ..resize_plan import Target
from .plan import StagingPlan, plan_staging, split_parts

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class PreparedFit:
    """What ``prepare`` planned and reserved for one fit; ``commit`` hands it over."""

    plan: OpPlan
    staging: StagingPlan
    images: list[Any]  # host arrays, or device views [h, w, c] with their row pitch
    out: Any  # [n, OH, OW, C] uint8 on the device
    reservation: Reservation
    slots: list[PinnedSlot]
    committed: bool = False
    _released: bool = field(default=False, repr=False)

    def release(self) -> None:
        """Give back the slots and the reservation; safe to call more than once."""
        if self._released:
            return
        self._released = True
        for s in self.slots:
            s.release()
        self.reservation.release()
        self.images, self.out = [], None  # the batch's bytes follow its rows, not this fit


# What each live lease must release: its reservation and the event of the last work that
# writes its batch, held from here (by the lease's id) as well as by the lease. A batch's rows,
# and with them its lease, can end up in a reference cycle -- a refusal's traceback holds the
# frame that holds the call's rows -- and the cyclic GC runs the finalizers of everything in
# such a cycle in no fixed order (PEP 442). cupy.cuda.Event is a Python class whose __del__
# destroys its CUDA handle and keeps ``.ptr``: finalized before the lease, it left the lease
# querying a destroyed event, and replicas died of a SIGSEGV in cuEventQuery (or, waited on
# by the watcher, cuEventSynchronize) under the GPU overload pulse. Reachable from this
# module, neither is ever part of such a cycle, so neither is finalized before the lease has
# handed them on. (Whatever goes in ``after`` must never refer back to the lease.)
_HELD: dict[int, list[Any]] = {}


class _Lease:
    """Owns a batch's reservation for as long as any view of it lives; the last view gone,
    the bytes go back to the pool -- after the last work that writes them (``after``)."""

    def __init__(self, res: Reservation, watcher: CompletionWatcher) -> None:
        self.res = res
        self.watcher = watcher
        _HELD[id(self)] = [res, None]
        buf = res.buffer
        self.__array_interface__ = (
            {  # the numpy backend's view keeps the lease alive
                "shape": (res.nbytes,),
                "typestr": "|u1",
                "data": (res.ptr, False),
                "version": 3,
            }
            if isinstance(buf, np.ndarray)
            else None
        )

    @property
    def after(self) -> Event | None:
        held = _HELD.get(id(self))
        return None if held is None else held[1]

    @after.setter
    def after(self, ev: Event | None) -> None:
        _HELD[id(self)][1] = ev

    def __del__(self, _held: dict[int, list[Any]] = _HELD) -> None:
        # (_HELD bound as a default: at interpreter teardown the module's names go first)
        res, ev = _held.pop(id(self), None) or (self.res, None)
        try:
            if ev is None or ev.raw is None or ev.done():
                res.release()
            else:
                self.watcher.watch(ev, res.release, AsyncResult("batch lease"))
        except Exception:  # interpreter teardown, a closed watcher
            res.release()


class GpuFitter:
    """Fits images into batches on one device, from ``pool`` and ``ring``."""

    def __init__(
        self,
        backend: Backend,
        pool: DevicePool,
        ring: PinnedRing,
        compute: Stream,
        copy: Stream,
        watcher: CompletionWatcher,
        timeout_s: float,
    ) -> None:
        self.backend = backend
        self.pool = pool
        self.ring = ring
        self.compute = compute
        self.copy = copy
        self.watcher = watcher
        self.timeout_s = timeout_s

    # ------------------------------------------------------------------ the batch
    def output(self, target: Target, n: int) -> tuple[Any, _Lease]:
        """A [n, H, W, C] uint8 batch for ``target`` reserved from the pool, and its lease:
        the bytes come back when the last view of the batch is dropped, after the work
        the caller marks with ``lease.after`` (the last commit's event)."""
        spec = TensorSpec((n, target.height, target.width, target.channels), "uint8")
        lease = _Lease(self.pool.reserve(size_class(spec.nbytes)), self.watcher)
        if not self.backend.is_cuda:
            flat = np.asarray(lease)  # base is the lease
            return flat[: spec.nbytes].reshape(spec.shape), lease
        import cupy  # optional: cupy

        mem = cupy.cuda.UnownedMemory(lease.res.ptr, lease.res.nbytes, lease)
        return cupy.ndarray(spec.shape, cupy.uint8, cupy.cuda.MemoryPointer(mem, 0)), lease

    def parts(self, target: Target, images: Sequence[Any]) -> tuple[list[list[int]], dict]:
        """Runs of ``images`` that each fit the ring, and the images refused (too big)."""
        host = [None if _on_device(i) else int(i.nbytes) for i in images]

        def table_bytes(n: int) -> int:
            return table_offsets(n)[-1]

        return split_parts(host, table_bytes, self.ring.slot_bytes, self.ring.slots)

    # ------------------------------------------------------------------ phase one
    def prepare(self, target: Target, images: Sequence[Any], out: Any) -> PreparedFit:
        """Validate and plan the fit of ``images`` into ``out``, reserve its bytes and
        slots, or raise (``InvalidInput``, ``ResourceExhausted``) with nothing held."""
        views = [device_view(i) if _on_device(i) else _host_image(i) for i in images]
        specs = [TensorSpec(tuple(v.shape), "uint8") for v in views]
        pitches = tuple(int(v.strides[0]) for v in views)
        for k, v in enumerate(views):
            c = v.shape[2]
            if v.strides[1] != c or (c > 1 and v.strides[2] != 1):
                raise InvalidInput(
                    "an image's pixels are not interleaved", image=k, strides=v.strides
                )
        plan = RESIZE_CROP.prepare(*specs, pitches=pitches, **target_attrs(target))
        if tuple(out.shape) != plan.outputs[0].shape:
            raise InvalidInput(
                "the batch does not fit the images", shape=out.shape, expected=plan.outputs[0].shape
            )
        staging = plan_staging(
            [None if _on_device(i) else int(v.nbytes) for i, v in zip(images, views, strict=True)],
            plan.workspace_bytes,
            self.ring.slot_bytes,
        )
        if staging.slots > self.ring.slots:
            raise ResourceExhausted(
                "the fit's staging is more than the pinned ring holds (split it in parts)",
                staging_bytes=staging.nbytes,
                slots=self.ring.slots,
                slot_bytes=self.ring.slot_bytes,
            )
        res = self.pool.reserve(size_class(staging.nbytes))
        slots: list[PinnedSlot] = []
        try:
            for _ in range(staging.slots):
                slots.append(self.ring.acquire(self.timeout_s))
        except BaseException:
            for s in slots:
                s.release()
            res.release()
            raise
        return PreparedFit(plan, staging, views, out, res, slots)

    # ------------------------------------------------------------------ phase two
    def commit(self, p: PreparedFit) -> Event:
        """Enqueue the uploads (copy stream) and the launch (compute stream); the event
        marks the batch's rows complete. The slots and bytes return when it fires."""
        if p.committed:
            raise RuntimeError("a prepared fit is committed once")
        p.committed = True
        try:
            done = self._enqueue(p)
        except BaseException:
            p.release()
            raise
        keep = [img for img in p.images if _on_device(img)]  # read by the launch

        def finish() -> None:
            keep.clear()
            p.release()

        def failed(_exc: BaseException) -> None:
            keep.clear()
            p.release()

        self.watcher.watch(done, finish, AsyncResult("fit"), on_error=failed)
        return done

    def _enqueue(self, p: PreparedFit) -> Event:
        st, buf, base = p.staging, p.reservation.buffer, p.reservation.ptr
        inputs, ptrs = [], []
        for img, off, n in zip(p.images, st.offsets, st.sizes, strict=True):
            if off < 0:
                inputs.append(img)
                ptrs.append(int(img.data.ptr))
                continue
            self._stage(p.slots, st, off, img.reshape(-1))
            inputs.append(buf[off : off + n].reshape(img.shape))
            ptrs.append(base + off)
        table = RESIZE_CROP.table(p.plan, ptrs)
        self._stage(p.slots, st, st.table_offset, table)
        sb = st.slot_bytes
        for k, slot in enumerate(p.slots):
            used = st.used(k)
            self.copy.copy_h2d(buf[k * sb : k * sb + used], slot.view(0, (used,), np.uint8))
        self.compute.wait(self.copy.record())
        ws = buf[st.table_offset : st.table_offset + p.plan.workspace_bytes]
        RESIZE_CROP.commit(p.plan, inputs, [p.out], ws, self.compute)
        return self.compute.record()

    @staticmethod
    def _stage(slots: list[PinnedSlot], st: StagingPlan, offset: int, src: np.ndarray) -> None:
        for k, o, s, n in st.pieces(offset, src.nbytes):
            slots[k].view(o, (n,), np.uint8)[...] = src[s : s + n]


def size_class(nbytes: int) -> int:
    """The bytes reserved for ``nbytes``: the next power of two (4 KiB at least). Fits vary
    in size call by call, and the pool keeps returned blocks by exact size, so a few size
    classes are what lets its free lists hand the same blocks out again (at most twice
    the bytes, never a driver call in the steady state)."""
    return max(4096, 1 << (max(int(nbytes), 1) - 1).bit_length())


def _on_device(img: Any) -> bool:
    return not isinstance(img, np.ndarray)


def _host_image(img: np.ndarray) -> np.ndarray:
    img = np.ascontiguousarray(img)
    return img[..., None] if img.ndim == 2 else img


def device_view(img: Any) -> Any:
    """A cupy view [h, w, c] of a device image that exposes ``__cuda_array_interface__``,
    without the stream synchronization cupy would do on import (the image is in stream
    order on the stage's stream already); the view keeps the image alive."""
    import cupy  # optional: cupy

    if isinstance(img, cupy.ndarray):
        return img[..., None] if img.ndim == 2 else img
    cai = img.__cuda_array_interface__
    ptr = int(cai["data"][0])
    shape = tuple(cai["shape"])
    dtype = np.dtype(cai["typestr"])
    strides = cai.get("strides")
    size = (
        math.prod(shape) * dtype.itemsize
        if strides is None
        else (sum((d - 1) * s for d, s in zip(shape, strides, strict=True)) + dtype.itemsize)
    )
    mem = cupy.cuda.UnownedMemory(ptr, size, img)
    v = cupy.ndarray(shape, dtype, cupy.cuda.MemoryPointer(mem, 0), strides=strides)
    return v[..., None] if v.ndim == 2 else v
