"""Pinned host staging: a ring of page-locked slots sized to the in-flight depth.

A batch is written into a slot on the host and copied to the device from there, so the
copy can be asynchronous (pageable memory would make the driver stage it synchronously).
On the CPU backend the slots are ordinary numpy memory, so the same code runs.
"""

from __future__ import annotations

import math
import threading
from typing import Any

import numpy as np

from ..device import Backend
from ..errors import ResourceExhausted
from .pool import round_up


class PinnedSlot:
    """One slot of the ring: a page-locked host buffer."""

    __slots__ = ("index", "host", "ring")

    def __init__(self, ring: PinnedRing, index: int, host: np.ndarray) -> None:
        self.ring = ring
        self.index = index
        self.host = host

    def view(self, offset: int, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        dt = np.dtype(dtype)
        n = math.prod(shape) * dt.itemsize
        if offset + n > self.host.nbytes:
            raise ValueError(
                f"view of {n} bytes at {offset} exceeds the slot ({self.host.nbytes} bytes)"
            )
        return self.host[offset : offset + n].view(dt).reshape(shape)

    def release(self) -> None:
        self.ring.release(self)


class PinnedRing:
    """``slots`` page-locked buffers of ``slot_bytes`` each, handed out one batch at a time."""

    def __init__(self, backend: Backend, slot_bytes: int, slots: int) -> None:
        if slots < 1 or slot_bytes < 1:
            raise ValueError(f"need slots >= 1 and slot_bytes >= 1, got {slots}, {slot_bytes}")
        self.backend = backend
        self.slot_bytes = round_up(slot_bytes, 4096)
        self._cond = threading.Condition()
        self._keep: list[Any] = []
        self._slots = [PinnedSlot(self, i, self._alloc(self.slot_bytes)) for i in range(slots)]
        self._free = list(reversed(self._slots))
        self.waits = 0

    def _alloc(self, n: int) -> np.ndarray:
        if not self.backend.is_cuda:
            return np.zeros(n, dtype=np.uint8)
        import cupy  # optional: cupy

        with cupy.cuda.Device(self.backend.device_id):
            mem = cupy.cuda.alloc_pinned_memory(n)
        self._keep.append(mem)
        return np.frombuffer(mem, dtype=np.uint8, count=n)

    @property
    def slots(self) -> int:
        return len(self._slots)

    def available(self) -> int:
        with self._cond:
            return len(self._free)

    def acquire(self, timeout: float | None = None) -> PinnedSlot:
        """A free slot; waits up to ``timeout`` seconds, then ``ResourceExhausted``."""
        with self._cond:
            if not self._free:
                self.waits += 1
                if not self._cond.wait_for(lambda: bool(self._free), timeout=timeout):
                    raise ResourceExhausted(
                        "no pinned staging slot came free in time",
                        slots=len(self._slots),
                        timeout_s=timeout,
                    )
            return self._free.pop()

    def release(self, slot: PinnedSlot) -> None:
        with self._cond:
            if slot in self._free:
                raise RuntimeError(f"pinned slot {slot.index} released twice")
            self._free.append(slot)
            self._cond.notify()

    def close(self) -> None:
        self._keep.clear()
        self._slots.clear()
        self._free.clear()
