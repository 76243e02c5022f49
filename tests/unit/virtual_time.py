"""An asyncio event loop on a virtual clock, for unit tests of code that waits.

``loop.time()`` is a number that moves only when the loop would otherwise sleep: each time
nothing is ready, the clock jumps to the next timer (``call_later``, ``asyncio.sleep``,
``asyncio.timeout``) instead of waiting for it. A test then reads exact durations -- how
long a grace or a window lasted -- from ``loop.time()``, and a loaded machine cannot
stretch them; the whole test runs in no real time. Real I/O is still polled (never
waited on): these tests have none beyond the loop's own wake-up pipe.

Code under test that keeps its own clock takes ``loop.time`` as that clock
(``UploadGate(..., clock=loop.time)``); code that reads ``loop.time()`` (the coalescer)
needs nothing."""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Awaitable
from typing import Any, TypeVar

T = TypeVar("T")


class _JumpingSelector(selectors.DefaultSelector):
    """Polls; where the loop would block for ``timeout``, moves the clock by it instead."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None) -> list[Any]:
        events = super().select(0)
        if events or timeout == 0:
            return events
        if timeout is None:  # nothing ready and no timer: real time would not help either
            raise RuntimeError("deadlock: the loop would wait forever (no timer is pending)")
        self._loop.now += timeout
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        super().__init__(selector=_JumpingSelector(self))

    def time(self) -> float:
        return self.now


def run(main: Awaitable[T], start: float = 1000.0) -> T:
    """``asyncio.run`` on a ``VirtualTimeLoop``."""
    loop = VirtualTimeLoop(start)
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(main)
    finally:  # as asyncio.run ends: what is still pending is cancelled and awaited
        left = asyncio.all_tasks(loop)
        for task in left:
            task.cancel()
        loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        asyncio.set_event_loop(None)
        loop.close()
