"""pipeline/handoff.py: work handed from an event loop to Ferry's threads and back, the loop
woken once for every result that came back together."""

import asyncio
import sys
import threading
import time

import pytest

from pipeline.async_result import AsyncResult
from pipeline.errors import DeviceError, InvalidInput
from pipeline.handoff import LoopInbox, Workers, inbox_of
from pipeline.preprocess_gpu.rounds import waited


def _os_name() -> str:
    with open(f"/proc/self/task/{threading.get_native_id()}/comm") as f:
        return f.read().strip()


def test_a_call_returns_its_value_or_raises_its_exception_in_the_caller():
    workers = Workers(2, "ferry-t")

    def boom(x):
        raise ValueError(x)

    async def main():
        ok = await workers.run(pow, 3, 4)
        with pytest.raises(ValueError) as err:
            await workers.run(boom, 7)
        return ok, err.value

    ok, err = asyncio.run(main())
    assert ok == 81 and err.args == (7,)
    workers.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and prctl are Linux's")
def test_calls_run_on_the_named_threads_and_not_on_the_loop():
    workers = Workers(2, "ferry-t")

    async def main():
        loop_thread = threading.get_ident()
        got = await asyncio.gather(
            *(workers.run(lambda: (threading.get_ident(), _os_name())) for _ in range(16))
        )
        return loop_thread, got

    loop_thread, got = asyncio.run(main())
    assert all(ident != loop_thread for ident, _ in got)
    assert {name for _, name in got} <= {"ferry-t_0", "ferry-t_1"}
    workers.close()


def test_results_that_come_back_together_wake_the_loop_once():
    """Eight calls let go at once while the loop is busy: their eight results wake it once."""
    workers = Workers(8, "ferry-t")
    gate = threading.Event()
    drains = []

    async def main():
        loop = asyncio.get_running_loop()
        real = loop.call_soon_threadsafe

        def counted(fn, *args):  # (counts the wake-ups; each still made)
            drains.append(fn)
            return real(fn, *args)

        loop.call_soon_threadsafe = counted
        futs = [workers.run(lambda i=i: (gate.wait(5), i)[1]) for i in range(8)]
        gate.set()
        box = inbox_of(loop)
        for _ in range(1000):  # the loop kept busy (no await) until all eight are posted
            if len(box._items) == 8:
                break
            time.sleep(0.01)
        return await asyncio.gather(*futs)

    assert asyncio.run(main()) == list(range(8))
    assert len(drains) == 1
    workers.close()


def test_a_call_cancelled_before_a_thread_takes_it_never_runs():
    workers = Workers(1, "ferry-t")
    gate = threading.Event()
    ran = []

    async def main():
        first = workers.run(gate.wait, 5)
        second = workers.run(ran.append, "second")
        second.cancel()
        gate.set()
        await first
        await workers.run(ran.append, "third")  # (the queue's order: second came before)

    asyncio.run(main())
    assert ran == ["third"]
    workers.close()


def test_the_inbox_runs_callbacks_in_order_and_survives_one_that_raises():
    seen, errors = [], []

    async def main():
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _loop, ctx: errors.append(ctx["exception"]))
        box = inbox_of(loop)
        assert inbox_of(loop) is box
        done = loop.create_future()

        def post_all():
            box.post(seen.append, 1)
            box.post(lambda: 1 / 0)
            box.post(seen.append, 2)
            box.post(done.set_result, None)

        threading.Thread(target=post_all).start()
        await done

    asyncio.run(main())
    assert seen == [1, 2] and len(errors) == 1 and isinstance(errors[0], ZeroDivisionError)


def test_posting_to_a_closed_loop_drops_the_callback():
    loop = asyncio.new_event_loop()
    box = LoopInbox(loop)
    loop.close()
    for _ in range(3):  # no error: the loop is gone, as asyncio drops a late result
        box.post(print, "never")
    assert not box._items and not box._armed


def test_closed_workers_refuse_a_call_instead_of_leaving_it_unanswered():
    workers = Workers(1, "ferry-t")

    async def main():
        await workers.run(int, "1")
        workers.close()
        with pytest.raises(RuntimeError, match="closed"):
            workers.run(int, "2")

    asyncio.run(main())


def test_a_new_loop_in_the_thread_gets_its_own_inbox():
    async def mine():
        return inbox_of(asyncio.get_running_loop())

    first, second = asyncio.run(mine()), asyncio.run(mine())
    assert first is not second and first.loop is not second.loop


def test_an_async_result_completed_by_a_thread_reaches_its_awaiter_through_the_inbox():
    async def main():
        r: AsyncResult[int] = AsyncResult("t")
        bad: AsyncResult[int] = AsyncResult("t")
        threading.Timer(0.01, r.set_result, (5,)).start()
        threading.Timer(0.01, bad.set_exception, (InvalidInput("no"),)).start()
        with pytest.raises(InvalidInput):
            await bad
        return await r

    assert asyncio.run(main()) == 5


class _Event:
    """A round's end on the device as the thread sees it: complete, or failing as a CUDA
    error surfaces from ``cudaEventSynchronize``."""

    def __init__(self, error=None):
        self.error = error

    def synchronize(self):
        if self.error is not None:
            raise self.error


class _Done:
    def __init__(self, event):
        self.event = event


def test_a_waited_round_gives_its_wait_in_ms_and_fails_with_a_device_error():
    answers, wait_ms, cpu_ms, call_ms = waited(
        lambda n: (list(range(n)), _Done(_Event()), 1.5, None), 3
    )
    assert answers == [0, 1, 2] and wait_ms >= 0 and cpu_ms == 1.5 and call_ms is None
    with pytest.raises(DeviceError, match="RuntimeError: illegal address"):
        waited(lambda: ([], _Done(_Event(RuntimeError("illegal address"))), 0.0, None))
    ours = InvalidInput("refused")
    with pytest.raises(InvalidInput):  # Ferry's own error as it is
        waited(lambda: ([], _Done(_Event(ours)), 0.0, None))
