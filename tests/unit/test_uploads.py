"""UploadGate: a stalled body is a 408, uploads past the bound are refused at once, and a
body that arrives is read whole -- with a real asyncio receive channel. The tests that wait
run on a virtual clock (``virtual_time``): each grace, idle timeout and deadline is read
exactly from ``loop.time()``, however loaded the machine is."""

from __future__ import annotations

import asyncio

import pytest
from starlette.requests import Request

from deployments.uploads import UploadGate
from pipeline.errors import ClientClosedRequest, PayloadTooLarge, RequestTimeout, UploadsFull
from tests.unit import virtual_time


def _request(q: asyncio.Queue, length: int | None = None) -> Request:
    headers = [] if length is None else [(b"content-length", str(length).encode())]
    return Request({"type": "http", "method": "POST", "path": "/", "headers": headers}, q.get)


async def test_a_body_that_arrives_in_chunks_is_read_whole():
    q: asyncio.Queue = asyncio.Queue()
    for part, more in ((b"ab", True), (b"", True), (b"cd", False)):
        q.put_nowait({"type": "http.request", "body": part, "more_body": more})
    gate = UploadGate(2, idle_s=1.0, total_s=5.0)
    assert await gate.read(_request(q, 4), 100) == b"abcd"
    assert gate.active == 0


def test_a_stalled_body_is_a_408_after_the_idle_timeout():
    async def main():
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()
        q.put_nowait({"type": "http.request", "body": b"0123456789", "more_body": True})
        gate = UploadGate(2, idle_s=0.2, total_s=5.0, grace_s=0.1, clock=loop.time)
        t0 = loop.time()
        with pytest.raises(RequestTimeout) as err:
            await gate.read(_request(q, 1000), 10_000)
        # exactly the grace (the body is not complete: it takes a slot), then idle_s
        assert loop.time() - t0 == pytest.approx(0.1 + 0.2)
        assert err.value.fields["received_bytes"] == 10
        assert err.value.http_status == 408 and err.value.closes_connection
        assert gate.active == 0 and gate.timed_out == 1

    virtual_time.run(main())


def test_a_trickle_is_cut_by_the_total_deadline():
    async def main():
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()

        async def trickle():
            while True:
                await asyncio.sleep(0.05)
                q.put_nowait({"type": "http.request", "body": b"x", "more_body": True})

        task = asyncio.create_task(trickle())
        gate = UploadGate(2, idle_s=0.2, total_s=0.5, grace_s=0.1, clock=loop.time)
        t0 = loop.time()
        with pytest.raises(RequestTimeout):
            await gate.read(_request(q), 10_000)
        # a byte every 0.05 s never idles 0.2 s: what cut it is total_s, counted from the
        # slot it took after the grace
        assert loop.time() - t0 == pytest.approx(0.1 + 0.5)
        task.cancel()

    virtual_time.run(main())


def test_slow_uploads_past_the_bound_are_refused_and_quick_bodies_never_wait():
    async def main():
        loop = asyncio.get_running_loop()
        gate = UploadGate(1, idle_s=0.4, total_s=5.0, grace_s=0.1, clock=loop.time)
        first = asyncio.create_task(gate.read(_request(asyncio.Queue()), 100))
        await asyncio.sleep(0.15)  # past its grace: it holds the one upload slot until 0.5
        assert gate.active == 1
        t0 = loop.time()
        with pytest.raises(UploadsFull) as err:  # another slow one: refused after its grace
            await gate.read(_request(asyncio.Queue()), 100)
        # two graces (not a byte came, no slot free: one more for the first bytes), and
        # not a wait for the slot, which frees 0.35 s after t0
        assert loop.time() - t0 == pytest.approx(2 * 0.1)
        assert err.value.http_status == 503 and err.value.fields["retry_after_s"] == 1.0
        q: asyncio.Queue = asyncio.Queue()
        q.put_nowait({"type": "http.request", "body": b"ok", "more_body": False})
        t1 = loop.time()
        assert await gate.read(_request(q), 100) == b"ok"  # a quick body needs no slot
        assert loop.time() == t1  # and waits for nothing
        with pytest.raises(RequestTimeout):
            await first
        assert gate.active == 0

    virtual_time.run(main())


def test_a_whole_body_whose_first_bytes_come_late_is_read_while_the_slots_are_full():
    """Through Serve's proxy the replica fetches even a body that came with the headers by an
    actor call; under a flood that fetch took over a grace: with no slot free, the first bytes
    get one more grace before the request is refused (a partial body does not)."""

    async def main():
        loop = asyncio.get_running_loop()
        gate = UploadGate(1, idle_s=1.0, total_s=5.0, grace_s=0.1, clock=loop.time)
        holder = asyncio.create_task(gate.read(_request(asyncio.Queue()), 100))
        await asyncio.sleep(0.25)  # past its grace (and the extra one): it holds the only slot
        assert gate.active == 1
        late: asyncio.Queue = asyncio.Queue()
        loop.call_later(0.15, late.put_nowait, {"type": "http.request", "body": b"ok"})
        t0 = loop.time()
        assert await gate.read(_request(late), 100) == b"ok"  # 1.5 graces: read, not refused
        assert loop.time() - t0 == pytest.approx(0.15)  # as soon as the bytes came
        partial: asyncio.Queue = asyncio.Queue()
        partial.put_nowait({"type": "http.request", "body": b"o", "more_body": True})
        loop.call_later(0.15, partial.put_nowait, {"type": "http.request", "body": b"k"})
        t0 = loop.time()
        with pytest.raises(UploadsFull):  # bytes came and the body is slow: refused at its grace
            await gate.read(_request(partial), 100)
        assert loop.time() - t0 == pytest.approx(0.1)  # one grace, not the extra one
        t0 = loop.time()
        with pytest.raises(UploadsFull):  # not a byte in two graces: refused
            await gate.read(_request(asyncio.Queue()), 100)
        assert loop.time() - t0 == pytest.approx(2 * 0.1)
        assert gate.refused == 2
        holder.cancel()

    virtual_time.run(main())


async def test_declared_or_actual_bodies_over_the_limit_are_413():
    gate = UploadGate(2, idle_s=1.0, total_s=5.0)
    with pytest.raises(PayloadTooLarge):
        await gate.read(_request(asyncio.Queue(), 101), 100)
    q: asyncio.Queue = asyncio.Queue()
    q.put_nowait({"type": "http.request", "body": b"x" * 101, "more_body": False})
    with pytest.raises(PayloadTooLarge):
        await gate.read(_request(q), 100)


async def test_a_client_that_goes_away_ends_the_read():
    q: asyncio.Queue = asyncio.Queue()
    q.put_nowait({"type": "http.disconnect"})
    with pytest.raises(RequestTimeout, match="went away") as info:
        await UploadGate(2, 1.0, 5.0).read(_request(q), 100)
    # nginx's 499, not a 408: the client closed, it was not slow (no slow_client rejection)
    assert type(info.value) is ClientClosedRequest and info.value.http_status == 499
