"""The executor's batches between commit and result: each is finished by the first thread
that needs it, so the thread that waits is woken once, by the device.

A batch's result (``BatchResult``) holds its one completion event. A thread that waits
without a timeout (``r.wait()``) blocks on that event itself (``cudaEventSynchronize``,
the GIL released, a sleeping wait) and runs the batch's finishing step in its own thread:
one wake-up, from the driver, as torch's own loop has. Before, the completion thread
blocked on the event and then woke the waiter through a condition: two wake-ups per batch.

The completion thread (``Completions``) is for the others: an awaiter or a done-callback
(``await r``, ``add_done_callback``) and a bounded wait (``r.wait(timeout)``) hand their
batch to it, and it blocks on that event and finishes the batch. A batch nobody asks for
is finished by whoever next finds its event complete (``reap``: the health check reads
``in_flight`` through it, and a thread that finishes a later batch reaps the earlier ones)
or needs its staging slot (``drive_oldest``), and at ``close``. Each batch is claimed
once, under the lock, before its event is waited on: no two threads wait on one batch.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from .async_result import AsyncResult, complete
from .device import Event
from .threads import name_os_thread


class _Item:
    """One batch on its way: its event, its finishing step and its result."""

    __slots__ = ("event", "finish", "on_error", "result", "claimed", "wanted")

    def __init__(
        self,
        event: Event,
        finish: Callable[[], Any],
        on_error: Callable[[BaseException], Any] | None,
        result: BatchResult,
    ) -> None:
        self.event, self.finish, self.on_error, self.result = event, finish, on_error, result
        self.claimed = False  # a thread has taken it: it waits on the event and finishes it
        self.wanted = False  # an awaiter, a callback or a bounded wait: the thread's to do


class BatchResult(AsyncResult):
    """An ``AsyncResult`` that a waiting thread completes itself (see the module)."""

    __slots__ = ("_item", "_owner")

    def __init__(self, label: str, owner: Completions) -> None:
        super().__init__(label)
        self._item: _Item | None = None
        self._owner = owner

    def wait_for(self, timeout: float | None) -> bool:
        item = self._item
        if item is not None and not self.done():
            self._owner.wait(item, timeout)
        return super().wait_for(timeout)

    def add_done_callback(self, cb: Callable[[AsyncResult], Any]) -> None:
        super().add_done_callback(cb)
        item = self._item
        if item is not None and not self.done():
            self._owner.want(item)


class Completions:
    """The pending batches of one executor, in commit order, and the thread for the ones
    handed to it. ``add`` returns the result a commit hands back."""

    def __init__(self, name: str = "ferry-completion") -> None:
        self._name = name
        self._cond = threading.Condition(threading.Lock())
        self._pending: list[_Item] = []
        self._thread: threading.Thread | None = None
        self._closed = False

    def add(
        self,
        event: Event,
        finish: Callable[[], Any],
        label: str,
        on_error: Callable[[BaseException], Any] | None = None,
    ) -> AsyncResult:
        """The result of a batch that is done when ``event`` is; an event that is already
        complete (the CPU backend's) is finished here, inline."""
        if event.raw is None:
            done: AsyncResult = AsyncResult(label)
            complete(event, finish, done, on_error)
            return done
        result = BatchResult(label, self)
        item = result._item = _Item(event, finish, on_error, result)
        with self._cond:
            if self._closed:
                raise RuntimeError("the executor's completions are closed")
            self._pending.append(item)
        return result

    # ------------------------------------------------------------------ who finishes
    def _claim(self, item: _Item) -> bool:
        with self._cond:
            if item.claimed:
                return False
            item.claimed = True
            return True

    def _run(self, item: _Item) -> None:
        """Wait on the claimed item's event (in this thread), finish it, then finish the
        earlier batches whose events are complete by now."""
        complete(item.event, item.finish, item.result, item.on_error)
        item.result._item = None
        with self._cond:
            i = self._pending.index(item)
            older = [it for it in self._pending[:i] if not it.claimed]
            del self._pending[i]
        for it in older:
            if it.event.done() and self._claim(it):
                self._run(it)

    def wait(self, item: _Item, timeout: float | None) -> None:
        """A thread waits on ``item``: without a timeout (or when its event is complete) it
        finishes the batch itself; a bounded wait hands it to the completion thread."""
        if timeout is None or item.event.done():
            if self._claim(item):
                self._run(item)
            return
        self.want(item)

    def want(self, item: _Item) -> None:
        """Hand ``item`` to the completion thread (started at the first one)."""
        thread = None
        if self._thread is None:
            thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
        with self._cond:
            item.wanted = True
            if self._thread is None and thread is not None and not self._closed:
                self._thread = thread
                thread.start()
            self._cond.notify()

    def _loop(self) -> None:
        name_os_thread()
        while True:
            with self._cond:
                item = self._next_wanted()
                while item is None:
                    if self._closed:
                        return
                    self._cond.wait()
                    item = self._next_wanted()
                item.claimed = True
            self._run(item)

    def _next_wanted(self) -> _Item | None:
        for it in self._pending:
            if it.wanted and not it.claimed:
                return it
        return None

    # ------------------------------------------------------------------ the rest
    def reap(self) -> int:
        """Finish every unclaimed batch whose event is complete; never blocks."""
        with self._cond:
            free = [it for it in self._pending if not it.claimed]
        n = 0
        for it in free:
            if it.event.done() and self._claim(it):
                self._run(it)
                n += 1
        return n

    def drive_oldest(self) -> bool:
        """Finish, in this thread, the oldest batch that nobody waits for and nobody handed
        to the completion thread, blocking on its event (a prepare that needs its slot)."""
        with self._cond:
            item = next((it for it in self._pending if not it.claimed and not it.wanted), None)
            if item is None:
                return False
            item.claimed = True
        self._run(item)
        return True

    def __len__(self) -> int:
        return len(self._pending)

    def close(self, timeout: float = 10.0) -> None:
        """Finish what is pending, then stop the completion thread."""
        with self._cond:
            self._closed = True
            free = [it for it in self._pending if not it.claimed]
            for it in free:
                it.claimed = True
            thread = self._thread
            self._cond.notify_all()
        for it in free:
            self._run(it)
        if thread is not None:
            thread.join(timeout)
