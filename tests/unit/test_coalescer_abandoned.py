"""Coalescer: requests whose callers gave up (a deadline, a client gone) hold nothing -- not
a downstream slot, not a place in the queue budget's count (a node lost under a call)."""

from __future__ import annotations

import asyncio

from pipeline.coalescer import Coalescer
from pipeline.errors import QueueFull
from tests.unit import virtual_time


class Hung:
    """A downstream that never answers (its replica's node is gone) until cancelled."""

    def __init__(self) -> None:
        self.calls, self.cancelled = 0, 0

    async def __call__(self, items):
        self.calls += 1
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise


async def _give_up(aw, after_s: float):
    try:
        async with asyncio.timeout(after_s):
            return await aw
    except TimeoutError:
        return "gave up"


def test_a_group_all_of_whose_callers_gave_up_is_cancelled_and_its_slot_comes_back():
    down = Hung()

    async def main():
        c = Coalescer(down, window_s=0.0, max_items=4, max_in_flight=1)
        got = await asyncio.gather(*(_give_up(c.submit(i), 1.0) for i in range(3)))
        await asyncio.sleep(0)  # the cancel's callbacks run
        await asyncio.sleep(0)
        return got, c.in_flight

    got, in_flight = virtual_time.run(main())
    assert got == ["gave up"] * 3
    assert down.calls == 1 and down.cancelled == 1 and in_flight == 0


def test_a_group_with_a_caller_still_waiting_is_not_cancelled():
    down = Hung()

    async def main():
        c = Coalescer(down, window_s=0.0, max_items=4, max_in_flight=1)
        patient = asyncio.ensure_future(c.submit("patient"))
        first = await _give_up(c.submit("hasty"), 1.0)
        await asyncio.sleep(5)
        state = (first, down.cancelled, c.in_flight, patient.done())
        patient.cancel()  # now every caller is gone: the call is cancelled
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        return state, down.cancelled, c.in_flight

    (first, cancelled_before, in_flight_before, patient_done), cancelled, in_flight = (
        virtual_time.run(main())
    )
    assert first == "gave up" and cancelled_before == 0 and in_flight_before == 1
    assert not patient_done and cancelled == 1 and in_flight == 0


def test_answered_groups_are_never_cancelled():
    calls = []

    async def echo(items):
        calls.append(list(items))
        return [i * 2 for i in items]

    async def main():
        c = Coalescer(echo, window_s=0.01, max_items=8, max_in_flight=2)
        got = await asyncio.gather(*(c.submit(i) for i in range(20)))
        await asyncio.sleep(0.1)
        return got, c.in_flight

    got, in_flight = virtual_time.run(main())
    assert got == [2 * i for i in range(20)] and in_flight == 0
    assert sum(len(g) for g in calls) == 20


def test_requests_given_up_in_the_queue_do_not_count_against_the_budget():
    """With the only slot held, requests queue; once they are given up, a new request is
    judged by the live queue (empty), not by the age of a head nobody waits for."""
    down = Hung()

    async def main():
        c = Coalescer(down, window_s=0.0, max_items=1, max_in_flight=1, budget_s=0.5)
        holder = asyncio.ensure_future(c.submit("holds the slot"))
        await asyncio.sleep(0)
        queued = await asyncio.gather(*(_give_up(c.submit(i), 0.2) for i in range(3)))
        await asyncio.sleep(2.0)  # the given-up entries would be 2 s old: past the budget
        try:
            c.check("new")
            verdict = "admitted"
        except QueueFull:
            verdict = "refused"
        holder.cancel()
        await asyncio.sleep(0)
        return queued, verdict

    queued, verdict = virtual_time.run(main())
    assert queued == ["gave up"] * 3 and verdict == "admitted"
