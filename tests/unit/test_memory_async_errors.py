"""The pool, reservations, the pinned ring, AsyncResult and the errors -- on the CPU backend."""

from __future__ import annotations

import asyncio
import pickle
import threading

import numpy as np
import pytest

from pipeline.async_result import AsyncResult, CompletionWatcher
from pipeline.device import COMPLETE, Backend, select_backend
from pipeline.errors import (
    DeadlineExceeded,
    DeviceError,
    FerryError,
    InvalidInput,
    ModelNotFound,
    QueueFull,
    ResourceExhausted,
    TransportError,
)
from pipeline.memory.pinned import PinnedRing
from pipeline.memory.pool import HostArena, make_pool
from tests.threads import all_at_once

CPU = Backend("numpy")


# ----------------------------------------------------------------------------- pool


def test_reservation_returned_by_context_manager_on_success_and_failure():
    pool = HostArena(CPU, 1 << 20)
    with pool.reserve(1000) as r:
        assert pool.stats().bytes_in_use == 1024  # rounded to 512
        assert r.buffer.nbytes == 1024
    assert pool.stats().bytes_in_use == 0
    with pytest.raises(ZeroDivisionError), pool.reserve(4096):
        assert pool.bytes_in_use == 4096
        _ = 1 / 0
    assert pool.bytes_in_use == 0


def test_reservation_returned_on_cancellation():
    pool = HostArena(CPU, 1 << 20)
    entered = asyncio.Event()

    async def holder():
        with pool.reserve(2048):
            entered.set()
            await asyncio.Event().wait()  # forever, until cancelled

    async def main():
        t = asyncio.ensure_future(holder())
        await entered.wait()
        assert pool.bytes_in_use == 2048
        t.cancel()
        with pytest.raises(asyncio.CancelledError):
            await t

    asyncio.run(main())
    assert pool.bytes_in_use == 0


def test_release_is_idempotent_and_buffer_unusable_after():
    pool = HostArena(CPU, 1 << 20)
    r = pool.reserve(512)
    assert r.release() is True
    assert r.release() is False
    assert pool.bytes_in_use == 0
    with pytest.raises(RuntimeError):
        _ = r.buffer


def test_limit_refuses_instead_of_growing():
    pool = HostArena(CPU, 10_000)
    a = pool.reserve(6000)
    with pytest.raises(ResourceExhausted) as info:
        pool.reserve(6000)
    err = info.value
    assert err.fields["limit_bytes"] == 10_000
    assert err.fields["requested_bytes"] == 6144
    assert err.fields["in_use_bytes"] == 6144
    s = pool.stats()
    assert s.refused == 1 and s.bytes_in_use == 6144
    a.release()
    pool.reserve(6000).release()  # fits again


def test_stats_high_water_hits_and_driver_allocations():
    pool = HostArena(CPU, 1 << 20)
    for _ in range(5):
        with pool.reserve(4096):
            pass
    a, b = pool.reserve(4096), pool.reserve(4096)
    s = pool.stats()
    assert s.driver_allocs == 2  # the second concurrent block is new; the rest were reused
    assert s.reservations == 7 and s.hits == 5
    assert s.high_water_bytes == 8192
    assert 0 < s.hit_ratio < 1
    a.release()
    b.release()
    assert pool.stats().bytes_held == 8192
    pool.trim()
    assert pool.stats().bytes_held == 0


def test_many_threads_reserving_at_once_leave_nothing_in_use():
    pool = HostArena(CPU, 64 << 20)

    def work(_k):
        for _ in range(200):
            with pool.reserve(12 << 10) as r:
                r.buffer[:8] = 1

    all_at_once(50, work)
    s = pool.stats()
    assert s.bytes_in_use == 0 and s.reservations == 50 * 200
    assert s.driver_allocs <= 50  # at most one block per concurrent holder


def test_make_pool_fraction_and_bounds():
    pool = make_pool(CPU, limit_fraction=0.01)
    assert pool.limit_bytes > 0
    with pytest.raises(ValueError):
        make_pool(CPU, limit_fraction=1.5)
    with pytest.raises(ValueError):
        HostArena(CPU, 0)


def test_select_backend_numpy_and_refusal():
    assert select_backend("numpy").name == "numpy"
    with pytest.raises(ValueError):
        select_backend("tpu")  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- pinned ring


def test_pinned_ring_hands_out_slots_and_times_out():
    ring = PinnedRing(CPU, 1000, 2)
    a, b = ring.acquire(0.1), ring.acquire(0.1)
    assert a.index != b.index and ring.available() == 0
    with pytest.raises(ResourceExhausted):
        ring.acquire(timeout=0.01)
    v = a.view(0, (10, 10), np.float32)
    v[:] = 3
    assert a.host[:4].view(np.float32)[0] == 3
    with pytest.raises(ValueError):
        a.view(4000, (100,), np.float32)
    a.release()
    with pytest.raises(RuntimeError):
        a.release()
    assert ring.acquire(0.1) is a


def test_pinned_ring_wakes_a_waiter_when_a_slot_comes_back():
    ring = PinnedRing(CPU, 64, 1)
    held = ring.acquire()
    got = []
    waiting = threading.Event()

    def waiter():
        waiting.set()
        got.append(ring.acquire(timeout=10))

    t = threading.Thread(target=waiter)
    t.start()
    waiting.wait()
    held.release()
    t.join(10)
    assert got == [held]


# ----------------------------------------------------------------------------- AsyncResult


def test_async_result_wait_and_wait_for():
    r: AsyncResult[int] = AsyncResult("x")
    assert not r.wait_for(0.01)
    with pytest.raises(TimeoutError):
        r.wait(0.01)
    threading.Timer(0.01, r.set_result, args=(7,)).start()
    assert r.wait(5) == 7
    assert r.set_result(8) is False  # the first completion wins
    assert r.result() == 7


def test_async_result_carries_the_exception():
    r = AsyncResult.failed(DeviceError("boom", code=3))
    assert r.done()
    with pytest.raises(DeviceError) as info:
        r.wait()
    assert info.value.fields == {"code": 3}
    assert isinstance(r.exception(), DeviceError)


def test_done_callback_runs_at_once_when_already_complete():
    seen = []
    r = AsyncResult.completed(1)
    r.add_done_callback(lambda res: seen.append(("now", res.result())))
    assert seen == [("now", 1)]
    p: AsyncResult[int] = AsyncResult()
    p.add_done_callback(lambda res: seen.append(("later", res.result())))
    assert len(seen) == 1
    p.set_result(2)
    assert seen[-1] == ("later", 2)


def test_a_raising_callback_does_not_break_the_others():
    seen = []
    r: AsyncResult[int] = AsyncResult()
    r.add_done_callback(lambda _r: 1 / 0)
    r.add_done_callback(lambda res: seen.append(res.result()))
    r.set_result(5)
    assert seen == [5]


def test_many_threads_wait_on_one_result():
    r: AsyncResult[str] = AsyncResult()
    got: list[str] = []
    lock = threading.Lock()
    ready = threading.Barrier(33)

    def waiter():
        ready.wait()
        v = r.wait(10)
        with lock:
            got.append(v)

    threads = [threading.Thread(target=waiter) for _ in range(32)]
    for t in threads:
        t.start()
    ready.wait()
    r.set_result("ok")
    for t in threads:
        t.join(10)
    assert got == ["ok"] * 32


def test_await_from_asyncio_completed_by_another_thread():
    async def main():
        r: AsyncResult[int] = AsyncResult()
        threading.Thread(target=r.set_result, args=(42,)).start()
        assert await r == 42
        f: AsyncResult[int] = AsyncResult()
        threading.Thread(target=f.set_exception, args=(QueueFull("full"),)).start()
        with pytest.raises(QueueFull):
            await f
        assert await AsyncResult.completed(3) == 3

    asyncio.run(main())


def test_completion_watcher_finishes_inline_for_complete_events():
    w = CompletionWatcher()
    r: AsyncResult[int] = AsyncResult()
    w.watch(COMPLETE, lambda: 9, r)
    assert r.done() and r.result() == 9
    bad: AsyncResult[int] = AsyncResult()
    seen = []
    w.watch(COMPLETE, lambda: 1 / 0, bad, on_error=seen.append)
    assert isinstance(bad.exception(), DeviceError) and len(seen) == 1
    w.close()


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "err",
    [
        FerryError("root"),
        InvalidInput("bad shape", shape=(1, 2), expected=(3, 4)),
        ResourceExhausted("full", requested_bytes=10, limit_bytes=5),
        QueueFull("queue", depth=10, retry_after_s=1.0),
        DeadlineExceeded("late", waited_ms=12.5),
        DeviceError("cuda"),
        TransportError("peer died", peer="b", seq=7),
    ],
)
def test_errors_survive_pickling(err):
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is type(err)
    assert back == err and back.fields == err.fields and str(back) == str(err)
    assert isinstance(back, FerryError)


def test_typed_fields_are_attributes_and_survive_pickling():
    """What code reads of an error is a typed attribute, the same after a process hop (Ray
    pickles exceptions), and still in ``fields`` for the answer's detail."""
    errs = [
        QueueFull("queue", retry_after_s=2.5, depth=10),
        ResourceExhausted("full", requested_bytes=10, limit_bytes=5),
        ModelNotFound("no such model", model="m", served=["a", "b"]),
        DeadlineExceeded("late", request_id="r-1", waited_ms=3.0),
    ]
    for err in errs:
        back = pickle.loads(pickle.dumps(err))
        assert back == err and type(back) is type(err)
    q, r, m, d = (pickle.loads(pickle.dumps(e)) for e in errs)
    assert q.retry_after_s == 2.5 and q.fields["depth"] == 10
    assert (r.requested_bytes, r.limit_bytes) == (10, 5)
    assert (m.model, m.served) == ("m", ["a", "b"])
    assert d.request_id == "r-1" and d.fields == {"request_id": "r-1", "waited_ms": 3.0}
    assert QueueFull("q").retry_after_s == 1.0  # the default, in the detail too
    assert ResourceExhausted("x").requested_bytes is None and "requested_bytes" not in (
        ResourceExhausted("x").fields
    )
    with pytest.raises(TypeError):
        ModelNotFound("no such model")  # the model is not optional


def test_error_status_codes():
    assert InvalidInput.http_status == 400
    assert QueueFull.http_status == 503
    assert DeadlineExceeded.http_status == 504
    assert "shape=(1, 2)" in str(InvalidInput("bad", shape=(1, 2)))
