"""Work handed from an event loop to Ferry's threads and back, at one wake-up for many.

``loop.run_in_executor`` costs the loop, for every call, a ``concurrent.futures.Future``
and an asyncio one chained to it, a lock, and on completion one write to the loop's
self-pipe (``call_soon_threadsafe``): every finished call wakes the loop on its own, even
when ten finish together. On a replica that hands a round to a decode thread, a batch to a
submit thread and a device completion back, those wake-ups are a good share of its CPU an
image. On the 2-core VM (2026-12-07) a round trip of a no-op cost 19-31 us of process CPU
through ``run_in_executor`` with eight in flight and 50-54 us with one; through ``Workers``
7-9 and 35-37 us. On an H100 (8 replicas of ``ferry_torch_dyn``, 256 clients) this module's
hand-offs cut the server's CPU an image to 0.91x (``benchmarks/results/e2e_notes.md``).

* ``LoopInbox``: callbacks posted from any thread, run on the loop in the order posted; the
  loop is woken once for all those posted before it drains them.
* ``Workers``: named threads that run ``await workers.run(fn, *args)``, their results
  handed back through the loop's inbox.
"""

from __future__ import annotations

import asyncio
import collections
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from .threads import QueueThreads

T = TypeVar("T")


class LoopInbox:
    """Callbacks for one event loop, posted from any thread (``post``), run on the loop by
    one scheduled drain for all those waiting."""

    __slots__ = ("loop", "_items", "_armed")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._items: collections.deque[tuple[Callable[..., Any], tuple]] = collections.deque()
        self._armed = False

    def post(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the loop soon; the loop is woken only when no drain is
        already due. Posting to a closed loop drops the callback (as asyncio does for
        an executor's result that comes back after its loop closed)."""
        self._items.append((fn, args))
        if self._armed:  # (read after the append: a drain due resets it before it reads)
            return
        self._armed = True
        try:
            self.loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the loop is closed: nothing posted to it will run
            self._items.clear()
            self._armed = False

    def _drain(self) -> None:
        self._armed = False  # (before the reads: a post from now on schedules another drain)
        items = self._items
        while items:
            fn, args = items.popleft()
            try:
                fn(*args)
            except BaseException as exc:  # as the loop reports a failing callback
                self.loop.call_exception_handler(
                    {"message": "Ferry inbox callback failed", "exception": exc}
                )


_local = threading.local()


def inbox_of(loop: asyncio.AbstractEventLoop) -> LoopInbox:
    """The inbox of ``loop``, called in the loop's own thread (one per thread, kept for the
    loop running there: a new loop in the thread gets a new one, and a thread's end or its
    next loop lets the old one go)."""
    box = getattr(_local, "inbox", None)
    if box is None or box.loop is not loop:
        box = _local.inbox = LoopInbox(loop)
    return box


def _settle(fut: asyncio.Future, ok: bool, value: Any) -> None:
    if fut.cancelled():
        return
    if ok:
        fut.set_result(value)
    else:
        fut.set_exception(value)


def post_result(inbox: LoopInbox, fut: asyncio.Future, ok: bool, value: Any) -> None:
    """Complete ``fut`` (of ``inbox``'s loop) with ``value`` -- its result, or with
    ``ok=False`` its exception -- from any thread, unless it was cancelled."""
    inbox.post(_settle, fut, ok, value)


def _call(fut: asyncio.Future, inbox: LoopInbox, fn: Callable[..., Any], args: tuple) -> None:
    """One call of ``Workers``, its result or exception posted back to ``fut``."""
    if fut.cancelled():  # (read across threads: a later cancel still drops the result)
        return
    try:
        value, ok = fn(*args), True
    except BaseException as exc:  # handed to the caller, as an executor does
        value, ok = exc, False
    post_result(inbox, fut, ok, value)


class Workers(QueueThreads):
    """``count`` named threads (``prefix_N`` in Python and the OS, started at the first
    call) that run the calls of ``run`` in the order they come."""

    def __init__(self, count: int, prefix: str) -> None:
        if count < 1:
            raise ValueError(f"Workers needs at least one thread, got {count}")
        super().__init__([f"{prefix}_{i}" for i in range(count)], _call)
        self.count = count
        self.prefix = prefix

    def run(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """``fn(*args)`` on one of the threads, as a future of the running loop. Cancelling
        it before a thread takes the call skips the call; a call already running runs to
        its end, its result dropped. After ``close`` it raises ``RuntimeError``."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self.put((fut, inbox_of(loop), fn, args))  # (closed: put raises, fut is dropped)
        return fut
