"""The stream route without Ray, on the virtual-time loop: a real ``StreamConnection`` and a
real ``Coalescer`` in front of a downstream the test holds, driven by ASGI messages. What the
integration tests cannot make happen on cue: a frame held up in the coalescer past its
deadline, and a disconnect while a group is out."""

from __future__ import annotations

import asyncio

from deployments.streams_route import StreamHub
from tests.unit import virtual_time
from tests.unit.stream_fakes import Client, Downstream, Ingress, png
from tests.unit.stream_fakes import open_stream as _open


def test_a_frame_held_up_in_the_coalescer_past_its_deadline_is_dropped_late():
    async def main():
        down = Downstream()
        ingress = Ingress(down)
        hub, client = StreamHub(ingress), Client()
        task = _open(hub, client, b"fps=10&deadline_ms=100")
        client.frame(png())  # frame 0 leaves alone; the downstream holds it
        await asyncio.sleep(0.05)
        client.frame(png())  # frame 1 waits: the one group allowed out is out
        await asyncio.sleep(0.12)  # frame 1's deadline passes in the coalescer
        coalescer = ingress._coalescer("digits", "classify")
        assert coalescer.waiting == 0 and coalescer.in_flight == 1
        await asyncio.sleep(1.1)  # frame 0's deadline and grace pass downstream
        down.gate.set()
        client.text({"end": True})
        await task
        return client, coalescer, hub, down

    client, coalescer, hub, down = virtual_time.run(main())
    assert client.messages() == [{"dropped": [0, 1], "reason": "late"}]
    assert client.close()["code"] == 1000
    assert down.groups == [1] and coalescer.in_flight == 0 and coalescer.waiting == 0
    assert not hub.open and not hub.book.open


def test_a_disconnect_while_its_group_is_out_frees_everything():
    async def main():
        down = Downstream()
        ingress = Ingress(down)
        hub, client = StreamHub(ingress), Client()
        task = _open(hub, client, b"fps=10&deadline_ms=5000")
        client.frame(png())
        await asyncio.sleep(0.05)
        client.frame(png())
        await asyncio.sleep(0.05)
        coalescer = ingress._coalescer("digits", "classify")
        assert coalescer.in_flight == 1 and coalescer.waiting == 1 and hub.open
        client.inbox.put_nowait({"type": "websocket.disconnect", "code": 1006})
        await task
        await asyncio.sleep(0)  # the cancelled group's task ends
        return client, coalescer, hub, down

    client, coalescer, hub, down = virtual_time.run(main())
    assert down.cancelled == 1  # the group out, given up by its only stream, was cancelled
    assert coalescer.in_flight == 0 and coalescer.waiting == 0
    assert not hub.open and not hub.book.open and client.close() is None


def test_a_stop_lets_a_stream_answer_what_it_holds_then_closes_it_going_away():
    async def main():
        down = Downstream()
        ingress = Ingress(down)
        hub, client = StreamHub(ingress), Client()
        task = _open(hub, client, b"fps=10&deadline_ms=5000")
        client.frame(png())
        await asyncio.sleep(0.05)
        ingress.drain.draining = True  # deployments.stop raised the flag
        await asyncio.sleep(1.0)  # the stream sees it (it looks every 0.5 s)
        client.frame(png())  # not taken: the stream is ending
        await asyncio.sleep(0.05)
        assert not client.messages() and client.close() is None  # frame 0 is still out
        down.gate.set()
        await task
        return client

    client = virtual_time.run(main())
    assert [m["frame"] for m in client.messages()] == [0]
    assert client.close()["code"] == 1001
