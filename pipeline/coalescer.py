"""Coalescer: requests that arrive close together leave as one downstream call.

The ingress's half of "a ferry leaves when it is full or when its timetable says so": a
group leaves after a window, at a size, and only while the downstream has room, so hops
carry micro-batches under load. (The GPU stage's batches are ``batching.BatchScheduler``'s.)

With a queue-time budget (``queue_budget.py``) a request is refused at once when the
requests waiting here ahead of it, over the rate at which groups come back while requests
wait, say it would wait here past the budget, and one that waited past it is dropped before
it is sent. (Downstream, the GPU stage's scheduler keeps the same budget, counted from the
request's arrival here.)
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from . import queue_budget
from .errors import QueueFull

# item, its future, arrival, request id, the request's "started" flag where one request
# brought many items (``submit_many``; None for one), and whether it is a stream's frame
_Entry = tuple[Any, asyncio.Future, float, str, list[bool] | None, bool]


class Coalescer:
    """Groups items into one downstream call: a group leaves after ``window_s``, at
    ``max_items``, and -- under load -- only when fewer than ``max_in_flight`` groups are
    out. While the downstream is busy the next group keeps growing, so the number of calls
    follows the downstream's pace instead of the arrival rate: at 300 requests a second a
    fixed 2 ms window makes groups of one, a bounded in-flight count makes groups of ten.

    ``run(items)`` returns one result (or exception) per item. A window of 0 still groups
    what arrives in the same event-loop turn. With ``dispatch_when_idle``, a group that
    starts while no group is out and none left within the last window leaves at the end of
    the event-loop turn instead of after the window: a lone request pays no window, while
    under load (groups leaving all the time) the window and the in-flight bound decide as
    before. (Dispatching whenever nothing is out was measured to cost 7-13% throughput at
    48 clients on two cores: under load the count dips to 0 often, and each dip sent a
    group of one.) ``held()``, where given, is how many requests the replica holds: a
    request that is the only one leaves at once whenever none is out, however soon after
    the last group.

    ``budget_s``: the queue-time budget (None: none); ``on_reject(reason)`` hears of each
    request refused or dropped by it. A request whose caller gave up (its future
    cancelled) is not sent.

    Frames of live streams (``submit_frame``) share the groups: admitted with their stream,
    not one by one, never dropped by the budget (their deadline rules them), and cut into
    the next group ahead of the requests waiting with them, so per-request traffic never
    starves an admitted stream. One that has not left can be withdrawn (``withdraw``).
    """

    def __init__(
        self,
        run: Callable[[list[Any]], Awaitable[Sequence[Any]]],
        window_s: float,
        max_items: int,
        max_in_flight: int | None = None,
        dispatch_when_idle: bool = False,
        budget_s: float | None = None,
        retry_after_s: float = 1.0,
        on_reject: Callable[[str], None] | None = None,
        held: Callable[[], int] | None = None,
    ) -> None:
        self.run = run
        self.held = held
        self.window_s = window_s
        self.max_items = max_items
        self.max_in_flight = max_in_flight
        self.dispatch_when_idle = dispatch_when_idle
        self.budget_s = budget_s
        self.retry_after_s = retry_after_s
        self.on_reject = on_reject
        self.meter = queue_budget.RateMeter()  # requests answered per second
        self._out_items = 0  # requests in the groups that are out
        self._last_dispatch = float("-inf")
        self.in_flight = 0
        self.group_sizes: deque[int] = deque(maxlen=1024)
        self._group: list[_Entry] = []
        self._timer: asyncio.Handle | None = None
        self._due = False  # the window has passed (or the group is full) but no slot was free
        self._tasks: set[asyncio.Task] = set()

    async def submit(self, item: Any, request_id: str = "") -> Any:
        loop = asyncio.get_running_loop()
        self._admit(loop.time(), request_id)
        return await self._put(item, request_id, None)

    def submit_many(self, items: Sequence[Any], request_id: str = "") -> list[asyncio.Future]:
        """One request of many items (a v2 request's images), each its own item downstream:
        admitted once, as a unit -- its own items are not queue ahead of one another -- and
        once any of them has left, none of the rest is dropped at dispatch (the request has
        started: Triton's budget runs until a request's batch starts). ``QueueFull`` at once
        when refused; else one future per item (cancel them to withdraw the rest)."""
        loop = asyncio.get_running_loop()
        self._admit(loop.time(), request_id)
        started = [False]
        return [self._put(item, request_id, started) for item in items]

    def submit_frame(self, item: Any, request_id: str = "") -> asyncio.Future:
        """One frame of an admitted stream: no admission here, ahead of the requests in the
        next group, never dropped by the budget. Its future (cancel it, or ``withdraw``,
        to give it up)."""
        return self._put(item, request_id, None, frame=True)

    def withdraw(self, future: asyncio.Future) -> bool:
        """Give up an item that has not left (its future cancelled; True); False once it
        has left, or is done."""
        if future.done() or not any(e[1] is future for e in self._group):
            return False
        future.cancel()
        return True

    @property
    def waiting(self) -> int:
        """Items waiting to leave (their callers have not given up)."""
        return sum(1 for e in self._group if not e[1].done())

    def check(self, request_id: str = "") -> None:
        """``QueueFull`` now if a request arriving now would be refused: callers ask before
        they read a body, so a refusal costs no upload and no parsing (``submit`` asks
        again)."""
        self._admit(asyncio.get_running_loop().time(), request_id)

    def _admit(self, now: float, request_id: str) -> None:
        if self.budget_s is not None:
            self._drop_gone_head()
            try:
                queue_budget.admit(
                    0.0,
                    len(self._group),
                    self.meter,
                    now - self._group[0][2] if self._group else None,
                    self.budget_s,
                    self.retry_after_s,
                    request_id,
                    "ingress",
                )
            except QueueFull:
                if self.on_reject:
                    self.on_reject(queue_budget.ADMISSION)
                raise

    def _drop_gone_head(self) -> None:
        """Forget the oldest waiting requests whose callers gave up (their deadline passed,
        the client went): they are neither queue ahead of a new request nor the age of the
        queue's head. (Those further back go at the next flush.)"""
        gone = 0
        for e in self._group:
            if not e[1].done():
                break
            gone += 1
        if gone:
            del self._group[:gone]

    def _put(
        self, item: Any, request_id: str, started: list[bool] | None, frame: bool = False
    ) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._group.append((item, fut, loop.time(), request_id, started, frame))
        if len(self._group) >= self.max_items:
            self._flush()
        elif self._timer is None and not self._due:
            idle = (
                self.dispatch_when_idle
                and self.in_flight == 0
                and (loop.time() - self._last_dispatch >= self.window_s or self._alone(frame))
            )
            self._timer = (
                loop.call_later(self.window_s, self._flush)
                if self.window_s > 0 and not idle
                else loop.call_soon(self._flush)
            )
        return fut

    def _alone(self, frame: bool) -> bool:
        """This request is the only one the replica holds (``held``): no other can join its
        group within the window, so waiting it would only add latency (one client sending
        request after request: each used to wait the window when the last group had left
        within it)."""
        return not frame and len(self._group) == 1 and self.held is not None and self.held() <= 1

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.max_in_flight is not None and self.in_flight >= self.max_in_flight:
            self._due = True  # leaves when a group comes back
            return
        self._due = False
        now = asyncio.get_running_loop().time()
        live = [e for e in self._group if not e[1].done() and not self._timed_out(e, now)]
        live.sort(key=lambda e: not e[5])  # frames first, else in arrival order
        group, rest = live[: self.max_items], live[self.max_items :]
        self._group = sorted(rest, key=lambda e: e[2]) if group and group[-1][5] else rest
        if group:
            for e in group:
                if e[4] is not None:
                    e[4][0] = True  # its request has started
            self._last_dispatch = now
            self.in_flight += 1
            self._out_items += len(group)
            self.group_sizes.append(len(group))
            task = asyncio.ensure_future(self._run(group, now))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            _cancel_when_abandoned(task, [e[1] for e in group])
        if self._group and len(self._group) >= self.max_items:
            self._flush()

    def _timed_out(self, entry: _Entry, now: float) -> bool:
        """Fail a request that waited here past the budget (dropped at dispatch)."""
        waited = now - entry[2]
        if self.budget_s is None or waited <= self.budget_s or (entry[4] and entry[4][0]):
            return False
        if entry[5]:  # a stream's frame: its deadline rules it, not the budget
            return False
        entry[1].set_exception(
            queue_budget.timed_out(waited, self.budget_s, self.retry_after_s, entry[3], "ingress")
        )
        if self.on_reject:
            self.on_reject(queue_budget.DISPATCH)
        return True

    async def _run(self, group: list[_Entry], started: float) -> None:
        try:
            results = await self.run([item for item, *_ in group])
            busy = bool(self._group) or self._due  # requests wait for this slot
            self.meter.done(len(group), started, asyncio.get_running_loop().time(), busy)
        except BaseException as exc:
            for _, f, *_ in group:
                if not f.done():
                    f.set_exception(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        finally:
            self.in_flight -= 1
            self._out_items -= len(group)
            if self._due or (self._group and self._timer is None):
                self._flush()
        for (_, f, *_), r in zip(group, results, strict=True):
            if f.done():
                continue
            if isinstance(r, BaseException):
                f.set_exception(r)
            else:
                f.set_result(r)


def _cancel_when_abandoned(task: asyncio.Task, futures: list[asyncio.Future]) -> None:
    """Cancel a group's downstream call once every request in it has been given up (each
    future cancelled by its waiter: a deadline, a client gone). Its slot comes back at once
    -- not when the call ends, which for a replica on a lost node is when Ray declares the
    node dead -- and the stage holding the call hears of the cancel. Futures answered by the
    call itself are set while it runs, so their callbacks find it done and cancel nothing."""
    left = [len(futures)]

    def gone(_f: asyncio.Future) -> None:
        left[0] -= 1
        if left[0] == 0 and not task.done():
            task.cancel()

    for f in futures:
        f.add_done_callback(gone)
