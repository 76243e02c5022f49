"""The stream route without Ray, on the virtual-time loop: a real ``StreamConnection`` and a
real ``Coalescer`` in front of a downstream the test holds, driven by ASGI messages. What the
integration tests cannot make happen on cue: a frame held up in the coalescer past its
deadline, and a disconnect while a group is out."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
from types import SimpleNamespace

import numpy as np
from PIL import Image

from deployments.streams_route import StreamConnection, StreamHub
from pipeline.coalescer import Coalescer
from pipeline.config import PipelineConfig
from pipeline.errors import ModelNotFound
from pipeline.models.repository import model_card
from pipeline.stages.messages import Answer, Timings
from tests.unit import virtual_time


class Downstream:
    """The coalescer's downstream: each group waits for the gate; cancelled ones noted."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.groups: list[int] = []
        self.cancelled = 0

    async def __call__(self, items: list) -> list:
        self.groups.append(len(items))
        try:
            await self.gate.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return [Answer(Timings(), batch_size=len(items), top_k=[]) for _ in items]


class Ingress:
    """What the route reads of an ingress replica."""

    def __init__(self, down: Downstream) -> None:
        self.cfg = PipelineConfig.model_validate({"models": [{"name": "digits", "arch": "digits"}]})
        self.models = {"digits": self.cfg.models[0]}
        self.cards = {"digits": model_card(self.cfg.models[0])}
        self.targets = {"digits": self.cards["digits"].target()}
        self.readiness = SimpleNamespace(check=lambda m: None)
        self.drain = SimpleNamespace(
            draining=False, start=lambda: None, work=lambda rid: contextlib.nullcontext()
        )
        self.down = SimpleNamespace(status=self._status)
        self._coalescers = {("digits", "classify"): Coalescer(down, 0.001, 16, max_in_flight=1)}

    async def _status(self) -> dict:
        return {"queue_depth": 0, "pool": {}}

    def _model(self, name: str) -> str:
        if name not in self.models:
            raise ModelNotFound("no such model", model=name)
        return name

    def _coalescer(self, model: str, kind: str) -> Coalescer:
        return self._coalescers[(model, kind)]


def png() -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.full((16, 16), 255, np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


class Client:
    """The ASGI side of one WebSocket: what the client sends, what the route sent."""

    def __init__(self) -> None:
        self.inbox: asyncio.Queue = asyncio.Queue()
        self.sent: list[dict] = []
        self.inbox.put_nowait({"type": "websocket.connect"})

    async def receive(self) -> dict:
        return await self.inbox.get()

    async def send(self, message: dict) -> None:
        self.sent.append(message)

    def frame(self, data: bytes) -> None:
        self.inbox.put_nowait({"type": "websocket.receive", "bytes": data})

    def text(self, body: dict) -> None:
        self.inbox.put_nowait({"type": "websocket.receive", "text": json.dumps(body)})

    def messages(self) -> list[dict]:
        return [json.loads(m["text"]) for m in self.sent if m["type"] == "websocket.send"]

    def close(self) -> dict | None:
        return next((m for m in self.sent if m["type"] == "websocket.close"), None)


def _open(hub: StreamHub, client: Client, query: bytes) -> asyncio.Task:
    scope = {"type": "websocket", "path": "/v1/streams/digits", "query_string": query}
    conn = StreamConnection(hub, "digits", scope, client.receive, client.send)
    return asyncio.ensure_future(conn.run())


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
