"""BatchScheduler: a ferry leaves when it is full or when its timetable says so.

* A batch leaves when it holds its key's size (``sizes``: its model's ``max_batch``; else
  ``max_batch_size``) or its oldest item waited ``max_wait_ms``; the executor pads it.
* A high-priority lane skips the wait: a priority item leaves with the next batch at once
  (filled up with waiting normal items).
* The queue is bounded: past ``max_queue`` items, ``submit`` answers ``QueueFull`` at once.
* An item whose deadline has passed is dropped with ``DeadlineExceeded`` before it costs
  GPU time.
* The queue-time budget (``queue_budget.py``): an item that brings ``dispatch_by`` (its
  arrival plus its model's budget) is refused at once when the items ahead of it over the
  key's measured drain rate say it would leave after that, and dropped with ``QueueFull``
  (reason ``queue_timeout``) once that time passes while it still waits.
* A batch is only formed when the runner has room (``max_in_flight``), so under load the
  queue grows while the GPU is busy and the next batch leaves full.

``BatchQueue``, the pure core, takes a clock (tests: a fake one); ``BatchScheduler`` drives it.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import itertools
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import queue_budget
from .errors import DeadlineExceeded, FerryError, QueueFull

logger = logging.getLogger(__name__)
_seq = itertools.count()


@dataclass(eq=False)
class Pending:
    item: Any
    key: str
    enqueued: float
    deadline: float | None = None
    priority: bool = False
    request_id: str = ""
    dispatch_by: float | None = None  # arrival + the model's queue budget (same clock)
    budget_s: float | None = None
    seq: int = field(default_factory=lambda: next(_seq))
    future: Any = None  # set by the asyncio driver


@dataclass
class Batch:
    key: str
    items: list[Pending]
    bucket: int
    reason: str  # "full", "timeout", "priority", "idle" or "flush"
    formed_at: float

    def __len__(self) -> int:
        return len(self.items)


class BatchQueue:
    """Per-key FIFO queues with a priority lane; decides which batches are ready."""

    def __init__(
        self,
        max_batch_size: int,
        max_wait_s: float,
        max_queue: int,
        buckets: Sequence[int] = (),
        retry_after_s: float = 1.0,
        sizes: Mapping[str, int] | None = None,
    ) -> None:
        if max_batch_size < 1 or max_wait_s < 0 or max_queue < 1:
            raise ValueError(f"bad batching limits: {max_batch_size=}, {max_wait_s=}, {max_queue=}")
        self.max_batch_size = max_batch_size
        self.sizes = dict(sizes or {})
        self.max_wait_s = max_wait_s
        self.max_queue = max_queue
        self.retry_after_s = retry_after_s
        self.buckets = tuple(sorted(buckets)) or (max_batch_size,)
        self._normal: dict[str, deque[Pending]] = {}
        self._priority: dict[str, deque[Pending]] = {}
        self._size = 0
        self.rates: dict[str, queue_budget.RateMeter] = {}  # per key, fed by the driver

    def __len__(self) -> int:
        return self._size

    def depth(self, key: str) -> int:
        return len(self._normal.get(key, ())) + len(self._priority.get(key, ()))

    def push(
        self,
        item: Any,
        key: str,
        now: float,
        priority: bool = False,
        deadline: float | None = None,
        request_id: str = "",
        arrived: float | None = None,
        budget_s: float | None = None,
    ) -> Pending:
        """Queue one item. ``arrived`` (this queue's clock; default ``now``) and
        ``budget_s`` give its queue-time budget: ``QueueFull`` at once when the predicted
        wait passes it."""
        if self._size >= self.max_queue:
            raise QueueFull(
                "inference queue is full",
                queue_depth=self._size,
                max_queue=self.max_queue,
                retry_after_s=self.retry_after_s,
            )
        dispatch_by = None
        if budget_s is not None:
            start = now if arrived is None else min(arrived, now)
            ahead = len(self._priority.get(key, ())) + (
                0 if priority else len(self._normal.get(key, ()))
            )
            head = self._oldest(key)
            queue_budget.admit(
                now - start,
                ahead,
                self.rates.get(key),
                None if head is None else now - head,
                budget_s,
                self.retry_after_s,
                request_id,
                "gpu",
            )
            dispatch_by = start + budget_s
        p = Pending(item, key, now, deadline, priority, request_id, dispatch_by, budget_s)
        lanes = self._priority if priority else self._normal
        lanes.setdefault(key, deque()).append(p)
        self._size += 1
        return p

    def bucket_for(self, n: int) -> int:
        i = bisect.bisect_left(self.buckets, n)
        return self.buckets[min(i, len(self.buckets) - 1)]

    def expire(self, now: float) -> list[Pending]:
        """Remove and return the items whose deadline or queue budget has passed."""
        dead: list[Pending] = []
        for lanes in (self._priority, self._normal):
            for key, q in lanes.items():
                if any(_due(p, now) for p in q):
                    keep = deque()
                    for p in q:
                        (dead if _due(p, now) else keep).append(p)
                    lanes[key] = keep
        self._size -= len(dead)
        return dead

    def pop_ready(self, now: float, limit: int | None = None, idle: bool = False) -> list[Batch]:
        """Batches that should leave now (at most ``limit``), oldest-waiting keys first.

        ``idle``: nothing is running, so waiting buys nothing -- the first batch leaves now
        with whatever is queued (a ferry with no other passengers coming leaves at once)."""
        ready: list[Batch] = []
        keys = sorted(set(self._normal) | set(self._priority), key=lambda k: self._oldest(k) or now)
        if idle and keys and (limit is None or limit > 0):
            key = keys[0]
            if self._priority.get(key) or self._normal.get(key):
                ready.append(self._take(key, now, "idle"))
        for key in keys:
            while limit is None or len(ready) < limit:
                b = self._form(key, now)
                if b is None:
                    break
                ready.append(b)
        return ready

    def flush(self, now: float) -> list[Batch]:
        """Everything queued, as batches, whatever their age (shutdown)."""
        out = []
        for key in list(set(self._normal) | set(self._priority)):
            while self.depth(key):
                out.append(self._take(key, now, "flush"))
        return out

    def next_wakeup(self, include_waits: bool = True) -> float | None:
        """When the earliest waiting batch times out or the earliest deadline passes.

        ``include_waits=False`` leaves batch timeouts out (nothing can start anyway)."""
        times = []
        for q in self._normal.values():
            if q and include_waits:
                times.append(q[0].enqueued + self.max_wait_s)
        for lanes in (self._normal, self._priority):
            for q in lanes.values():
                times.extend(p.deadline for p in q if p.deadline is not None)
                times.extend(p.dispatch_by for p in q if p.dispatch_by is not None)
        return min(times) if times else None

    def _oldest(self, key: str) -> float | None:
        ts = [q[0].enqueued for q in (self._normal.get(key), self._priority.get(key)) if q]
        return min(ts) if ts else None

    def _form(self, key: str, now: float) -> Batch | None:
        pq = self._priority.get(key)
        nq = self._normal.get(key)
        if pq:
            return self._take(key, now, "priority")
        if not nq:
            return None
        if len(nq) >= self.sizes.get(key, self.max_batch_size):
            return self._take(key, now, "full")
        if now - nq[0].enqueued >= self.max_wait_s - 1e-9:  # clocks are floats
            return self._take(key, now, "timeout")
        return None

    def _take(self, key: str, now: float, reason: str) -> Batch:
        items: list[Pending] = []
        size = self.sizes.get(key, self.max_batch_size)
        for q in (self._priority.get(key), self._normal.get(key)):
            while q and len(items) < size:
                items.append(q.popleft())
        self._size -= len(items)
        return Batch(key, items, self.bucket_for(len(items)), reason, now)


def _due(p: Pending, now: float) -> bool:
    return (p.deadline is not None and p.deadline <= now) or (
        p.dispatch_by is not None and p.dispatch_by <= now
    )


RunBatch = Callable[[Batch], Awaitable[Sequence[Any]]]


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
    ) -> asyncio.Future:
        """Queue one item; the future completes with its result. ``QueueFull`` at once (a
        full queue, or a predicted wait past ``budget_s`` counted from ``arrived``)."""
        if self._closed:
            raise RuntimeError("scheduler is closed")
        loop = asyncio.get_running_loop()
        p = self.queue.push(
            item, key, self.clock(), priority, deadline, request_id, arrived, budget_s
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
            if p.deadline is not None and p.deadline <= now:
                err: Exception = DeadlineExceeded(
                    "deadline passed before the request reached the GPU",
                    waited_ms=round((now - p.enqueued) * 1e3, 3),
                    request_id=p.request_id,
                )
            else:  # its queue budget ran out (timeout_action REJECT)
                err = queue_budget.timed_out(
                    now - p.dispatch_by + (p.budget_s or 0.0),
                    p.budget_s or 0.0,
                    self.queue.retry_after_s,
                    p.request_id,
                    "gpu",
                )
            if self.on_drop:
                self.on_drop(p, err)
            if p.future is not None and not p.future.done():
                p.future.set_exception(err)
        room = self.max_in_flight - self.in_flight
        if room > 0:
            for batch in self.queue.pop_ready(
                now, limit=room, idle=self.dispatch_when_idle and self.in_flight == 0
            ):
                self._start(batch)
        # with no room, a finishing batch wakes the loop; only deadlines need a timer
        return self.queue.next_wakeup(include_waits=self.in_flight < self.max_in_flight)

    def _start(self, batch: Batch) -> None:
        self.in_flight += 1
        if self.on_batch:
            self.on_batch(batch)
        self._tasks.add(task := asyncio.ensure_future(self._run(batch)))
        task.add_done_callback(self._tasks.discard)

    async def _run(self, batch: Batch) -> None:
        try:
            results = await self.run_batch(batch)
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
                if not isinstance(exc, FerryError):  # a bug: its traceback goes to the log
                    logger.error("batch of %d (%s) failed", len(batch), batch.key, exc_info=exc)
                # and not with the answers: it holds this frame and the ones below it --
                # the batch, its rows and their device memory -- in a cycle only the cyclic
                # collector would end, keeping the bytes whose shortage often caused it
                exc = exc.with_traceback(None)
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
