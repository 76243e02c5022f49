"""The expert Ray Serve app for live streams (issue 34): the image peer
(``rayserve_image.py``: the U-Net on JPEG frames, answered as JPEGs at each frame's size)
given WebSocket handling the way a strong Ray Serve user writes it.

A FastAPI ingress on Serve (``@serve.ingress``), behind Serve's HAProxy like Ferry, with
``/v1/streams/{model}``: the same route and messages as Ferry's, so ``loadtest/streams.py``
plays both unchanged.

* The client sends each frame as a binary message (JPEG), numbered 0, 1, 2, ... in the
  order sent. Each frame joins the replica's ``@serve.batch`` (64 frames, 4 ms) of
  ``ImageBatcher.answer``, so frames of every stream of a replica share the GPU batches.
* The answers go back in frame order, each as a JSON text message -- ``frame``, ``bytes``
  (the JPEG's length) and ``timings_ms`` (``queue``, ``batch``) -- followed by the JPEG as
  one binary message; a frame that is no JPEG gets ``{"frame": i, "error": ...}``.
* A stream has at most ``IN_FLIGHT`` frames in the batcher: past that the reader stops
  reading until the oldest is answered, so a stream that sends faster than it is served is
  slowed by TCP's own backpressure. No frame is dropped and nothing is refused: that is
  what a user gets without writing a drop policy or admission of their own (Ferry's route
  has both).
* Text messages: ``{"read": n}`` (Ferry's receipts) is ignored, ``{"end": true}`` ends the
  stream once its frames are answered (close 1000).

    import_path: benchmarks.peers.rayserve_streams:build_app
    args: {replicas: 8, model: /tmp/ferry-unet/unet256.pt2}     # device: cpu in tests

Nothing here imports torch until a replica starts, so the module loads on a CPU-only machine.
"""

# (no ``from __future__ import annotations``: FastAPI then reads ``ws: WebSocket`` as a
# string under Serve's ingress and refuses every WebSocket with a 403)
import asyncio
import json
import time
from typing import Any

from fastapi import FastAPI, WebSocket
from ray import serve
from starlette.websockets import WebSocketDisconnect

from benchmarks.peers.rayserve_image import BAD, ImageBatcher, batcher_args, deployment_options

IN_FLIGHT = 8
"""Frames of one stream in the batcher at once (about 0.25 s of a 30 fps stream)."""
STREAMS = 64
"""Streams a replica takes (its ``max_ongoing_requests``: a WebSocket holds one for life)."""

app = FastAPI()


def header(frame: int, data: bytes | None, times: tuple[float, float]) -> str:
    """The JSON text message of frame ``frame``'s answer (its bytes follow when not None)."""
    if data is None:
        return json.dumps({"frame": frame, **BAD})
    queue_s, batch_s = times
    timings = {"queue": round(queue_s * 1e3, 3), "batch": round(batch_s * 1e3, 3)}
    return json.dumps({"frame": frame, "bytes": len(data), "timings_ms": timings})


@serve.deployment
@serve.ingress(app)
class ExpertStreams(ImageBatcher):
    @app.get("/v2/health/ready")
    def ready(self) -> dict[str, bool]:
        return {"ready": True}  # (the replica's constructor has loaded and warmed the model)

    @app.websocket("/v1/streams/{model}")
    async def stream(self, ws: WebSocket, model: str) -> None:
        await ws.accept()
        pending: asyncio.Queue = asyncio.Queue(IN_FLIGHT)
        reader = asyncio.create_task(self._read(ws, pending))
        try:
            await self._write(ws, pending)
            await ws.close(1000)
        except (WebSocketDisconnect, RuntimeError):  # the client went away mid-stream: its
            pass  # frames still in a batch finish there, their answers unsent
        finally:
            reader.cancel()

    async def _read(self, ws: WebSocket, pending: asyncio.Queue) -> None:
        """Each frame into the batcher, in order, ``IN_FLIGHT`` at most; None at the end --
        also after a bad message, but not when cancelled (the writer is gone then, and a full
        queue would hold this task forever)."""
        frame = 0
        try:
            while True:
                msg = await ws.receive()
                if msg["type"] == "websocket.disconnect":
                    break
                data = msg.get("bytes")
                if data is not None:
                    answer = asyncio.ensure_future(self.answer((data, time.perf_counter())))
                    await pending.put((frame, answer))
                    frame += 1
                elif msg.get("text") and json.loads(msg["text"]).get("end"):
                    break
        except Exception:  # (a text message that is not JSON: the stream ends as at its end)
            pass
        await pending.put(None)

    async def _write(self, ws: WebSocket, pending: asyncio.Queue) -> None:
        """The answers in frame order, each as its header and then its JPEG."""
        while (item := await pending.get()) is not None:
            frame, answer = item
            data, times = await answer
            await ws.send_text(header(frame, data, times))
            if data is not None:
                await ws.send_bytes(data)


def build_app(args: dict[str, Any]) -> serve.Application:
    """``args``: as ``rayserve_image.build_app`` -- ``replicas`` (8), ``model``, ``threads``,
    ``device`` (``cuda``; ``cpu`` in tests)."""
    options = deployment_options(args, max_ongoing=STREAMS)
    return ExpertStreams.options(**options).bind(*batcher_args(args))
