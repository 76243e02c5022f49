"""The live streams' peer (``benchmarks/peers/rayserve_streams.py``, issue 34) through a real
Serve app on the CPU: its CPU form (the U-Net in fp32, JPEGs through simplejpeg) behind
Serve's proxy, real WebSockets, frames of two sizes from several streams at once.

It must speak Ferry's stream protocol -- what ``loadtest/streams.py`` plays against both --
so that the benchmark compares like with like: one JSON header per frame in frame order
(``frame``, ``bytes``, ``timings_ms``), the JPEG right after it at the frame's own size, an
error message for a frame that is no JPEG (the stream goes on), Ferry's receipts accepted,
and ``{"end": true}`` answered by a close once every frame is answered.
"""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
import simplejpeg
import websockets

from tests.integration.helpers import PORT

pytestmark = pytest.mark.integration
torch = pytest.importorskip("torch")
APP = "streams_peer"


@pytest.fixture(scope="module")
def peer(ray_cluster, tmp_path_factory):
    from ray import serve

    from benchmarks.image_workload import export_unet
    from benchmarks.peers.rayserve_streams import build_app

    model = export_unet(str(tmp_path_factory.mktemp("unet") / "unet.pt2"), width=4)
    serve.run(
        build_app({"replicas": 1, "model": model, "device": "cpu"}),
        name=APP,
        route_prefix="/peer",
    )
    yield f"ws://127.0.0.1:{PORT}/peer/v1/streams/unet"
    serve.delete(APP)


def frame(w: int, h: int, k: int) -> bytes:
    rng = np.random.default_rng(k)
    return simplejpeg.encode_jpeg(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), 85)


async def play(url: str, bodies: list[bytes]) -> tuple[list[dict], list[bytes], int | None]:
    """Send ``bodies`` (a receipt after the second), then the end; every header, every
    JPEG, and the close code."""
    headers, images = [], []
    async with websockets.connect(url, max_size=None, open_timeout=60) as ws:
        for i, b in enumerate(bodies):
            await ws.send(b)
            if i == 1:
                await ws.send(json.dumps({"read": 0}))  # Ferry's receipt: ignored
        await ws.send(json.dumps({"end": True}))
        async for msg in ws:
            if isinstance(msg, bytes):
                images.append(msg)
            else:
                headers.append(json.loads(msg))
        code = ws.close_code
    return headers, images, code


def test_streams_are_answered_in_frame_order_with_jpegs_of_each_frames_size(peer):
    sizes = [(64, 48), (96, 64)]
    streams = [[frame(*sizes[(s + i) % 2], 10 * s + i) for i in range(6)] for s in range(3)]
    streams[1][3] = b"not a jpeg"

    async def all_streams():
        return await asyncio.wait_for(asyncio.gather(*(play(peer, b) for b in streams)), 300)

    for s, (headers, images, code) in enumerate(asyncio.run(all_streams())):
        assert [h["frame"] for h in headers] == list(range(6)), headers  # in order, each once
        assert code == 1000
        good = [i for i in range(6) if not (s == 1 and i == 3)]
        assert "error" in headers[3] if s == 1 else all("error" not in h for h in headers)
        assert len(images) == len(good)
        for i, img in zip(good, images, strict=True):
            assert headers[i]["bytes"] == len(img)
            assert set(headers[i]["timings_ms"]) == {"queue", "batch"}
            w, h = sizes[(s + i) % 2]
            assert simplejpeg.decode_jpeg_header(img)[:2] == (h, w)  # (height, width)
