"""``coarse_timeout.within``: asyncio.timeout's behaviour -- TimeoutError at the block's time,
another cancellation left alone, nothing left behind -- with one timer for many blocks. On a
virtual clock (``virtual_time``): the expiry is read exactly, however loaded the machine."""

from __future__ import annotations

import asyncio

import pytest

from pipeline import coarse_timeout
from pipeline.coarse_timeout import within
from tests.unit import virtual_time


def test_a_block_past_its_time_raises_timeout_error_at_that_time():
    async def main() -> float:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(TimeoutError), within(0.1):
            await asyncio.sleep(10)
        return loop.time() - t0

    assert virtual_time.run(main()) == pytest.approx(0.1)


def test_a_block_that_ends_in_time_is_untouched_and_leaves_no_timeout_open():
    async def main() -> tuple[int, int, bool]:
        with within(5):
            await asyncio.sleep(0.01)
        with within(0.05):
            pass
        sweeper = coarse_timeout._SWEEPERS[asyncio.get_running_loop()]
        await asyncio.sleep(0.2)  # past the second's time: nothing to cancel, no sweep armed
        return len(sweeper.open), asyncio.current_task().cancelling(), sweeper.handle is None

    assert virtual_time.run(main()) == (0, 0, True)


def test_another_cancellation_inside_the_block_stays_a_cancellation():
    async def inner() -> None:
        with within(5):
            await asyncio.sleep(10)

    async def main() -> None:
        task = asyncio.ensure_future(inner())
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    virtual_time.run(main())


def test_many_blocks_expire_each_on_its_own_and_the_rest_go_on():
    async def one(seconds: float) -> str:
        try:
            with within(seconds):
                await asyncio.sleep(0.15)
            return "done"
        except TimeoutError:
            return "timeout"

    async def main() -> list[str]:
        # the first block's timer is for 1 s: the shorter ones opened after it re-arm it
        return await asyncio.gather(*(one(s) for s in (1.0, 0.05, 1.0, 0.05)))

    assert virtual_time.run(main()) == ["done", "timeout", "done", "timeout"]
