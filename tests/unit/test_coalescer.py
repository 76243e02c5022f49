"""Coalescer: groups by window and size, growing while the downstream is busy."""

from __future__ import annotations

import asyncio

import pytest

from pipeline.coalescer import Coalescer
from tests.unit import virtual_time


def run(coro):
    return asyncio.run(coro)


def test_coalescer_groups_what_arrives_in_one_window():
    calls = []

    async def run_group(items):
        calls.append(list(items))
        return [ValueError(i) if i == "bad" else i.upper() for i in items]

    async def main():
        c = Coalescer(run_group, window_s=0.0, max_items=3)
        first = await asyncio.gather(c.submit("a"), c.submit("b"), return_exceptions=True)
        assert first == ["A", "B"]
        res = await asyncio.gather(
            *(c.submit(x) for x in ["c", "bad", "d", "e"]), return_exceptions=True
        )
        assert res[0] == "C" and isinstance(res[1], ValueError) and res[2:] == ["D", "E"]

    run(main())
    assert calls == [["a", "b"], ["c", "bad", "d"], ["e"]]  # max_items closes a group early


class GatedDownstream:
    """A Coalescer's downstream: records each group it gets, answers once the gate opens."""

    def __init__(self) -> None:
        self.calls: list[list] = []
        self.gate = asyncio.Event()

    async def __call__(self, items: list) -> list:
        self.calls.append(list(items))
        await self.gate.wait()
        return items


def test_coalescer_grows_groups_while_the_downstream_is_busy():
    async def main():
        down = GatedDownstream()
        calls, gate = down.calls, down.gate
        c = Coalescer(down, window_s=0.0, max_items=100, max_in_flight=1)
        first = asyncio.ensure_future(c.submit(0))
        await asyncio.sleep(0)  # the window (0) passes: group [0] leaves
        await asyncio.sleep(0)
        rest = [asyncio.ensure_future(c.submit(i)) for i in range(1, 8)]
        for _ in range(3):
            await asyncio.sleep(0)
        assert (
            calls == [[0]] and c.in_flight == 1
        )  # the others wait for the slot, growing one group
        gate.set()
        assert await first == 0
        assert await asyncio.gather(*rest) == list(range(1, 8))
        assert calls == [[0], list(range(1, 8))]
        assert list(c.group_sizes) == [1, 7]

    run(main())


def test_coalescer_dispatches_at_once_when_idle_and_windows_under_load():
    async def main():
        down = GatedDownstream()
        calls, gate = down.calls, down.gate
        loop = asyncio.get_running_loop()
        c = Coalescer(down, window_s=5.0, max_items=100, dispatch_when_idle=True)
        t0 = loop.time()
        first = asyncio.ensure_future(c.submit(0))
        for _ in range(5):
            await asyncio.sleep(0)
        assert calls == [[0]]  # nothing was out: no 5 s window
        later = [asyncio.ensure_future(c.submit(i)) for i in (1, 2)]
        for _ in range(5):
            await asyncio.sleep(0)
        assert calls == [[0]]  # a group is out: the next one waits for its window
        c._flush()  # (the window running out, without waiting 5 s)
        for _ in range(5):
            await asyncio.sleep(0)
        assert calls == [[0], [1, 2]]
        gate.set()
        assert await first == 0 and await asyncio.gather(*later) == [1, 2]
        assert c.in_flight == 0
        nxt = asyncio.ensure_future(c.submit(3))
        for _ in range(5):
            await asyncio.sleep(0)
        assert calls == [[0], [1, 2]]  # a group left within the window: still under load
        c._flush()
        assert await nxt == 3
        # on the virtual clock time moves only when the loop waits for a timer: none of the
        # groups waited for its 5 s window (each left at once or by the _flush calls)
        assert loop.time() == t0

    virtual_time.run(main())


def test_the_replicas_only_request_leaves_at_once_however_soon_after_the_last_group():
    """One client sending request after request: each is the only one the replica holds
    (``held``), so it never waits the window the last group left within; with another
    request held (under load), it does."""

    async def main():
        down = GatedDownstream()
        down.gate.set()
        loop = asyncio.get_running_loop()
        held = [1]
        c = Coalescer(
            down, window_s=5.0, max_items=100, dispatch_when_idle=True, held=lambda: held[0]
        )
        t0 = loop.time()
        for i in range(3):  # back to back: each within the window of the one before
            assert await c.submit(i) == i
        assert down.calls == [[0], [1], [2]] and loop.time() == t0  # no window waited
        held[0] = 2  # another request in the replica's handlers: it may join the group
        nxt = asyncio.ensure_future(c.submit(3))
        for _ in range(5):
            await asyncio.sleep(0)
        assert down.calls == [[0], [1], [2]]  # waits for its window, as under load
        frame = asyncio.ensure_future(c.submit_frame(9))
        held[0] = 1
        await asyncio.sleep(0)
        assert await nxt == 3 and await frame == 9
        assert down.calls[-1] == [9, 3]  # (the window's group; a stream's frame first)

    virtual_time.run(main())


def test_one_request_of_many_items_is_admitted_as_a_unit():
    """A v2 request of 1,024 images on a warm coalescer, nothing else queued: its own images
    are not queue ahead of one another (they were: the last 192 were refused or dropped,
    failing the request with 503 after 832 images' work), and once it has started none of
    its images is dropped at dispatch. A request arriving behind it waits for all of them."""
    from pipeline.errors import QueueFull

    async def main():
        lock = asyncio.Lock()

        async def serial(items):  # one device: groups run one after another, 3,200 items/s
            async with lock:
                await asyncio.sleep(0.02 * len(items) / 64)
            return items

        c = Coalescer(serial, window_s=0.0, max_items=64, max_in_flight=4, budget_s=0.2)
        await asyncio.gather(*(c.submit(i) for i in range(600)))  # the meter is measured
        assert c.meter.wait_s(1024) > 0.2  # the request's own images take longer than that
        futs = c.submit_many(list(range(1024)), "big")
        with pytest.raises(QueueFull) as e:
            await c.submit("behind", "late")
        assert e.value.fields["reason"] == "queue_budget" and e.value.fields["queue_ahead"] > 500
        assert await asyncio.gather(*futs) == list(range(1024))

    virtual_time.run(main())  # the budget and the device's pace on the loop's clock
