"""The GPU batches' timetable: a ferry leaves when it is full or when its timetable says so.

* A batch leaves when it holds its key's size (``sizes``: its model's ``max_batch``; else
  ``max_batch_size``) or its oldest item waited ``max_wait_ms``; the executor pads it.
* A high-priority lane skips the wait: a priority item leaves with the next batch at once
  (filled up with waiting normal items).
* A frame lane (the frames of live streams, ``docs/api.md``, Live streams): each frame carries its
  deadline, and a batch holding frames leaves when full, or once its oldest frame has waited
  as long as the bucket it would run in takes (``BucketTimes``, measured), or sooner where
  its earliest deadline needs: at that deadline less twice the bucket's time (one batch time
  to run, one of margin for the way back) -- a dynamic timeout instead of the fixed
  ``max_wait_ms`` (which it keeps until its bucket is measured). Frames are taken after
  priority items and before normal ones, so per-request traffic never starves an admitted
  stream.
* The queue is bounded: past ``max_queue`` items, ``submit`` answers ``QueueFull`` at once.
* An item whose deadline has passed is dropped with ``DeadlineExceeded`` before it costs
  GPU time, and one whose caller gave up (its future done) is forgotten.
* The queue-time budget (``queue_budget.py``): an item that brings ``dispatch_by`` (its
  arrival plus its model's budget) is refused at once when the items ahead of it over the
  key's measured drain rate say it would leave after that, and dropped with ``QueueFull``
  (reason ``queue_timeout``) once that time passes while it still waits.
* A batch is only formed when the runner has room (``max_in_flight``), so under load the
  queue grows while the GPU is busy and the next batch leaves full.

``BatchQueue``, the pure core, takes a clock (tests: a fake one); ``BatchScheduler``
(``batch_scheduler.py``) drives it from asyncio.
"""

from __future__ import annotations

import bisect
import itertools
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import queue_budget
from .errors import QueueFull

_seq = itertools.count()
LANES = ("priority", "frame", "normal")  # the order a batch takes its items in


class BucketTimes:
    """How long a batch of each (key, bucket) takes, measured: the exponentially weighted
    mean of the seconds from its start to its results (``observe``, by the driver). An
    unmeasured bucket is estimated by the smallest measured one above it (a larger batch
    takes no less time), else unknown."""

    def __init__(self, alpha: float = 0.3) -> None:
        self.alpha = alpha
        self._s: dict[str, dict[int, float]] = {}

    def observe(self, key: str, bucket: int, seconds: float) -> None:
        if seconds < 0:
            return
        times = self._s.setdefault(key, {})
        old = times.get(bucket)
        times[bucket] = seconds if old is None else old + self.alpha * (seconds - old)

    def estimate(self, key: str, bucket: int) -> float | None:
        times = self._s.get(key, {})
        if bucket in times:
            return times[bucket]
        above = [b for b in times if b > bucket]
        return times[min(above)] if above else None


@dataclass(eq=False)
class Pending:
    item: Any
    key: str
    enqueued: float
    deadline: float | None = None
    priority: bool = False
    request_id: str = ""
    frame: bool = False  # a frame of a live stream: the frame lane, dispatched by its deadline
    dispatch_by: float | None = None  # arrival + the model's queue budget (same clock)
    budget_s: float | None = None
    seq: int = field(default_factory=lambda: next(_seq))
    future: Any = None  # set by the asyncio driver


@dataclass
class Batch:
    key: str
    items: list[Pending]
    bucket: int
    reason: str  # "full", "timeout", "deadline", "priority", "idle" or "flush"
    formed_at: float

    def __len__(self) -> int:
        return len(self.items)


class BatchQueue:
    """Per-key FIFO lanes -- priority, frame, normal; decides which batches are ready."""

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
        self._lanes: dict[str, dict[str, deque[Pending]]] = {lane: {} for lane in LANES}
        self._normal, self._priority = self._lanes["normal"], self._lanes["priority"]
        self._frames = self._lanes["frame"]
        self._size = 0
        self.rates: dict[str, queue_budget.RateMeter] = {}  # per key, fed by the driver
        self.times = BucketTimes()  # per key and bucket, fed by the driver

    def __len__(self) -> int:
        return self._size

    def depth(self, key: str) -> int:
        return sum(len(lanes.get(key, ())) for lanes in self._lanes.values())

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
        frame: bool = False,
    ) -> Pending:
        """Queue one item. ``arrived`` (this queue's clock; default ``now``) and
        ``budget_s`` give its queue-time budget: ``QueueFull`` at once when the predicted
        wait passes it. ``frame``: a frame of a live stream (the frame lane; its
        ``deadline`` sets when its batch leaves)."""
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
        lane = "priority" if priority else "frame" if frame else "normal"
        p = Pending(item, key, now, deadline, priority, request_id, frame, dispatch_by, budget_s)
        self._lanes[lane].setdefault(key, deque()).append(p)
        self._size += 1
        return p

    def bucket_for(self, n: int) -> int:
        i = bisect.bisect_left(self.buckets, n)
        return self.buckets[min(i, len(self.buckets) - 1)]

    def expire(self, now: float) -> list[Pending]:
        """Remove and return the items whose deadline or queue budget has passed, and those
        whose caller gave up (their future done: nobody waits for them)."""
        dead: list[Pending] = []
        for lanes in self._lanes.values():
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
        keys = sorted(self._keys(), key=lambda k: self._oldest(k) or now)
        if idle and keys and (limit is None or limit > 0) and self.depth(keys[0]):
            ready.append(self._take(keys[0], now, "idle"))
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
        for key in list(self._keys()):
            while self.depth(key):
                out.append(self._take(key, now, "flush"))
        return out

    def next_wakeup(self, include_waits: bool = True) -> float | None:
        """When the earliest waiting batch times out (its fixed wait, or the frame lane's
        dynamic one) or the earliest deadline or budget passes.

        ``include_waits=False`` leaves batch timeouts out (nothing can start anyway)."""
        times = []
        if include_waits:
            times.extend(q[0].enqueued + self.max_wait_s for q in self._normal.values() if q)
            times.extend(self._frames_due(k)[0] for k, q in self._frames.items() if q)
        for lanes in self._lanes.values():
            for q in lanes.values():
                times.extend(p.deadline for p in q if p.deadline is not None)
                times.extend(p.dispatch_by for p in q if p.dispatch_by is not None)
        return min(times) if times else None

    def _keys(self) -> set[str]:
        return {k for lanes in self._lanes.values() for k, q in lanes.items() if q}

    def _oldest(self, key: str) -> float | None:
        ts = [q[0].enqueued for lanes in self._lanes.values() if (q := lanes.get(key))]
        return min(ts) if ts else None

    def _frames_due(self, key: str) -> tuple[float, str]:
        """When a batch of ``key``'s waiting frames leaves, and why: once its oldest frame has
        waited as long as the bucket the batch would run in takes (measured: ``timeout``),
        or sooner where its earliest deadline needs -- that deadline less twice the bucket's
        time (``deadline``); after ``max_wait_s`` while that bucket is unmeasured."""
        fq = self._frames[key]
        n = min(self.depth(key), self.sizes.get(key, self.max_batch_size))
        est = self.times.estimate(key, self.bucket_for(n))
        if est is None:
            return fq[0].enqueued + self.max_wait_s, "timeout"
        waited = fq[0].enqueued + est
        deadlines = [p.deadline for p in fq if p.deadline is not None]
        latest = min(deadlines) - 2.0 * est if deadlines else waited
        return (latest, "deadline") if latest < waited else (waited, "timeout")

    def _form(self, key: str, now: float) -> Batch | None:
        if self._priority.get(key):
            return self._take(key, now, "priority")
        if not self.depth(key):
            return None
        if self.depth(key) >= self.sizes.get(key, self.max_batch_size):
            return self._take(key, now, "full")
        if self._frames.get(key):
            due, why = self._frames_due(key)
            if now >= due - 1e-9:
                return self._take(key, now, why)
        nq = self._normal.get(key)
        if nq and now - nq[0].enqueued >= self.max_wait_s - 1e-9:  # clocks are floats
            return self._take(key, now, "timeout")
        return None

    def _take(self, key: str, now: float, reason: str) -> Batch:
        items: list[Pending] = []
        size = self.sizes.get(key, self.max_batch_size)
        for lanes in self._lanes.values():  # priority, frame, normal
            q = lanes.get(key)
            while q and len(items) < size:
                items.append(q.popleft())
        self._size -= len(items)
        return Batch(key, items, self.bucket_for(len(items)), reason, now)


def _due(p: Pending, now: float) -> bool:
    return (
        (p.deadline is not None and p.deadline <= now)
        or (p.dispatch_by is not None and p.dispatch_by <= now)
        or (p.future is not None and p.future.done())
    )
