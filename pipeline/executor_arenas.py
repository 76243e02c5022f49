"""Arenas kept by the executor (``executor.arenas: kept``), not reserved from the pool per batch.

With ``pooled`` (the default) a batch reserves its bucket's arena from the pool in
``prepare`` and gives it back when it ends. The pool also hands out the GPU fitter's and the
answers' buffers, so a later batch of the same bucket can get a block at another address:
the bound plan and CUDA graph are keyed by that address, so such a batch runs eagerly and is
captured as a new graph (``ray_ferry_executor_captures`` counts them). For the torch engine a
capture also syncs the device.

With ``kept`` each (model, feed) keeps the arenas its batches have used, each sized for the
model's largest bucket, and a batch of any bucket takes a free one (its plan bound at the
arena's start). There are never more of them than batches in flight for that model, so the
warm-up (every bucket, ``max_in_flight`` batches at once, twice) makes all of them and
captures every (bucket, arena) graph, and later batches replay. The cost is memory held
while idle: ``max_in_flight`` x the largest bucket's arena for each model and feed, counted
as in use by the pool.

    arenas = KeptArenas(pool, size_of)          # size_of(model, feed) -> bytes
    a = arenas.take("resnet50", "image")        # .ptr, .buffer, .nbytes, .release()
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from .memory import DevicePool, Reservation


class KeptArena:
    """A kept arena lent to one batch; ``release`` lends it back (once)."""

    __slots__ = ("_owner", "_key", "_res", "_released", "nbytes")

    def __init__(self, owner: KeptArenas, key: tuple[str, str], res: Reservation) -> None:
        self._owner, self._key, self._res = owner, key, res
        self._released = False
        self.nbytes = res.nbytes

    @property
    def buffer(self) -> Any:
        if self._released:
            raise RuntimeError("arena already given back")
        return self._res.buffer

    @property
    def ptr(self) -> int:
        if self._released:
            raise RuntimeError("arena already given back")
        return self._res.ptr

    @property
    def released(self) -> bool:
        return self._released

    def release(self) -> bool:
        """Lend the arena back to its (model, feed). True the first time, False after."""
        return self._owner._lend_back(self)


class KeptArenas:
    """The arenas of each (model, feed), sized by ``size_of(model, feed)`` (the largest
    bucket's arena); reserved from ``pool`` the first time none is free."""

    def __init__(self, pool: DevicePool, size_of: Callable[[str, str], int]) -> None:
        self.pool = pool
        self._size_of = size_of
        self._lock = threading.Lock()
        self._free: dict[tuple[str, str], list[Reservation]] = {}
        self._all: dict[tuple[str, str], list[Reservation]] = {}

    def take(self, model: str, feed: str) -> KeptArena:
        """A free arena of ``model``'s ``feed``, or a new one from the pool
        (``ResourceExhausted`` where the pool has no room, as a pooled batch's)."""
        key = (model, feed)
        with self._lock:
            free = self._free.get(key)
            res = free.pop() if free else None
        if res is None:
            res = self.pool.reserve(self._size_of(model, feed))
            with self._lock:
                self._all.setdefault(key, []).append(res)
        return KeptArena(self, key, res)

    def _lend_back(self, a: KeptArena) -> bool:
        with self._lock:
            if a._released:
                return False
            a._released = True
            mine = a._res in self._all.get(a._key, ())
            if mine:
                self._free.setdefault(a._key, []).append(a._res)
        if not mine:  # its model was forgotten meanwhile: back to the pool
            a._res.release()
        return True

    def count(self, model: str, feed: str) -> int:
        """How many arenas ``model``'s ``feed`` holds (lent or free)."""
        with self._lock:
            return len(self._all.get((model, feed), ()))

    def forget(self, model: str) -> None:
        """Give ``model``'s free arenas back to the pool; those lent go back as they return."""
        with self._lock:
            keys = [k for k in self._all if k[0] == model]
            free = [r for k in keys for r in self._free.pop(k, [])]
            for k in keys:
                del self._all[k]
        for r in free:
            r.release()

    def close(self) -> None:
        with self._lock:
            models = {k[0] for k in self._all}
        for m in models:
            self.forget(m)
