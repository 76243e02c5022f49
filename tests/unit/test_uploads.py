"""UploadGate: a stalled body is a 408, uploads past the bound are refused at once, and a
body that arrives is read whole -- with a real asyncio receive channel, short timeouts."""

from __future__ import annotations

import asyncio

import pytest
from starlette.requests import Request

from deployments.uploads import UploadGate
from pipeline.errors import PayloadTooLarge, RequestTimeout, UploadsFull


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


async def test_a_stalled_body_is_a_408_after_the_idle_timeout():
    q: asyncio.Queue = asyncio.Queue()
    q.put_nowait({"type": "http.request", "body": b"0123456789", "more_body": True})
    gate = UploadGate(2, idle_s=0.2, total_s=5.0, grace_s=0.1)
    t0 = asyncio.get_running_loop().time()
    with pytest.raises(RequestTimeout) as err:
        await gate.read(_request(q, 1000), 10_000)
    took = asyncio.get_running_loop().time() - t0
    assert 0.28 < took < 1.0 and err.value.fields["received_bytes"] == 10
    assert err.value.http_status == 408 and err.value.closes_connection
    assert gate.active == 0 and gate.timed_out == 1


async def test_a_trickle_is_cut_by_the_total_deadline():
    q: asyncio.Queue = asyncio.Queue()

    async def trickle():
        while True:
            await asyncio.sleep(0.05)
            q.put_nowait({"type": "http.request", "body": b"x", "more_body": True})

    task = asyncio.create_task(trickle())
    gate = UploadGate(2, idle_s=0.2, total_s=0.5, grace_s=0.1)
    with pytest.raises(RequestTimeout):
        await gate.read(_request(q), 10_000)
    task.cancel()


async def test_slow_uploads_past_the_bound_are_refused_and_quick_bodies_never_wait():
    gate = UploadGate(1, idle_s=0.4, total_s=5.0, grace_s=0.1)
    first = asyncio.create_task(gate.read(_request(asyncio.Queue()), 100))
    await asyncio.sleep(0.15)  # past its grace: it holds the one upload slot
    assert gate.active == 1
    t0 = asyncio.get_running_loop().time()
    with pytest.raises(UploadsFull) as err:  # another slow one: refused after its grace
        await gate.read(_request(asyncio.Queue()), 100)
    assert asyncio.get_running_loop().time() - t0 < 0.3
    assert err.value.http_status == 503 and err.value.fields["retry_after_s"] == 1.0
    q: asyncio.Queue = asyncio.Queue()
    q.put_nowait({"type": "http.request", "body": b"ok", "more_body": False})
    assert await gate.read(_request(q), 100) == b"ok"  # a quick body needs no slot
    with pytest.raises(RequestTimeout):
        await first
    assert gate.active == 0


async def test_a_whole_body_whose_first_bytes_come_late_is_read_while_the_slots_are_full():
    """Through Serve's proxy the replica fetches even a body that came with the headers by an
    actor call; under a flood that fetch took over a grace: with no slot free, the first bytes
    get one more grace before the request is refused (a partial body does not)."""
    gate = UploadGate(1, idle_s=1.0, total_s=5.0, grace_s=0.1)
    holder = asyncio.create_task(gate.read(_request(asyncio.Queue()), 100))
    await asyncio.sleep(0.25)  # past its grace (and the extra one): it holds the only slot
    assert gate.active == 1
    late: asyncio.Queue = asyncio.Queue()
    loop = asyncio.get_running_loop()
    loop.call_later(0.15, late.put_nowait, {"type": "http.request", "body": b"ok"})
    assert await gate.read(_request(late), 100) == b"ok"  # 1.5 graces: read, not refused
    partial: asyncio.Queue = asyncio.Queue()
    partial.put_nowait({"type": "http.request", "body": b"o", "more_body": True})
    loop.call_later(0.15, partial.put_nowait, {"type": "http.request", "body": b"k"})
    t0 = loop.time()
    with pytest.raises(UploadsFull):  # bytes came and the body is slow: refused at its grace
        await gate.read(_request(partial), 100)
    assert loop.time() - t0 < 0.14
    t0 = loop.time()
    with pytest.raises(UploadsFull):  # not a byte in two graces: refused
        await gate.read(_request(asyncio.Queue()), 100)
    assert 0.19 < loop.time() - t0 < 0.35
    assert gate.refused == 2
    holder.cancel()


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
    with pytest.raises(RequestTimeout, match="went away"):
        await UploadGate(2, 1.0, 5.0).read(_request(q), 100)
