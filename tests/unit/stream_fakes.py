"""What the stream route's unit tests drive it with, without Ray: an ingress replica's surface
(its config, models, coalescers and the real ``TaskRoutes`` resolving each model's task from
its outputs), a downstream the test holds, and the ASGI side of one WebSocket."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
from types import SimpleNamespace
from typing import Any

import numpy as np
from PIL import Image

from deployments.streams_route import StreamConnection, StreamHub
from deployments.task_routes import TaskRoutes
from pipeline.coalescer import Coalescer
from pipeline.config import PipelineConfig
from pipeline.engines.base import TensorInfo
from pipeline.errors import ModelNotFound
from pipeline.models.repository import model_card
from pipeline.protocol.v2 import Signature
from pipeline.stages.messages import Answer, ImageRequest, Timings

SIZE = {"height": 64, "width": 64}
MODELS = [
    {"name": "digits", "arch": "digits"},
    {"name": "filter", "engine": "onnx", "source": "/m/filter.onnx",
     "input": {**SIZE, "resize": "stretch"}},
    {"name": "seg", "engine": "onnx", "source": "/m/seg.onnx", "input": SIZE},
    {"name": "yolo", "engine": "onnx", "source": "/m/yolo.onnx", "task": "detect", "input": SIZE},
    {"name": "raw", "engine": "onnx", "source": "/m/raw.onnx", "input": SIZE},
]  # fmt: skip
OUTPUTS = {  # each model's outputs (batch first, -1): what its task is resolved from
    "digits": [(10,)],
    "filter": [(3, 64, 64)],  # the input's size and channels: image
    "seg": [(5, 64, 64)],  # the input's size, 5 classes: segment
    "yolo": [(32, 7)],  # named detect: a YOLO head, 4 + 1 + 2 classes
    "raw": [(5, 7, 9)],  # tensors
}


def answer_of(item: ImageRequest, batch: int) -> Answer:
    """What the answering stage would give: top-k, or bytes naming the image's own size
    and media type (image, a segment's PNG), or a JSON result."""
    spec, t = item.spec, Timings()
    if spec.kind == "classify":
        return Answer(t, batch, top_k=[])
    o = spec.options
    h, w = o.source
    if spec.kind == "image" or (spec.kind == "segment" and o.format == "png"):
        media_type = o.media_type if spec.kind == "image" else "image/png"
        return Answer(t, batch, media=f"{h}x{w} {media_type}".encode(), media_type=media_type)
    return Answer(t, batch, result={"height": h, "width": w, "boxes": []})


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
        return [answer_of(it, len(items)) for it in items]


class Ingress(TaskRoutes):
    """What the route reads of an ingress replica."""

    def __init__(self, down: Downstream) -> None:
        self.cfg = PipelineConfig.model_validate({"models": MODELS})
        self.models = {m.name: m for m in self.cfg.models}
        self.cards = {name: model_card(m) for name, m in self.models.items()}
        self.targets = {name: card.target() for name, card in self.cards.items()}
        self.tasks: dict[str, Any] = {}
        self.readiness = SimpleNamespace(check=lambda m: None)
        self.drain = SimpleNamespace(
            draining=False, start=lambda: None, work=lambda rid: contextlib.nullcontext()
        )
        self.down = SimpleNamespace(status=self._status)
        self._coalescers = {
            (m, "classify"): Coalescer(down, 0.001, 16, max_in_flight=1) for m in self.models
        }

    async def _status(self) -> dict:
        return {"queue_depth": 0, "pool": {}}

    async def _signature(self, model: str) -> Signature:
        outs = [TensorInfo(f"o{i}", "float32", (-1, *s)) for i, s in enumerate(OUTPUTS[model])]
        return Signature((), tuple(outs))

    def _model(self, name: str) -> str:
        if name not in self.models:
            raise ModelNotFound("no such model", model=name)
        return name

    def _coalescer(self, model: str, kind: str) -> Coalescer:
        return self._coalescers[(model, kind)]


def png(height: int = 16, width: int = 16, channels: int = 1) -> bytes:
    shape = (height, width) if channels == 1 else (height, width, channels)
    buf = io.BytesIO()
    Image.fromarray(np.full(shape, 255, np.uint8)).save(buf, format="PNG")
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

    def wire(self) -> list[dict | bytes]:
        """Every message the route sent, in order: text ones parsed, binary ones as bytes."""
        return [
            json.loads(m["text"]) if m.get("text") is not None else m["bytes"]
            for m in self.sent
            if m["type"] == "websocket.send"
        ]

    def messages(self) -> list[dict]:
        return [m for m in self.wire() if isinstance(m, dict)]

    def close(self) -> dict | None:
        return next((m for m in self.sent if m["type"] == "websocket.close"), None)


def open_stream(
    hub: StreamHub, client: Client, query: bytes, model: str = "digits"
) -> asyncio.Task:
    scope = {"type": "websocket", "path": f"/v1/streams/{model}", "query_string": query}
    conn = StreamConnection(hub, model, scope, client.receive, client.send)
    return asyncio.ensure_future(conn.run())
