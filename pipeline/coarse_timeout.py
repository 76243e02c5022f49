"""Timeouts for every request at a fraction of ``asyncio.timeout``'s cost: the event loop's
open timeouts in a dict, with one timer for the earliest of them, instead of a timer armed and
cancelled per block.

A request through the ingress opens two (its body's read, its answer's wait), and nearly all
of them close long before they expire. ``asyncio.timeout`` makes an object, arms a timer in
the loop's heap and cancels it for each -- a cancelled timer stays in the heap until the
loop sweeps it -- 6.0 us a block on the development VM against ``within``'s 1.9, which puts
the task in a dict and takes it out. The one timer is armed again only for a block that
expires before it, which a block opened later with the same bound never does; when it fires
it expires what is due and is armed for the earliest block still open. Expiry is
``asyncio.timeout``'s, at the same moment: the task is cancelled, and the ``with`` block turns
that cancellation into ``TimeoutError``."""

from __future__ import annotations

import asyncio
import itertools
import weakref
from typing import Any


class _Sweeper:
    """The open timeouts of one event loop, and the timer of the earliest (``at``)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.open: dict[int, Within] = {}
        self.ids = itertools.count()
        self.handle: asyncio.TimerHandle | None = None
        self.at = 0.0

    def add(self, w: Within) -> int:
        key = next(self.ids)
        self.open[key] = w
        if self.handle is None or w.when < self.at:
            self._arm(w.when)
        return key

    def _arm(self, at: float) -> None:
        if self.handle is not None:
            self.handle.cancel()
        self.at = at
        self.handle = self.loop.call_at(at, self.sweep)

    def sweep(self) -> None:
        self.handle = None
        now = self.loop.time()
        nxt = None
        for w in self.open.values():
            if w.expired:
                continue
            if w.when <= now:
                w.expired = True
                w.task.cancel()
            elif nxt is None or w.when < nxt:
                nxt = w.when
        if nxt is not None:
            self._arm(nxt)


_SWEEPERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Sweeper] = (
    weakref.WeakKeyDictionary()
)


class Within:
    """``with within(seconds):`` in a coroutine: ``TimeoutError`` where the block has not
    ended ``seconds`` after it began."""

    __slots__ = ("cancelling", "expired", "key", "seconds", "sweeper", "task", "when")

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.expired = False

    def __enter__(self) -> Within:
        loop = asyncio.get_running_loop()
        sweeper = _SWEEPERS.get(loop)
        if sweeper is None:
            sweeper = _SWEEPERS[loop] = _Sweeper(loop)
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("within() needs to run in an asyncio task")
        self.task, self.sweeper, self.cancelling = task, sweeper, task.cancelling()
        self.when = loop.time() + self.seconds
        self.key = sweeper.add(self)
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.sweeper.open.pop(self.key, None)
        # as asyncio.timeout: its own cancellation taken back (whatever the block ended in),
        # a TimeoutError where no other cancellation came since the block began
        expired = self.expired and self.task.uncancel() <= self.cancelling
        if expired and exc_type is asyncio.CancelledError:
            raise TimeoutError from exc


within = Within
