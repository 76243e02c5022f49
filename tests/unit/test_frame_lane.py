"""The GPU queue's frame lane on a fake clock: frames of live streams carry deadlines, and a
batch of them waits as long as its bucket takes to run (measured), no later than the latest
start that meets its earliest deadline, ahead of per-request traffic."""

from __future__ import annotations

import asyncio

import pytest

from pipeline.batch_scheduler import BatchScheduler
from pipeline.batching import BatchQueue, BucketTimes


def _queue(**kw) -> BatchQueue:
    args = {"max_batch_size": 8, "max_wait_s": 0.002, "max_queue": 100, "buckets": (1, 2, 4, 8)}
    return BatchQueue(**{**args, **kw})


def test_bucket_times_average_and_estimate_an_unmeasured_bucket_from_above():
    t = BucketTimes(alpha=0.5)
    assert t.estimate("m", 4) is None
    t.observe("m", 8, 0.010)
    assert t.estimate("m", 4) == 0.010  # a smaller batch takes no longer than a measured larger
    assert t.estimate("m", 16) is None  # nothing measured above
    t.observe("m", 4, 0.004)
    t.observe("m", 4, 0.006)
    assert t.estimate("m", 4) == pytest.approx(0.005)
    assert t.estimate("other", 4) is None


def test_frames_keep_the_fixed_wait_until_their_bucket_is_measured(clock):
    q = _queue()
    q.push("f0", "m", clock(), deadline=clock() + 0.100, frame=True)
    assert q.next_wakeup() == pytest.approx(clock() + 0.002)  # (the deadline is later)
    clock.advance(0.002)
    (b,) = q.pop_ready(clock())
    assert b.reason == "timeout" and [p.item for p in b.items] == ["f0"]


def test_a_batch_of_frames_waits_as_long_as_its_bucket_takes_to_run(clock):
    """Not the fixed 2 ms: the measured 10 ms of the bucket the batch would run in."""
    q = _queue()
    q.times.observe("m", 2, 0.010)
    t0 = clock()
    q.push("f0", "m", t0, deadline=t0 + 1.0, frame=True)
    clock.advance(0.005)
    q.push("f1", "m", clock(), deadline=clock() + 1.0, frame=True)
    assert q.next_wakeup() == pytest.approx(t0 + 0.010)
    clock.advance(0.004)  # 9 ms: past the fixed wait, within the bucket's time
    assert q.pop_ready(clock()) == []
    clock.advance(0.001)
    (b,) = q.pop_ready(clock())
    assert b.reason == "timeout" and [p.item for p in b.items] == ["f0", "f1"]
    assert b.bucket == 2


def test_a_batch_of_frames_leaves_sooner_where_its_earliest_deadline_needs(clock):
    """At the earliest deadline less twice its bucket's measured time."""
    q = _queue()
    q.times.observe("m", 2, 0.010)
    t0 = clock()
    q.push("f0", "m", t0, deadline=t0 + 0.100, frame=True)
    clock.advance(0.001)
    q.push("f1", "m", clock(), deadline=t0 + 0.025, frame=True)  # the earliest
    due = t0 + 0.025 - 2 * 0.010
    assert q.next_wakeup() == pytest.approx(due)
    clock.advance(due - clock() - 0.001)
    assert q.pop_ready(clock()) == []
    clock.advance(0.001)
    (b,) = q.pop_ready(clock())
    assert b.reason == "deadline" and [p.item for p in b.items] == ["f0", "f1"]


def test_a_larger_batch_waits_its_bucket_longer_time_but_no_later_than_its_deadline(clock):
    q = _queue()
    q.times.observe("m", 1, 0.001)
    q.times.observe("m", 4, 0.020)
    q.push("f0", "m", clock(), deadline=clock() + 0.050, frame=True)
    assert q.next_wakeup() == pytest.approx(clock() + 0.001)  # a batch of 1 runs in 1 ms
    for i in range(2):
        q.push(f"f{i + 1}", "m", clock(), deadline=clock() + 0.050, frame=True)
    # 3 frames run in bucket 4 (20 ms): 20 ms of wait, but the deadline needs it at 10 ms
    assert q.next_wakeup() == pytest.approx(clock() + 0.050 - 0.040)


def test_frames_leave_full_at_once_and_before_normal_items_priority_first(clock):
    q = _queue(max_batch_size=4)
    q.push("r0", "m", clock())  # a request that came first
    q.push("p0", "m", clock(), priority=True)
    for i in range(2):
        q.push(f"f{i}", "m", clock(), deadline=clock() + 1.0, frame=True)
    q.push("r1", "m", clock())
    (b,) = q.pop_ready(clock())  # (the priority lane leaves at once, filled up)
    assert [p.item for p in b.items] == ["p0", "f0", "f1", "r0"] and b.reason == "priority"
    for i in range(4):
        q.push(f"g{i}", "m", clock(), deadline=clock() + 1.0, frame=True)
    (b,) = q.pop_ready(clock())
    assert [p.item for p in b.items] == ["g0", "g1", "g2", "g3"] and b.reason == "full"
    assert q.depth("m") == 1  # r1 waits its own fixed window


def test_idle_frames_leave_at_once(clock):
    q = _queue()
    q.times.observe("m", 1, 0.010)
    q.push("f0", "m", clock(), deadline=clock() + 1.0, frame=True)
    assert q.pop_ready(clock()) == []
    (b,) = q.pop_ready(clock(), idle=True)
    assert b.reason == "idle" and len(b) == 1


async def test_the_scheduler_measures_each_bucket_and_forgets_withdrawn_items(clock):
    """The driver feeds the bucket times from each batch's run; an item whose future was
    cancelled (its stream went) is forgotten at the next poll, not run and not failed."""
    started = asyncio.Event()
    release = asyncio.Event()
    seen: list[list[str]] = []

    async def run(batch):
        seen.append([p.item for p in batch.items])
        started.set()
        await release.wait()
        clock.advance(0.030)
        return [p.item for p in batch.items]

    drops = []
    s = BatchScheduler(
        run, 4, 2.0, 100, buckets=(1, 2, 4), max_in_flight=1, clock=clock, dispatch_when_idle=True
    )
    s.on_drop = lambda p, e: drops.append(p.item)
    first = s.submit_nowait("a", "m", deadline=clock() + 10, frame=True)
    await started.wait()  # "a" runs alone (idle)
    gone = s.submit_nowait("b", "m", deadline=clock() + 10, frame=True)
    kept = s.submit_nowait("c", "m", deadline=clock() + 10, frame=True)
    gone.cancel()
    release.set()
    assert await first == "a"
    assert await kept == "c"
    assert seen == [["a"], ["c"]] and drops == [] and len(s.queue) == 0
    assert s.queue.times.estimate("m", 1) == pytest.approx(0.030)
    await s.close()
