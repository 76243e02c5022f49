"""The coalescer's frames of live streams: in the same groups as requests, cut ahead of them,
admitted with their stream (not by the queue budget), withdrawn while they have not left."""

from __future__ import annotations

import asyncio

import pytest

from pipeline.coalescer import Coalescer
from pipeline.errors import QueueFull
from tests.unit import virtual_time


class Gate:
    """A downstream that records its groups and answers each once the test lets it."""

    def __init__(self) -> None:
        self.calls: list[list] = []
        self.open = asyncio.Event()

    async def __call__(self, items: list) -> list:
        self.calls.append(list(items))
        await self.open.wait()
        return [str(i).upper() for i in items]


async def _turns(n: int = 3) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def test_frames_ride_in_the_next_group_ahead_of_the_requests_waiting_with_them():
    async def main():
        down = Gate()
        c = Coalescer(down, window_s=0.0, max_items=3, max_in_flight=1)
        first = asyncio.ensure_future(c.submit("r0"))
        await _turns()  # r0 leaves alone; the next group grows while it is out
        reqs = [asyncio.ensure_future(c.submit(r)) for r in ("r1", "r2", "r3")]
        await _turns()
        frame = c.submit_frame("f0")
        assert c.waiting == 4
        down.open.set()
        assert await first == "R0" and await frame == "F0"
        assert [await r for r in reqs] == ["R1", "R2", "R3"]
        return down.calls

    calls = asyncio.run(main())
    assert calls == [["r0"], ["f0", "r1", "r2"], ["r3"]]


def test_a_frame_withdrawn_before_it_leaves_is_not_sent_one_that_left_cannot_be():
    async def main():
        down = Gate()
        c = Coalescer(down, window_s=0.0, max_items=8, max_in_flight=1)
        out = c.submit_frame("f0")
        await _turns()  # f0 leaves
        waiting = c.submit_frame("f1")
        kept = c.submit_frame("f2")
        assert c.withdraw(waiting) and waiting.cancelled()
        assert not c.withdraw(out)  # it has left: the caller waits for (or drops) its answer
        assert c.waiting == 1
        down.open.set()
        assert await out == "F0" and await kept == "F2"
        assert not c.withdraw(kept)  # done
        return down.calls

    assert asyncio.run(main()) == [["f0"], ["f2"]]


def test_frames_pass_the_budget_that_refuses_and_drops_requests():
    """Under a queue budget a request whose predicted wait passes it is refused, and one
    that waited past it dropped at dispatch; a stream's frame is neither (its stream was
    admitted, its deadline rules it)."""

    async def main():
        loop = asyncio.get_running_loop()
        down = Gate()
        c = Coalescer(down, window_s=0.0, max_items=8, max_in_flight=1, budget_s=0.5)
        first = asyncio.ensure_future(c.submit("r0"))
        await _turns()
        late_req = asyncio.ensure_future(c.submit("r1"))
        frame = c.submit_frame("f0")
        await asyncio.sleep(1.0)  # (virtual) both wait past the budget behind r0
        with pytest.raises(QueueFull):
            c.check("r2")  # the head of the queue is older than the budget
        down.open.set()
        assert await first == "R0" and await frame == "F0"
        with pytest.raises(QueueFull) as e:
            await late_req
        assert e.value.reason == "queue_timeout"
        return down.calls, loop.time()

    calls, _ = virtual_time.run(main())
    assert calls == [["r0"], ["f0"]]
