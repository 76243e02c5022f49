"""BatchScheduler: drives a ``BatchQueue`` (``batching.py``, the pure core) from asyncio.

``poll()`` does one round of work synchronously -- fail expired items, start the batches
that are ready and fit -- and the background loop calls it whenever something changes or a
timer is due. It measures what the queue decides by: each key's drain rate (the queue
budget's) and each bucket's batch time (the frame lane's dynamic timeout).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from . import queue_budget
from .batching import Batch, BatchQueue, Pending
from .errors import DeadlineExceeded, FerryError

logger = logging.getLogger(__name__)


RunBatch = Callable[[Batch], Awaitable[Sequence[Any]]]


def answered_error(exc: BaseException, what: str) -> BaseException:
    """A failed batch's error as its items are answered with it: a bug (not a
    ``FerryError``) goes to the log with its traceback, and the answers carry it without
    one -- the traceback holds the frames below it (the batch, its rows and their device
    memory) in a cycle only the cyclic collector would end, keeping the bytes whose
    shortage often caused the failure."""
    if not isinstance(exc, FerryError):
        logger.error("%s failed", what, exc_info=exc)
    return exc.with_traceback(None)


async def settled(futs: Sequence[asyncio.Future]) -> list[Any]:
    """Each future's result, or what it ended in (its exception; ``CancelledError()`` where
    it was cancelled), in order: ``gather(*futs, return_exceptions=True)`` as a batch's
    items are awaited, one after another. Futures that complete together -- a batch's
    items, answered in one turn of the loop -- wake the caller once; gather's callbacks
    take a turn before the caller's (two hops a stage, on a loop whose every turn under
    load is a wait). Cancelling the caller cancels every future still pending, as gather."""
    for f in futs:
        if f.done():
            continue
        try:
            await f
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():  # the caller's, not the future's
                for g in futs:
                    g.cancel()
                raise
        except BaseException:  # (read below, as gather returns it)
            pass
    return [_outcome(f) for f in futs]


def _outcome(f: asyncio.Future) -> Any:
    if f.cancelled():
        return asyncio.CancelledError()
    exc = f.exception()
    return f.result() if exc is None else exc


class BatchScheduler:
    """Drives a ``BatchQueue`` from asyncio; ``run_batch`` returns one result per item.

    ``poll()`` does one round of work synchronously (fail expired items, start ready
    batches); the background loop calls it whenever something changes or a timer is due.
    Tests call it directly with a fake clock.
    """

    def __init__(
        self,
        run_batch: RunBatch,
        max_batch_size: int,
        max_wait_ms: float,
        max_queue: int,
        buckets: Sequence[int] = (),
        sizes: Mapping[str, int] | None = None,
        max_in_flight: int = 2,
        retry_after_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        on_batch: Callable[[Batch], None] | None = None,
        on_drop: Callable[[Pending, BaseException], None] | None = None,
        dispatch_when_idle: bool = False,
    ) -> None:
        self.queue = BatchQueue(
            max_batch_size, max_wait_ms / 1e3, max_queue, buckets, retry_after_s, sizes
        )
        self.dispatch_when_idle = dispatch_when_idle
        self.run_batch = run_batch
        self.max_in_flight = max_in_flight
        self.clock = clock
        self.on_batch = on_batch
        self.on_drop = on_drop
        self.in_flight = 0
        self._wake: asyncio.Event | None = None
        self._loop_task: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()
        self._closed = False

    def submit_nowait(
        self,
        item: Any,
        key: str,
        priority: bool = False,
        deadline: float | None = None,
        request_id: str = "",
        arrived: float | None = None,
        budget_s: float | None = None,
        frame: bool = False,
    ) -> asyncio.Future:
        """Queue one item; the future completes with its result. ``QueueFull`` at once (a
        full queue, or a predicted wait past ``budget_s`` counted from ``arrived``).
        ``frame``: a frame of a live stream (the queue's frame lane). Cancel the future to
        withdraw the item: the next poll forgets it."""
        if self._closed:
            raise RuntimeError("scheduler is closed")
        loop = asyncio.get_running_loop()
        p = self.queue.push(
            item, key, self.clock(), priority, deadline, request_id, arrived, budget_s, frame
        )
        p.future = loop.create_future()
        self._ensure_loop()
        assert self._wake is not None
        self._wake.set()
        return p.future

    async def submit(
        self,
        item: Any,
        key: str,
        priority: bool = False,
        deadline: float | None = None,
        request_id: str = "",
    ) -> Any:
        return await self.submit_nowait(item, key, priority, deadline, request_id)

    def poll(self) -> float | None:
        """Fail expired items, start every batch that is ready and fits; the next due time."""
        now = self.clock()
        for p in self.queue.expire(now):
            if p.future is None or not p.future.done():  # (done: its caller gave up)
                self._fail(p, now)
        room = self.max_in_flight - self.in_flight
        if room > 0:
            for batch in self.queue.pop_ready(
                now, limit=room, idle=self.dispatch_when_idle and self.in_flight == 0
            ):
                self._start(batch)
        # with no room, a finishing batch wakes the loop; only deadlines need a timer
        return self.queue.next_wakeup(include_waits=self.in_flight < self.max_in_flight)

    def _fail(self, p: Pending, now: float) -> None:
        """An item dropped before its batch: past its deadline, or its queue budget."""
        if p.deadline is not None and p.deadline <= now:
            err: Exception = DeadlineExceeded(
                "deadline passed before the request reached the GPU",
                waited_ms=round((now - p.enqueued) * 1e3, 3),
                request_id=p.request_id,
            )
        else:  # its queue budget ran out (timeout_action REJECT)
            err = queue_budget.timed_out(
                now - (p.dispatch_by or now) + (p.budget_s or 0.0),
                p.budget_s or 0.0,
                self.queue.retry_after_s,
                p.request_id,
                "gpu",
            )
        if self.on_drop:
            self.on_drop(p, err)
        if p.future is not None:
            p.future.set_exception(err)

    def _start(self, batch: Batch) -> None:
        self.in_flight += 1
        if self.on_batch:
            self.on_batch(batch)
        self._tasks.add(task := asyncio.ensure_future(self._run(batch)))
        task.add_done_callback(self._tasks.discard)

    async def _run(self, batch: Batch) -> None:
        try:
            results = await self.run_batch(batch)
            self.queue.times.observe(batch.key, batch.bucket, self.clock() - batch.formed_at)
            meter = self.queue.rates.setdefault(batch.key, queue_budget.RateMeter())
            busy = self.queue.depth(batch.key) > 0  # rows of its key still wait
            meter.done(len(batch), batch.formed_at, self.clock(), busy)
            if len(results) != len(batch.items):
                raise RuntimeError(
                    f"run_batch returned {len(results)} results for {len(batch.items)} items"
                )
            for p, r in zip(batch.items, results, strict=True):
                if p.future is not None and not p.future.done():
                    f = p.future
                    (f.set_exception if isinstance(r, BaseException) else f.set_result)(r)
        except BaseException as exc:  # the whole batch failed: every item hears of it
            if not isinstance(exc, asyncio.CancelledError):
                exc = answered_error(exc, f"batch of {len(batch)} ({batch.key})")
            for p in batch.items:
                if p.future is not None and not p.future.done():
                    p.future.set_exception(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            self.in_flight -= 1
            if self._wake is not None:
                self._wake.set()

    def _ensure_loop(self) -> None:
        if self._loop_task is None or self._loop_task.done():
            self._wake = asyncio.Event()
            self._loop_task = asyncio.ensure_future(self._drive())

    async def _drive(self) -> None:
        assert self._wake is not None
        while not self._closed:
            self._wake.clear()
            due = self.poll()
            timeout = None if due is None else max(0.0, due - self.clock())
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)

    async def close(self) -> None:
        """Run what is queued, wait for running batches, stop the loop."""
        self._closed = True
        for batch in self.queue.flush(self.clock()):
            self._start(batch)
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._loop_task is not None:
            self._loop_task.cancel()
