"""Who finishes a batch (``pipeline/executor_completion.py``), on events that complete when
the test says so: a thread that waits blocks on the event itself and finishes the batch
in its own thread (one wake-up), an awaiter or a bounded wait hands it to the completion
thread, a batch nobody asks for is reaped or driven, and no event is waited on by two
threads. ``DeviceLikeEvent`` has cupy.cuda.Event's surface (``done``, ``synchronize``)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from pipeline.device import Event
from pipeline.errors import DeviceError
from pipeline.executor_completion import BatchResult, Completions


class DeviceLikeEvent:
    """Completes on ``fire()``; ``synchronize`` blocks until then and names its caller."""

    def __init__(self) -> None:
        self._fired = threading.Event()
        self.waiting = threading.Event()  # a thread is in synchronize
        self.waiters: list[str] = []

    @property
    def done(self) -> bool:
        return self._fired.is_set()

    def synchronize(self) -> None:
        self.waiters.append(threading.current_thread().name)
        self.waiting.set()
        self._fired.wait()

    def fire(self) -> None:
        self._fired.set()


def batch(c: Completions, value=1, fail: bool = False):
    raw = DeviceLikeEvent()
    ran: list[str] = []

    def finish():
        ran.append(threading.current_thread().name)
        if fail:
            raise RuntimeError("cudaErrorIllegalAddress")
        return value

    errors: list[BaseException] = []
    r = c.add(Event(raw), finish, f"b{value}", errors.append)
    return raw, r, ran, errors


def test_a_waiting_thread_waits_on_the_event_itself_and_finishes_the_batch():
    c = Completions("t-done")
    raw, r, ran, _ = batch(c, 7)
    assert isinstance(r, BatchResult) and not r.done() and len(c) == 1
    threading.Timer(0.05, raw.fire).start()
    assert r.wait() == 7
    me = threading.current_thread().name
    assert raw.waiters == [me] and ran == [me]  # one thread woken, by the event
    assert c._thread is None and len(c) == 0  # the completion thread was never needed
    c.close()


def test_an_awaiter_is_finished_by_the_completion_thread():
    c = Completions("t-done")
    raw, r, ran, _ = batch(c, 3)

    async def main():
        asyncio.get_running_loop().call_later(0.05, raw.fire)
        return await r

    assert asyncio.run(main()) == 3
    assert raw.waiters == ["t-done"] and ran == ["t-done"]
    c.close()


def test_a_bounded_wait_times_out_then_the_completion_thread_finishes_it():
    c = Completions("t-done")
    raw, r, ran, _ = batch(c, 5)
    with pytest.raises(TimeoutError):
        r.wait(0.05)
    # fired once the completion thread waits on it: fired before (a loaded machine can
    # leave the new thread unscheduled past the 50 ms), the next wait finds the event
    # complete and finishes the batch in this thread
    assert raw.waiting.wait(10)
    raw.fire()
    assert r.wait(10) == 5 and ran == ["t-done"] and raw.waiters == ["t-done"]
    c.close()


def test_a_failed_finish_is_the_results_error_and_reaches_on_error():
    c = Completions("t-done")
    raw, r, _, errors = batch(c, 1, fail=True)
    raw.fire()
    with pytest.raises(DeviceError):
        r.wait()
    assert len(errors) == 1 and isinstance(errors[0], DeviceError)
    c.close()


def test_batches_nobody_asks_for_are_reaped_driven_or_closed():
    c = Completions("t-done")
    (a, ra, _, _), (b, rb, _, _), (d, rd, ran_d, _) = (batch(c, k) for k in (1, 2, 3))
    assert c.reap() == 0  # nothing complete yet: nothing waited on
    assert a.waiters == []
    a.fire()
    assert c.reap() == 1 and ra.done() and a.waiters == [threading.current_thread().name]
    b.fire()
    assert c.drive_oldest() and rb.result() == 2  # the oldest nobody waits for, here
    assert len(c) == 1 and not rd.done()
    threading.Timer(0.05, d.fire).start()
    c.close()  # finishes what is pending
    assert rd.result() == 3 and ran_d == [threading.current_thread().name]


def test_finishing_a_batch_reaps_the_earlier_ones_already_complete():
    c = Completions("t-done")
    (a, ra, _, _), (b, rb, _, _) = batch(c, 1), batch(c, 2)
    a.fire()
    b.fire()
    assert rb.wait() == 2
    assert ra.done() and ra.result() == 1 and len(c) == 0
    c.close()


def test_each_event_is_waited_on_by_one_thread_however_many_ask():
    c = Completions("t-done")
    items = [batch(c, k) for k in range(20)]
    got: dict[int, int] = {}
    start = threading.Barrier(21)

    def waiter(k: int) -> None:
        start.wait()
        got[k] = items[k][1].wait()

    threads = [threading.Thread(target=waiter, args=(k,), name=f"w{k}") for k in range(20)]
    for t in threads:
        t.start()

    async def awaiters():
        return await asyncio.gather(*(items[k][1] for k in range(20)))

    start.wait()
    for raw, *_ in items:
        raw.fire()
    assert asyncio.run(awaiters()) == list(range(20))
    for t in threads:
        t.join(10)
    assert got == {k: k for k in range(20)}
    for raw, _, ran, _ in items:
        assert len(raw.waiters) <= 1 and len(ran) == 1  # claimed once, finished once
    c.close()
