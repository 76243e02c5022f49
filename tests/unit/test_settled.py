"""``batch_scheduler.settled``: a stage's futures awaited as ``gather(return_exceptions=True)``
answers them, waking its caller once where they complete together."""

from __future__ import annotations

import asyncio

import pytest

from pipeline.batch_scheduler import settled
from pipeline.errors import QueueFull


def _futures(loop, n):
    return [loop.create_future() for _ in range(n)]


def _answer(futs):
    """As a batch is answered: every item in one turn of the loop."""
    futs[0].set_result("row0")
    futs[1].set_exception(QueueFull("full"))
    futs[2].cancel()
    futs[3].set_result(None)


@pytest.mark.parametrize("how", ["settled", "gather"])
def test_results_errors_and_cancellations_come_back_in_order_as_gather_gives_them(how):
    async def go():
        loop = asyncio.get_running_loop()
        futs = _futures(loop, 4)
        loop.call_soon(_answer, futs)
        if how == "gather":
            return await asyncio.gather(*futs, return_exceptions=True)
        return await settled(futs)

    got = asyncio.run(go())
    assert got[0] == "row0" and got[3] is None
    assert isinstance(got[1], QueueFull) and isinstance(got[2], asyncio.CancelledError)


@pytest.mark.parametrize("how,before", [("settled", True), ("gather", False)])
def test_futures_answered_together_wake_the_caller_before_the_next_turn(how, before):
    """The caller resumes ahead of a callback scheduled just after the batch was answered:
    one hop. gather's caller resumes after it (its children's callbacks take a turn first):
    the same test is run against gather to show it is the hop that is tested."""
    order: list[str] = []

    async def go():
        loop = asyncio.get_running_loop()
        futs = _futures(loop, 8)

        def answer():
            for i, f in enumerate(futs):
                f.set_result(i)
            loop.call_soon(order.append, "next turn")

        loop.call_soon(answer)
        if how == "gather":
            got = await asyncio.gather(*futs, return_exceptions=True)
        else:
            got = await settled(futs)
        order.append("caller")
        assert got == list(range(8))
        await asyncio.sleep(0)
        await asyncio.sleep(0)

    asyncio.run(go())
    assert (order.index("caller") < order.index("next turn")) is before


def test_cancelling_the_caller_cancels_every_pending_future_but_a_cancelled_future_does_not():
    async def go():
        loop = asyncio.get_running_loop()
        futs = _futures(loop, 3)
        futs[0].set_result(0)
        task = asyncio.ensure_future(settled(futs))
        await asyncio.sleep(0)
        futs[1].cancel()  # one future cancelled (its item withdrawn): the caller waits on
        await asyncio.sleep(0)
        assert not task.done() and not futs[2].done()
        task.cancel()  # the caller cancelled: so is what it still waits for
        with pytest.raises(asyncio.CancelledError):
            await task
        return futs

    futs = asyncio.run(go())
    assert futs[0].result() == 0 and futs[1].cancelled() and futs[2].cancelled()
