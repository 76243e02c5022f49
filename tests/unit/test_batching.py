"""BatchQueue and BatchScheduler with a fake clock: no sleeps, every decision deterministic."""

from __future__ import annotations

import asyncio

import pytest

from pipeline.batch_scheduler import BatchScheduler
from pipeline.batching import BatchQueue
from pipeline.errors import DeadlineExceeded, QueueFull


def test_batch_leaves_when_full(clock):
    q = BatchQueue(max_batch_size=4, max_wait_s=0.010, max_queue=100, buckets=(1, 2, 4, 8))
    for i in range(3):
        q.push(i, "m", clock())
    assert q.pop_ready(clock()) == []
    q.push(3, "m", clock())
    (b,) = q.pop_ready(clock())
    assert [p.item for p in b.items] == [0, 1, 2, 3] and b.reason == "full" and b.bucket == 4
    assert len(q) == 0


def test_each_key_fills_to_its_own_size(clock):
    """A model's batches leave full at its own max_batch (``sizes``), not the largest's."""
    q = BatchQueue(max_batch_size=8, max_wait_s=1.0, max_queue=100, sizes={"small": 2})
    for i in range(3):
        q.push(i, "small", clock())
        q.push(i, "big", clock())
    (b,) = q.pop_ready(clock())
    assert b.key == "small" and [p.item for p in b.items] == [0, 1] and b.reason == "full"
    assert q.depth("big") == 3 and q.depth("small") == 1  # big waits for 8 (or the timeout)


def test_batch_leaves_when_the_oldest_waited_long_enough(clock):
    q = BatchQueue(max_batch_size=8, max_wait_s=0.010, max_queue=100, buckets=(1, 2, 4, 8))
    q.push("a", "m", clock())
    clock.advance(0.004)
    q.push("b", "m", clock())
    q.push("c", "m", clock())
    assert q.next_wakeup() == pytest.approx(1000.010)
    clock.advance(0.005)
    assert q.pop_ready(clock()) == []  # oldest waited 9 ms
    clock.advance(0.001)
    (b,) = q.pop_ready(clock())
    assert b.reason == "timeout" and len(b) == 3 and b.bucket == 4  # padded up to a bucket


def test_full_batches_then_a_remainder(clock):
    q = BatchQueue(max_batch_size=4, max_wait_s=0.010, max_queue=100)
    for i in range(10):
        q.push(i, "m", clock())
    batches = q.pop_ready(clock())
    assert [len(b) for b in batches] == [4, 4]
    clock.advance(0.010)
    (rest,) = q.pop_ready(clock())
    assert [p.item for p in rest.items] == [8, 9]


def test_priority_lane_skips_the_wait_and_goes_first(clock):
    q = BatchQueue(max_batch_size=4, max_wait_s=1.0, max_queue=100)
    for i in range(2):
        q.push(f"n{i}", "m", clock())
    q.push("p", "m", clock(), priority=True)
    (b,) = q.pop_ready(clock())
    assert b.reason == "priority"
    assert [p.item for p in b.items] == ["p", "n0", "n1"]  # filled up with waiting items


def test_batches_never_mix_models(clock):
    q = BatchQueue(max_batch_size=2, max_wait_s=0.0, max_queue=100)
    q.push(1, "a", clock())
    q.push(2, "b", clock())
    q.push(3, "a", clock())
    batches = q.pop_ready(clock())
    assert sorted((b.key, [p.item for p in b.items]) for b in batches) == [
        ("a", [1, 3]),
        ("b", [2]),
    ]


def test_bounded_queue_answers_queue_full_at_once(clock):
    q = BatchQueue(max_batch_size=4, max_wait_s=1.0, max_queue=3, retry_after_s=2.5)
    for i in range(3):
        q.push(i, "m", clock())
    with pytest.raises(QueueFull) as info:
        q.push(3, "m", clock())
    assert info.value.fields["retry_after_s"] == 2.5 and info.value.fields["queue_depth"] == 3


def test_expired_items_are_dropped_before_batching(clock):
    q = BatchQueue(max_batch_size=4, max_wait_s=0.010, max_queue=100)
    q.push("late", "m", clock(), deadline=clock() + 0.002)
    q.push("fine", "m", clock(), deadline=clock() + 1.0)
    q.push("none", "m", clock())
    assert q.next_wakeup() == pytest.approx(1000.002)
    clock.advance(0.003)
    dead = q.expire(clock())
    assert [p.item for p in dead] == ["late"] and len(q) == 2
    clock.advance(0.010)
    (b,) = q.pop_ready(clock())
    assert [p.item for p in b.items] == ["fine", "none"]


def test_limit_caps_the_batches_formed(clock):
    q = BatchQueue(max_batch_size=1, max_wait_s=0.0, max_queue=100)
    for i in range(5):
        q.push(i, "m", clock())
    assert len(q.pop_ready(clock(), limit=2)) == 2 and len(q) == 3


# ----------------------------------------------------------------------------- the asyncio driver


def run(coro):
    return asyncio.run(coro)


def test_scheduler_forms_batches_and_routes_results(clock):
    seen = []

    async def run_batch(batch):
        seen.append([p.item for p in batch.items])
        return [p.item * 10 for p in batch.items]

    async def main():
        s = BatchScheduler(run_batch, max_batch_size=3, max_wait_ms=5, max_queue=100, clock=clock)
        futs = [s.submit_nowait(i, "m") for i in range(4)]
        s.poll()  # one full batch of 3; the 4th waits for its timer
        await asyncio.gather(*futs[:3])
        assert not futs[3].done()
        clock.advance(0.005)
        s.poll()
        assert await futs[3] == 30
        assert [f.result() for f in futs] == [0, 10, 20, 30]
        await s.close()

    run(main())
    assert seen == [[0, 1, 2], [3]]


def test_scheduler_holds_batches_back_while_the_runner_is_full(clock):
    release = None

    async def run_batch(batch):
        await release.wait()
        return [None] * len(batch)

    async def main():
        nonlocal release
        release = asyncio.Event()
        sizes = []
        s = BatchScheduler(
            run_batch,
            max_batch_size=8,
            max_wait_ms=1,
            max_queue=100,
            max_in_flight=1,
            clock=clock,
            on_batch=lambda b: sizes.append(len(b)),
        )
        first = s.submit_nowait("x", "m")
        clock.advance(0.001)
        s.poll()  # the single slot is taken by a batch of one
        rest = [s.submit_nowait(i, "m") for i in range(5)]
        clock.advance(0.010)
        s.poll()
        assert sizes == [1]  # no room: the others keep waiting (and the batch keeps growing)
        release.set()
        await first
        s.poll()
        await asyncio.gather(*rest)
        assert sizes == [1, 5]
        await s.close()

    run(main())


def test_scheduler_fails_expired_items_with_deadline_exceeded(clock):
    ran = []

    async def run_batch(batch):
        ran.extend(p.item for p in batch.items)
        return [1] * len(batch)

    async def main():
        drops = []
        s = BatchScheduler(
            run_batch,
            max_batch_size=8,
            max_wait_ms=10,
            max_queue=100,
            clock=clock,
            on_drop=lambda p, e: drops.append(p.item),
        )
        late = s.submit_nowait("late", "m", deadline=clock() + 0.001)
        ok = s.submit_nowait("ok", "m")
        clock.advance(0.002)
        s.poll()
        with pytest.raises(DeadlineExceeded):
            await late
        clock.advance(0.010)
        s.poll()
        assert await ok == 1
        assert drops == ["late"]
        await s.close()

    run(main())
    assert ran == ["ok"]  # the expired item never reached the runner


def test_a_failing_batch_fails_each_of_its_items(clock):
    async def run_batch(batch):
        raise RuntimeError("device lost")

    async def main():
        s = BatchScheduler(run_batch, max_batch_size=2, max_wait_ms=0, max_queue=10, clock=clock)
        futs = [s.submit_nowait(i, "m") for i in range(2)]
        s.poll()
        for f in futs:
            with pytest.raises(RuntimeError, match="device lost"):
                await f
        await s.close()

    run(main())


def test_per_item_errors_reach_only_their_item(clock):
    async def run_batch(batch):
        return [ValueError("bad") if p.item == "bad" else p.item for p in batch.items]

    async def main():
        s = BatchScheduler(run_batch, max_batch_size=2, max_wait_ms=0, max_queue=10, clock=clock)
        good, bad = s.submit_nowait("good", "m"), s.submit_nowait("bad", "m")
        s.poll()
        assert await good == "good"
        with pytest.raises(ValueError):
            await bad
        await s.close()

    run(main())


def test_submit_raises_queue_full_at_once(clock):
    async def run_batch(batch):  # pragma: no cover - never reached
        return []

    async def main():
        s = BatchScheduler(run_batch, max_batch_size=8, max_wait_ms=100, max_queue=2, clock=clock)
        s.submit_nowait(1, "m")
        s.submit_nowait(2, "m")
        with pytest.raises(QueueFull):
            s.submit_nowait(3, "m")
        s._closed = True  # nothing to run; just stop the loop
        s._loop_task.cancel()

    run(main())


def test_an_idle_runner_takes_the_queue_at_once(clock):
    sizes = []
    release = None

    async def run_batch(batch):
        sizes.append((len(batch), batch.reason))
        await release.wait()
        return [None] * len(batch)

    async def main():
        nonlocal release
        release = asyncio.Event()
        s = BatchScheduler(
            run_batch,
            max_batch_size=8,
            max_wait_ms=50,
            max_queue=100,
            max_in_flight=2,
            clock=clock,
            dispatch_when_idle=True,
        )
        a = s.submit_nowait("a", "m")
        s.poll()  # nothing running: no 50 ms wait
        await asyncio.sleep(0)
        b = [s.submit_nowait(i, "m") for i in range(3)]
        s.poll()  # one batch is running now: the normal rule applies again
        await asyncio.sleep(0)
        assert sizes == [(1, "idle")]
        clock.advance(0.050)
        s.poll()
        await asyncio.sleep(0)
        assert sizes == [(1, "idle"), (3, "timeout")]
        release.set()
        await asyncio.gather(a, *b)
        await s.close()

    run(main())
